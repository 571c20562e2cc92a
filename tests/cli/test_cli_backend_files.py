"""`pt2b lower ART --to NAME -o FILE` writes the backend's own file, which that backend's own runtime
loads and runs in a fresh process with no pt2b imported, computing what the model does."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
import torch

from exporter import export_model
from tests.cli.test_cli_convert import run_cli

# a fresh interpreter: the backend's runtime alone reads the file and runs it on x.npy
RUNNERS = {
    "onnx": ("import numpy as np, onnxruntime as ort, sys\n"
             "s = ort.InferenceSession(sys.argv[1], providers=['CPUExecutionProvider'])\n"
             "out = s.run(None, {s.get_inputs()[0].name: np.load(sys.argv[2])})[0]\n"),
    "openvino": ("import numpy as np, openvino, sys\n"
                 "m = openvino.Core().compile_model(openvino.Core().read_model(sys.argv[1]), 'CPU',\n"
                 "                                  {'INFERENCE_PRECISION_HINT': 'f32'})\n"
                 "out = m(np.load(sys.argv[2]))[0]\n"),
}
TAIL = ("np.save(sys.argv[3], out)\n"
        "print('pt2b imported:', any(m == 'exporter' or m.startswith(('exporter.', 'runtime_ref')) for m in sys.modules))\n")


@pytest.mark.parametrize("backend, suffix", [("onnx", ".onnx"), ("openvino", ".xml")])
def test_the_backends_own_file_runs_in_its_own_runtime(tmp_path, backend, suffix):
    pytest.importorskip("onnxruntime" if backend == "onnx" else "openvino")
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 4)).eval()
    x = torch.randn(3, 8)
    export_model(model, (x,), tmp_path / "m.pt2b", dynamic_shapes=({0: torch.export.Dim("batch", max=64)},))
    out_file = tmp_path / f"m{suffix}"
    code, out, err = run_cli("lower", str(tmp_path / "m.pt2b"), "--to", backend, "-o", str(out_file), "--no-cache")
    assert code == 0, err
    assert "hand-off validation passed" in out and f"wrote {out_file}" in out and out_file.exists()
    np.save(tmp_path / "x.npy", x.numpy())
    ran = subprocess.run([sys.executable, "-c", RUNNERS[backend] + TAIL, str(out_file), str(tmp_path / "x.npy"),
                          str(tmp_path / "y.npy")], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert ran.returncode == 0, ran.stderr
    assert "pt2b imported: False" in ran.stdout
    with torch.no_grad():
        torch.testing.assert_close(torch.from_numpy(np.load(tmp_path / "y.npy")), model(x), rtol=1e-3, atol=1e-3)
    if backend == "onnx":  # the dims named as the user named them at export, not torch's symbols
        import onnx

        graph = onnx.load(out_file).graph
        assert [[d.dim_param or d.dim_value for d in v.type.tensor_type.shape.dim]
                for v in (*graph.input, *graph.output)] == [["batch", 8], ["batch", 4]]
        assert [v.name for v in graph.output] == ["output"]  # (a dict output: its keys)


def test_to_needs_a_destination(tmp_path):
    pytest.importorskip("onnxruntime")
    export_model(torch.nn.Linear(4, 2), (torch.randn(2, 4),), tmp_path / "m.pt2b")
    code, _, err = run_cli("lower", str(tmp_path / "m.pt2b"), "--to", "onnx", "--no-cache")
    assert code != 0 and "--to onnx writes the backend's own file: give its path with -o (e.g. -o model.onnx)" in err


class _DictOut(torch.nn.Module):
    def forward(self, x):
        return {"logits": x * 2, "hidden": (x + 1, x.sum(0))}


def test_the_onnx_file_names_its_outputs_by_the_programs_structure(tmp_path):
    """Outputs named by where they sit in what the model returns, not by the node that made them; the
    compiled program keeps running after the file is written."""
    pytest.importorskip("onnxruntime")
    import onnx

    from exporter import backends, load_for_backend

    export_model(_DictOut(), (torch.randn(3, 4),), tmp_path / "m.pt2b")
    compiled = backends.to_backend(load_for_backend(tmp_path / "m.pt2b", backend="onnx", cache=False))
    compiled.save(tmp_path / "m.onnx")
    assert [v.name for v in onnx.load(tmp_path / "m.onnx").graph.output] == ["logits", "hidden.0", "hidden.1"]
    x = torch.randn(3, 4)
    got, want = compiled(x), _DictOut()(x)
    torch.testing.assert_close(got["hidden"][1], want["hidden"][1])
    torch.testing.assert_close(got["logits"], want["logits"])


def test_options_reach_the_backends_hand_off(tmp_path):
    """`--option KEY=VALUE` is a keyword argument of the hand-off, its value a Python literal (ONNX's
    opset_version=18 is the opset the file declares); an option the hand-off does not take is a typed
    error naming the ones it takes, before any backend work."""
    pytest.importorskip("onnxruntime")
    import onnx

    export_model(torch.nn.Linear(4, 2), (torch.randn(2, 4),), tmp_path / "m.pt2b")
    out_file = tmp_path / "m.onnx"
    code, _, err = run_cli("lower", str(tmp_path / "m.pt2b"), "--to", "onnx", "--option", "opset_version=18",
                           "-o", str(out_file), "--no-cache")
    assert code == 0, err
    assert [o.version for o in onnx.load(out_file).opset_import if o.domain in ("", "ai.onnx")] == [18]
    code, _, err = run_cli("run", str(tmp_path / "m.pt2b"), "--backend", "onnx", "--option", "speed=9", "--no-cache")
    assert code != 0 and "'speed'" in err and "it takes opset_version, optimize" in err
    code, _, err = run_cli("lower", str(tmp_path / "m.pt2b"), "--to", "onnx", "--option", "18", "-o", str(out_file))
    assert code != 0 and "--option '18' is not KEY=VALUE" in err
