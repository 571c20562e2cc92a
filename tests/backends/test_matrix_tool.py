"""tools/backend_matrix.py's bookkeeping: which records a resumed sweep runs again (--redo)."""

from tools import backend_matrix as bm

BACKENDS = ["onnx", "openvino"]


def _rec(stages, owner):
    return {"name": "case", "stages": {k: ({"status": v} if isinstance(v, str) else v) for k, v in stages.items()},
            "owner": owner}


def test_redo_runs_again_pt2bs_failures_timeouts_and_cases_not_run():
    ok = {"build": "ok", "capture": "ok"}
    assert not bm.redo(_rec(ok, {"onnx": None, "openvino": "backend"}), BACKENDS)
    assert not bm.redo(_rec({"build": "ok", "capture": {"status": "fail", "error": "timeout: 300s"}},
                            {"onnx": "torch", "openvino": "torch"}), BACKENDS)  # torch cannot capture it
    assert bm.redo(_rec(ok, {"onnx": None, "openvino": "pt2b"}), BACKENDS)
    assert bm.redo(_rec(ok, {"onnx": None}), BACKENDS)  # openvino not reached: '?'
    timed_out = {**ok, "handoff:onnx": {"status": "fail", "error": "timeout: 300s"}}
    assert bm.owner(_rec(timed_out, {}), "onnx") == "backend"
    assert bm.redo(_rec(timed_out, {"openvino": None}), BACKENDS)


def test_a_case_pt2b_cannot_write_is_pt2bs_failure_on_every_backend():
    """A captured case that fails at pt2b's write (or read-back) never reaches a backend: it counts as
    captured and as pt2b's failure for each backend, with the write's reason (it was left out of both)."""
    import io

    wrote_not = _rec({"build": "ok", "capture": "ok", "eager": "ok",
                      "write": {"status": "fail", "error": "ExportError: pt2b would refuse ...",
                                "cause": "CorruptArtifactError: /tmp/x_1/.m_a.pt2b.9b97.tmp: guards_code: 555 guards"}}, {})
    ran = _rec({"build": "ok", "capture": "ok", "write": "ok", "lower:onnx": "ok", "lower:openvino": "ok"},
               {"onnx": None, "openvino": None})
    not_captured = _rec({"build": "ok", "capture": "fail"}, {"onnx": "torch", "openvino": "torch"})
    for b in BACKENDS:
        assert bm.owner(wrote_not, b) == "pt2b"
        assert bm.failure_key(wrote_not, b) == "write: CorruptArtifactError: FILE: guards_code: 555 guards"
    counts = bm.summarize([wrote_not, ran, not_captured], BACKENDS, file=io.StringIO())
    for b in BACKENDS:
        assert (counts[b]["captured"], counts[b]["ok"], counts[b]["pt2b_fails"]) == (2, 1, 1)
    assert bm.redo(wrote_not, BACKENDS)


def test_a_backends_reason_is_grouped_without_machine_paths_or_addresses():
    """The same failure on two machines or runs is one group, and the page names no path of the machine
    that ran the sweep (a backend's error quotes its stack trace and a function's repr)."""
    def failed(venv, address):
        return _rec({"build": "ok", "capture": "ok", "write": "ok",
                     "handoff:iree": {"status": "fail", "error": (
                         f"NotImplementedError: FIX ME: target=<function sym_not at 0x{address}>, "
                         f"'stack_trace': 'File \"{venv}/lib/python3.11/site-packages/transformers/x.py\"'")}},
                    {"iree": "backend"})

    keys = {bm.failure_key(failed(v, a), "iree") for v, a in (("/opt/sweeps/iree", "7f3cace8ae80"),
                                                                ("/srv/ci/.venv", "7ff45b632de0"))}
    assert keys == {"handoff:iree: NotImplementedError: FIX ME: target=<function sym_not>, 'stack_trace': "
                    "'File \"site-packages/transformers/x.py\"'"}


def test_a_case_run_with_fallback_counts_beside_those_run_whole():
    """The matrix's counts per backend: run whole, run split with the backend running most of the FLOPs, run
    split with the reference running most, failed."""
    import io

    ok = {"build": "ok", "capture": "ok", "write": "ok"}
    whole = _rec(ok, {"onnx": None})
    split = _rec({**ok, "handoff:onnx": "fail", "fallback:onnx": "ok"}, {"onnx": "backend"})
    split["fallback"] = {"onnx": {"nodes": 0.99, "flops": 1.0, "on_reference": {"aten::topk.default": 1}}}
    failed = _rec({**ok, "handoff:onnx": "fail", "fallback:onnx": "fail"}, {"onnx": "backend"})
    # run close to eager split, but with the backend running under half the FLOPs: the reference runs most
    mostly = _rec({**ok, "handoff:onnx": "fail", "fallback:onnx": "ok"}, {"onnx": "backend"})
    mostly["fallback"] = {"onnx": {"nodes": 0.9, "flops": 0.3, "on_reference": {"aten::bmm.default": 4}}}
    records = [whole, split, failed, mostly]
    for i, r in enumerate(records):
        r["name"] = f"case{i}"
    counts = bm.summarize(records, ["onnx"], file=io.StringIO())["onnx"]
    assert (counts["ok"], counts["with_fallback"], counts["mostly_reference"], counts["backend_fails"],
            counts["captured"]) == (1, 1, 1, 3, 4)
    page = bm.markdown({"records": records, "meta": {"backends": ["onnx"]}})
    assert "| onnx | 1 | 1 | 1 | 4 | 0 | 3 | 0 |" in page
    # each failure group says how many of its cases fallback runs (mostly on the backend, and in all)
    assert "| 3 | backend | 1 (2) | `handoff:onnx: ` (case1, case2, case3) |" in page, page
    # a sweep from before the matrix tried fallback says so, rather than counting none
    old = bm.markdown({"records": [whole, _rec({**ok, "handoff:onnx": "fail"}, {"onnx": "backend"})],
                       "meta": {"backends": ["onnx"]}})
    assert "| onnx | 1 | not tried | not tried | 2 | 0 | 1 | 0 |" in old


def test_a_resumed_sweep_runs_again_the_cases_named_and_with_redo_those_redo_picks():
    ok = {"build": "ok", "capture": "ok"}
    resume = {"a": _rec(ok, {"onnx": None, "openvino": None}), "b": _rec(ok, {"onnx": None, "openvino": "pt2b"}),
              "c": _rec(ok, {"onnx": "backend", "openvino": None})}
    assert bm.run_again(resume, BACKENDS, False, [""]) == set()
    assert bm.run_again(resume, BACKENDS, False, ["c", " a", "unknown"]) == {"a", "c"}
    assert bm.run_again(resume, BACKENDS, True, [""]) == {"b"}
    assert bm.run_again(resume, BACKENDS, True, ["c"]) == {"b", "c"}


def test_merged_record_files_keep_each_backends_fallback_share(tmp_path):
    import gzip
    import json

    ok = {"build": "ok", "capture": "ok"}
    first = {**_rec({**ok, "lower:onnx": "ok"}, {"onnx": "backend"}), "fallback": {"onnx": {"nodes": 0.9}}}
    second = {**_rec({**ok, "lower:tvm": "ok"}, {"tvm": "backend"}), "fallback": {"tvm": {"nodes": 0.5}}}
    paths = []
    for i, (rec, backend) in enumerate(((first, "onnx"), (second, "tvm"))):
        paths.append(str(tmp_path / f"{i}.json.gz"))
        with gzip.open(paths[-1], "wt") as f:
            json.dump({"meta": {"backends": [backend], "cases": 1}, "records": [rec]}, f)
    merged = bm.merged(paths)
    assert merged["records"][0]["fallback"] == {"onnx": {"nodes": 0.9}, "tvm": {"nodes": 0.5}}
    counts = bm.summarize(merged["records"], ["onnx", "tvm"], file=__import__("io").StringIO())
    assert counts["onnx"]["with_fallback"] == counts["tvm"]["with_fallback"] == 1


def test_the_page_names_the_hand_off_options_its_sweeps_passed():
    """A backend every user hands options to (LiteRT's static sizes) is swept with them, and the page says
    so; a page without that backend names none."""
    ok = {"build": "ok", "capture": "ok", "write": "ok"}
    assert bm.HANDOFF_OPTIONS["litert"] == {"specialize": True}
    page = bm.markdown({"records": [_rec(ok, {"litert": None})], "meta": {"backends": ["litert"]}})
    assert "used in every hand-off to it here: litert: `specialize=True`." in page
    assert "Hand-off options" not in bm.markdown({"records": [_rec(ok, {"onnx": None})], "meta": {"backends": ["onnx"]}})


def test_splits_run_after_every_backend_s_whole_hand_off(tmp_path, monkeypatch):
    """A split may run until the case's timeout: every backend's whole hand-off is recorded before the
    first split starts, so a split that never ends loses no other backend's result."""
    import copy

    import torch

    from exporter import backends as registry
    from exporter.errors import BackendHandOffError
    from tools.corpus import programs, transformers_zoo

    model = torch.nn.Linear(3, 2)
    case = transformers_zoo.RealCase(name="tiny", model_type="tiny", task="base", model=model,
                                     args=(torch.randn(2, 3),), kwargs={}, dynamic_shapes=None)
    monkeypatch.setattr(transformers_zoo, "make_case", lambda name: case)
    monkeypatch.setattr(programs, "capture_real", lambda c, _: torch.export.export(c.model, c.args))
    handed = []

    class Compiled:  # what the matrix reads of a backend's compiled program
        backend = type("Backend", (), {"runs_here": True})
        share = None

        def __init__(self, module):
            self.module = module

        def __call__(self, *args, **kwargs):
            return self.module(*args, **kwargs)

    def to_backend(name, program, fallback=None, **options):
        handed.append((name, fallback))
        if name == "onnx" and fallback is None:
            raise BackendHandOffError("onnx refuses it whole")
        return Compiled(program.module())

    monkeypatch.setattr(registry, "to_backend", to_backend)
    sent = []

    class Conn:
        def send(self, rec):
            sent.append(copy.deepcopy(rec))

    bm.run_case("tiny", ["onnx", "openvino"], Conn(), str(tmp_path))
    stages = list(sent[-1]["stages"])
    assert stages.index("match:openvino") < stages.index("fallback:onnx"), stages
    assert handed[-1] == ("onnx", "reference")
    assert sent[-1]["owner"] == {"onnx": "backend", "openvino": None}


def test_a_case_returning_random_draws_is_compared_where_it_can_be(tmp_path, monkeypatch):
    """vit_mae masks patches at random: eager and the backend draw other numbers, so the values computed
    from the draws are compared by shape and dtype, the others with eager as always; the page names
    such cases."""
    import copy

    import pytest
    import torch

    from tools.corpus import programs, transformers_zoo

    pytest.importorskip("onnxruntime")

    class Masked(torch.nn.Module):
        def forward(self, x):
            keep = torch.rand(x.shape[0], x.shape[1]).argsort(-1)[:, :2]  # (vit_mae's random_masking)
            return {"kept": torch.gather(x, 1, keep[..., None].expand(-1, -1, x.shape[-1])), "norm": x.norm(dim=-1)}

    def run(model):
        case = transformers_zoo.RealCase(name="masked", model_type="masked", task="base", model=model,
                                         args=(torch.randn(2, 5, 3),), kwargs={}, dynamic_shapes=None)
        monkeypatch.setattr(transformers_zoo, "make_case", lambda name: case)
        monkeypatch.setattr(programs, "capture_real", lambda c, _: torch.export.export(c.model, c.args))
        sent = []
        conn = type("Conn", (), {"send": lambda self, rec: sent.append(copy.deepcopy(rec))})()
        bm.run_case("masked", ["onnx"], conn, str(tmp_path))
        return sent[-1]

    rec = run(Masked())
    assert rec["owner"] == {"onnx": None} and rec["random_outputs"] == {"leaves": [0], "ops": ["aten::rand.default"]}
    page = bm.markdown({"records": [rec], "meta": {"backends": ["onnx"]}})
    assert "1 case(s) return values computed from random draws (masked): those values are compared" in page
    # the output no draw reaches is still compared with eager: a model whose eager run differs is caught
    monkeypatch.setattr(bm.rm, "run_eager", lambda model, fresh: {"kept": torch.zeros(2, 2, 3),
                                                                   "norm": torch.zeros(2, 5)})
    rec = run(Masked())
    assert rec["stages"]["match:onnx"]["status"] == "fail" and "leaf 1 (2, 5)" in rec["stages"]["match:onnx"]["error"]
