"""`pt2b opset coverage`: a corpus measured against a backend's op set agrees with what
load_for_backend does on each artifact, and the greedy list completes models soonest."""

import pytest
import torch

from exporter import export_model, load_for_backend
from exporter.errors import OpsetError
from exporter.explorer import coverage
from tools.corpus.zoo import make_case

SUPPORTED = ["aten.addmm", "aten.mm", "aten.relu", "aten.permute", "aten.view", "aten.add", "aten.mul"]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    folder = tmp_path_factory.mktemp("corpus")
    for name in ("mlp", "kwargs_only", "map", "pytree_io"):
        case = make_case(name)
        export_model(case.model, case.args, folder / f"{name}.pt2b", kwargs=case.kwargs,
                     dynamic_shapes=case.dynamic_shapes)
    return folder


def test_coverage_agrees_with_load_for_backend(corpus):
    rows = coverage.measure(coverage.artifacts([corpus]), supported_ops=SUPPORTED)
    assert len(rows) == 4 and {r.path.rsplit("/", 1)[1] for r in rows} == {
        "mlp.pt2b", "kwargs_only.pt2b", "map.pt2b", "pytree_io.pt2b"}
    for r in rows:
        if r.covered:
            lp = load_for_backend(r.path, supported_ops=SUPPORTED, cache=False)
            assert lp.ops() == r.ops
        else:
            with pytest.raises(OpsetError) as e:
                load_for_backend(r.path, supported_ops=SUPPORTED, cache=False)
            for op in r.missing:
                assert op in str(e.value)
    assert any(r.covered for r in rows) and not all(r.covered for r in rows)


def test_greedy_next_and_report(corpus, capsys):
    rows = [coverage.ModelCoverage("a", {}, {"x": 1}), coverage.ModelCoverage("b", {}, {"x": 1, "y": 2}),
            coverage.ModelCoverage("c", {}, {"z": 1}), coverage.ModelCoverage("d", {}, {}),
            coverage.ModelCoverage("e", {}, {"x": 1, "z": 1})]
    assert coverage.greedy_next([set(r.missing) for r in rows]) == [("x", 2), ("z", 4), ("y", 5)]
    from exporter import cli

    ops_file = corpus / "ops.txt"
    ops_file.write_text("\n".join(SUPPORTED) + "\n")
    assert cli.main(["opset", "coverage", "--corpus", str(corpus), "--supported", str(ops_file)]) == 0
    out = capsys.readouterr().out
    rows = coverage.measure(coverage.artifacts([corpus]), supported_ops=SUPPORTED)
    n = sum(r.covered for r in rows)
    assert f"supported ops of {ops_file}: {n} of 4 models fully covered" in out
    assert "implement next (models covered after each):" in out
