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
