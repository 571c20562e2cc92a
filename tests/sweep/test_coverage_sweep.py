"""`pt2b opset coverage` on the sweep runner: each model lowered in its own process, the same rows
with one worker or two, and a run with --records resumes from them."""

from __future__ import annotations

import json

from exporter import export_model, sweep
from exporter.cli import main
from exporter.explorer import coverage
from tools.corpus.zoo import make_case

SUPPORTED = ["aten.addmm", "aten.mm", "aten.relu", "aten.permute", "aten.view", "aten.add", "aten.mul"]


def test_coverage_runs_each_model_in_its_own_process_and_resumes(tmp_path, capsys):
    for name in ("mlp", "kwargs_only"):
        case = make_case(name)
        export_model(case.model, case.args, tmp_path / f"{name}.pt2b", kwargs=case.kwargs)
    (tmp_path / "broken.pt2b").write_bytes(b"not an artifact")
    paths = coverage.artifacts([tmp_path])
    one = coverage.measure(paths, supported_ops=SUPPORTED, workers=1)
    two = coverage.measure(paths, supported_ops=SUPPORTED, workers=2)
    assert one == two and [r.covered for r in one] == [False, True, False]  # broken, kwargs_only, mlp
    assert one[0].error.startswith("NotAnArtifactError")  # broken.pt2b, its own row; the others lowered
    assert not one[1].error and one[1].ops and one[2].ops
    records = tmp_path / "cov.jsonl"
    args = ["opset", "coverage", "--corpus", str(tmp_path), "--workers", "2", "--records", str(records), "--json"]
    assert main(args) == 0
    first = json.loads(capsys.readouterr().out)
    assert len(records.read_text().splitlines()) == 3
    assert main(args) == 0  # again: every model read from the records, none lowered
    assert json.loads(capsys.readouterr().out) == first
    assert len(records.read_text().splitlines()) == 3
    assert {r["executor"] for r in sweep.read(str(records)).values()} == {"local"}
