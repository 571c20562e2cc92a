"""`--json` on the commands scripts call (inspect, verify, lower, run, cache, opset coverage and
closure): one JSON document on stdout whose values are what the Python API gives for the same file,
typed errors as {"error": {"type", "message"}} with the usual exit status, and nothing else on stdout."""

from __future__ import annotations

import json
import pathlib
import re
import subprocess
import sys

import pytest
import torch

from exporter import export_model, load, load_for_backend
from exporter.errors import ArtifactError, CorruptArtifactError, LoweringError
from tests.support.cli_run import run_cli

GOLDEN = pathlib.Path(__file__).parents[1] / "golden" / "1.4"
MLP, DYNAMIC, METHODS = GOLDEN / "mlp.pt2b", GOLDEN / "dynamic_shapes.pt2b", GOLDEN / "tiny_kv.methods.pt2b"
LOWERED = GOLDEN / "mlp.lowered-core.pt2b"
# what a terminal acts on (exporter/util/visible.py): none of it may reach stdout raw
ACTIVE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")
PAYLOAD = "\x1b]52;c;cHduZWQ=\x07\r\x1b[2K\u202e"




def run_json(*argv):
    """(exit status, the one JSON document stdout holds, stderr)."""
    code, out, err = run_cli(*argv, "--json")
    assert not ACTIVE.search(out), repr(out)
    return code, json.loads(out), err


def test_inspect_gives_what_load_gives():
    for path in (METHODS, DYNAMIC, LOWERED):
        code, doc, err = run_json("inspect", path)
        assert code == 0, err
        prog = load(path)
        assert doc["file"] == str(path) and doc["format_version"] == "%d.%d" % prog.format_version
        assert (doc["producer"], doc["torch_version"]) == (prog.producer, prog.torch_version)
        assert doc["metadata"] == prog.metadata and doc["provenance"] == prog.provenance
        assert list(doc["methods"]) == list(prog.methods) and doc["default_method"] == prog.method
        for name, m in prog.methods.items():
            got = doc["methods"][name]
            assert got["ops"] == m.ops() and got["ir_level"] == m.ir_level and got["lowering"] == m.lowering
            assert set(got["schemas"]) == set(m.ops())
            ep = m.exported_program()
            sig = ep.graph_signature
            assert [s["name"] for s in got["signature"]["inputs"]] == [s.arg.name for s in sig.input_specs]
            assert [s["name"] for s in got["signature"]["outputs"]] == [s.arg.name for s in sig.output_specs]
            ranges = {str(k): (int(v.lower), int(v.upper) if v.upper.is_finite else None)
                      for k, v in ep.range_constraints.items()}
            assert {s["name"]: (s["min"], s["max"]) for s in got["symbols"]} == ranges
            assert {s["name"]: s["dim_name"] for s in got["symbols"]} == {k: m.dim_names.get(k) for k in ranges}
            state = {**ep.state_dict, **ep.constants}
            tensors = {t["name"]: t for t in got["tensors"] if t["kind"] != "example input"}
            assert set(tensors) == set(state)
            for key, t in tensors.items():
                assert (t["dtype"], t["shape"]) == (str(state[key].dtype).removeprefix("torch."), list(state[key].shape))
        if len(prog.methods) > 1:  # the KV cache's buffers are every method's
            shared = [t for t in doc["methods"]["decode"]["tensors"] if t["shared_with"]]
            assert shared and all(t["shared_with"] == ["prefill"] for t in shared)
            assert doc["methods"]["decode"]["tensors_shared"] == len(shared)
    assert any(s["dim_name"] for s in run_json("inspect", DYNAMIC)[1]["methods"]["forward"]["symbols"])
    assert run_json("inspect", LOWERED)[1]["methods"]["forward"]["lowering"]["request"].startswith("core@")


def test_verify_lists_its_checks(tmp_path):
    from exporter.serialize.read.integrity import verify_checksums

    for flags in ((), ("--checksums",)):
        code, doc, err = run_json("verify", METHODS, *flags)
        assert code == 0, err
        assert doc["ok"] is True and doc["checksums_only"] is bool(flags) and doc["methods"] == len(load(METHODS).methods)
        assert doc["weight_bytes"] == verify_checksums(METHODS).nbytes == run_json("inspect", METHODS)[1]["weights"]["bytes"]
        assert all(c["ok"] for c in doc["checks"])
    assert [c.get("method") for c in doc["checks"]] == [None] * 4
    full = run_json("verify", METHODS)[1]["checks"]
    assert [(c["check"], c.get("method")) for c in full] == [("metadata", None), ("program", "prefill"),
                                                             ("program", "decode"), ("weights", None)]


def test_lower_gives_what_load_for_backend_gives(tmp_path):
    ops_file = tmp_path / "ops.txt"
    ops_file.write_text("aten::addmm.default\naten::relu\n")
    code, doc, err = run_json("lower", MLP, "--no-cache")
    assert code == 0, err
    low = load_for_backend(MLP, "core", cache=False)
    got = doc["methods"]["forward"]
    assert got["ops"] == low.ops() and got["call_sites"] == sum(low.ops().values()) and got["lowered_for"] == low.lowered_for
    assert got["validation"]["status"] == low.validation.status == "passed"
    assert got["validation"]["max_rel"] == low.validation.max_rel and got["outside_opset"] == {} and doc["wrote"] is None
    # what falls outside a supported-ops list, left for the reference
    code, doc, err = run_json("lower", MLP, "--no-cache", "--no-validate", "--supported", ops_file, "--fallback", "reference",
                              "-o", tmp_path / "low.pt2b")
    assert code == 0, err
    low = load_for_backend(MLP, supported_ops=["aten::addmm.default", "aten::relu"], fallback="reference", cache=False,
                           validate=False)
    got = doc["methods"]["forward"]
    assert got["outside_opset"] == low.outside_opset and low.outside_opset and got["ops"] == low.ops()
    assert set(got["outside_opset_why"]) == set(low.outside_opset) and got["validation"] is None
    assert doc["wrote"] == str(tmp_path / "low.pt2b") and load(tmp_path / "low.pt2b").ops() == low.ops()
    # every method of a multi-method artifact
    code, doc, err = run_json("lower", METHODS, "--no-cache", "--no-validate")
    lowered = load_for_backend(METHODS, cache=False, validate=False)
    assert {n: m["ops"] for n, m in doc["methods"].items()} == {n: m.ops() for n, m in lowered.methods.items()}


def test_run_gives_the_outputs_eager_gives():
    code, doc, err = run_json("run", DYNAMIC, "--no-cache", "--repeat", "1")
    assert code == 0, err
    prog = load(DYNAMIC)
    args, kwargs = prog.exported_program().example_inputs
    eager = torch.utils._pytree.tree_leaves(prog(*args, **kwargs))
    assert len(doc["outputs"]) == len(eager)
    for got, want in zip(doc["outputs"], eager):
        assert (got["dtype"], got["shape"]) == (str(want.dtype).removeprefix("torch."), list(want.shape))
        assert got["min"] == pytest.approx(want.min().item(), rel=1e-5, abs=1e-6)
        assert got["max"] == pytest.approx(want.max().item(), rel=1e-5, abs=1e-6)
        assert got["mean"] == pytest.approx(want.double().mean().item(), rel=1e-5, abs=1e-6)
        assert got["non_finite"] == 0
    assert doc["runs_on"] == "runtime_ref (cpu)" and doc["lowered_for"].startswith("core@")
    assert doc["seconds"]["runs_timed"] == 1 and doc["validation"]["status"] == "passed"
    assert doc["hand_off_validation"] is None and doc["share"] is None


def test_cache_lists_its_entries_and_clears(cache_dir):
    from exporter.lowering import cache

    code, doc, err = run_json("cache")
    assert code == 0, err
    assert doc["location"] == str(cache_dir) and doc["entries"] == [] and doc["state"] == "on"
    load_for_backend(MLP, validate=False)
    doc = run_json("cache")[1]
    found = cache.contents(cache_dir)
    assert [e["name"] for e in doc["entries"]] == [p.name for p in found.entries] and len(found.entries) == 1
    assert doc["bytes"] == found.size == sum(e["bytes"] for e in doc["entries"])
    doc = run_json("cache", "--clear")[1]
    assert (doc["removed_entries"], doc["kept"]) == (1, []) and cache.contents(cache_dir).entries == []


def test_coverage_gives_what_lowering_gives(tmp_path):
    code, doc, err = run_json("opset", "coverage", "--corpus", MLP, DYNAMIC)
    assert code == 0, err
    lowered = {str(p): load_for_backend(p, cache=False, validate=False).ops() for p in (MLP, DYNAMIC)}
    assert {r["path"]: r["ops"] for r in doc["per_model"]} == lowered
    assert (doc["models"], doc["covered"]) == (2, 2) and doc["implement_next"] == []
    using = {}
    for ops in lowered.values():
        for op in ops:
            using[op] = using.get(op, 0) + 1
    assert doc["ops"] == using


def test_closure_gives_the_lowered_op_set():
    code, doc, err = run_json("opset", "closure", "--corpus", MLP, "--preset", "core")
    assert code == 0, err
    want = set(load_for_backend(MLP, cache=False, validate=False).ops())
    assert doc["ops"] == dict.fromkeys(sorted(want), 1) and (doc["models"], doc["covered"]) == (1, 1)
    assert doc["unreachable"] == {} and doc["implement_next"] == [] and doc["decompositions"] > 0
    assert doc["selection"] == {"preset": "core", "supported": [], "keep": [], "decompose": []}


def test_errors_are_typed_documents(tmp_path):
    broken = tmp_path / "broken.pt2b"
    broken.write_bytes(MLP.read_bytes()[:3000])
    for argv in (("inspect", tmp_path / "missing.pt2b"), ("verify", broken), ("lower", broken), ("run", broken),
                 ("lower", MLP, "--preset", "cor")):
        code, doc, err = run_json(*argv)
        prose = run_cli(*argv)
        assert code == prose[0] == 2 and prose[1] == ""
        kind = {"missing.pt2b": ArtifactError, "broken.pt2b": CorruptArtifactError}.get(pathlib.Path(str(argv[1])).name)
        with pytest.raises(kind or LoweringError) as info:
            load(argv[1]).check() if kind else load_for_backend(MLP, "cor")
        assert doc == {"error": {"type": type(info.value).__name__, "message": str(info.value)}}
        assert f"({type(info.value).__name__}): {info.value}" in err


def test_a_files_strings_are_data(tmp_path):
    torch.manual_seed(0)
    path = tmp_path / "m.pt2b"
    export_model(torch.nn.Linear(3, 2), (torch.randn(4, 3),), path, metadata={"note": PAYLOAD, PAYLOAD: 1})
    code, doc, err = run_json("inspect", path)
    assert code == 0 and doc["metadata"] == {"note": PAYLOAD, PAYLOAD: 1} == load(path).metadata


def test_stdout_holds_the_document_alone(tmp_path):
    """What the command or a library prints while it works, Python's print or a write to the file
    descriptor, goes to stderr."""
    (tmp_path / "noisy.py").write_text("import os, sys\nprint('printed')\nsys.stdout.flush()\n"
                                       "os.write(1, b'written to fd 1\\n')\n")
    res = subprocess.run([sys.executable, "-m", "exporter", "--import", "noisy", "verify", "--checksums", "--json",
                          str(MLP)], capture_output=True, cwd=tmp_path, timeout=120)
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["ok"] is True
    assert b"printed" in res.stderr and b"written to fd 1" in res.stderr
