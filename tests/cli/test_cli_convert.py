"""The `pt2b` command line (export, inspect, convert, verify) and conversion to and from
torch.export.save archives, compared with torch's own save/load."""

import io
import re
import subprocess
import sys
import zipfile

import pytest
import torch

from exporter import export_model, load
from exporter.errors import NotAnArtifactError
from exporter.versioning.formats import FORMAT_VERSION, version_str
from tests.support.helpers import assert_bitwise, assert_programs_equal
from tests.support.cli_run import run_cli


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 3)
        self.bn = torch.nn.BatchNorm2d(4)
        self.register_buffer("steps", torch.zeros((), dtype=torch.int64))

    def forward(self, x):
        self.steps.add_(1)
        return torch.relu(self.bn(self.conv(x))).mean((2, 3))


def make_model():
    torch.manual_seed(0)
    return Net().eval(), (torch.randn(2, 3, 8, 8),), None, {"x": {0: torch.export.Dim("batch", max=16)}}




def test_export_and_inspect(tmp_path):
    path = tmp_path / "net.pt2b"
    code, out, _ = run_cli("export", "tests.cli.test_cli_convert:make_model", str(path))
    assert code == 0 and path.exists()
    code, out, _ = run_cli("inspect", str(path))
    assert code == 0
    assert f"format version:  {version_str(FORMAT_VERSION)}" in out
    assert f"torch version:   {torch.__version__}" in out
    assert "IR level:        training" in out
    assert "aten::add_.Tensor" in out  # in-place op kept
    assert "aten::conv2d(Tensor input, Tensor weight, Tensor? bias=None" in out  # full schema
    assert "parameter  conv.weight: float32[4, 3, 3, 3]" in out
    assert "buffer     steps: int64[]" in out
    assert re.search(r"s\d+ \(batch\): \[0, 16\]", out)  # symbol range of the batch dim, with its Dim name
    code, out, _ = run_cli("verify", str(path))
    assert code == 0 and "OK" in out


def test_cli_reports_typed_errors(tmp_path):
    bad = tmp_path / "bad.pt2b"
    bad.write_bytes(b"garbage!" * 10)
    code, _, err = run_cli("inspect", str(bad))
    assert code == 2 and "NotAnArtifactError" in err and "not a .pt2b artifact" in err
    code, _, err = run_cli("export", "no_such_module_xyz:f", str(tmp_path / "o.pt2b"))
    assert code == 2 and "cannot import 'no_such_module_xyz'" in err


def test_console_script_runs(tmp_path):
    path = tmp_path / "net.pt2b"
    model, args, _, dyn = make_model()
    export_model(model, args, path, dynamic_shapes=dyn)
    res = subprocess.run([sys.executable, "-m", "exporter.cli", "inspect", str(path)],
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    assert "operators (" in res.stdout


def test_convert_pt2_to_pt2b_equals_torch_load(tmp_path):
    model, args, _, dyn = make_model()
    ep = torch.export.export(model, args, dynamic_shapes=dyn)
    pt2 = tmp_path / "net.pt2"
    torch.export.save(ep, pt2)
    code, out, _ = run_cli("convert", str(pt2), str(tmp_path / "net.pt2b"))
    assert code == 0 and "pt2->pt2b" in out
    ours = load(tmp_path / "net.pt2b").exported_program()
    theirs = torch.export.load(pt2)
    assert_programs_equal(theirs, ours)
    x = torch.randn(5, 3, 8, 8)
    assert_bitwise(ours.module()(x), theirs.module()(x))


def test_convert_reads_torchs_own_pt2_without_the_trust_flag(tmp_path):
    """torch.export.save stores weights raw and example inputs for torch's weights-only unpickler: the
    default (no unpickling of anything else) converts it, to the program --trust-pickle converts it to."""
    from exporter.cli.convert import convert

    model, args, _, dyn = make_model()
    pt2 = tmp_path / "net.pt2"
    torch.export.save(torch.export.export(model, args, dynamic_shapes=dyn), pt2)
    assert convert(pt2, tmp_path / "a.pt2b") == "pt2->pt2b"
    assert convert(pt2, tmp_path / "b.pt2b", trust_pickle=True) == "pt2->pt2b"
    assert_programs_equal(load(tmp_path / "b.pt2b").exported_program(), load(tmp_path / "a.pt2b").exported_program())


def test_convert_refuses_a_pickled_state_dict_unless_trusted(tmp_path):
    """torch's legacy layout pickles the whole state dict (data/weights/<model>.pt): refused by default,
    naming the entry and what its pickle imports; converted as before with --trust-pickle."""
    from exporter.cli.convert import convert
    from exporter.errors import PickledContentError
    from tests.cli.test_cli_hostile import _rewrite_pt2

    model, args, _, dyn = make_model()
    ep = torch.export.export(model, args, dynamic_shapes=dyn)
    torch.export.save(ep, tmp_path / "net.pt2")
    state = io.BytesIO()
    torch.save(dict(ep.state_dict), state)
    with zipfile.ZipFile(tmp_path / "net.pt2") as z:
        weights = [n.split("/", 1)[1] for n in z.namelist() if n.split("/", 1)[1].startswith("data/weights/")]
    legacy = _rewrite_pt2(tmp_path / "net.pt2", tmp_path / "legacy.pt2",
                          {**dict.fromkeys(weights), "data/weights/model.pt": state.getvalue()})
    with pytest.raises(PickledContentError, match=r"data/weights/model\.pt \(the weights of model 'model' \(legacy "
                                                  r"layout\); imports .*torch\._utils\._rebuild_tensor_v2"):
        convert(legacy, tmp_path / "legacy.pt2b")
    assert not (tmp_path / "legacy.pt2b").exists()
    code, out, err = run_cli("convert", "--trust-pickle", str(legacy), str(tmp_path / "legacy.pt2b"))
    assert code == 0 and "pt2->pt2b" in out and "--trust-pickle: unpickling" in err
    x = torch.randn(3, 3, 8, 8)
    assert_bitwise(load(tmp_path / "legacy.pt2b")(x), ep.module()(x))


def test_convert_pt2b_to_pt2_equals_torch_save(tmp_path):
    model, args, _, dyn = make_model()
    path = tmp_path / "net.pt2b"
    ep = export_model(model, args, path, dynamic_shapes=dyn)
    code, out, _ = run_cli("convert", str(path), str(tmp_path / "back.pt2"))
    assert code == 0 and "pt2b->pt2" in out
    via_pt2b = torch.export.load(tmp_path / "back.pt2")
    direct = io.BytesIO()
    torch.export.save(ep, direct)
    direct.seek(0)
    reference = torch.export.load(direct)
    assert_programs_equal(reference, via_pt2b)
    x = torch.randn(3, 3, 8, 8)
    assert_bitwise(via_pt2b.module()(x), reference.module()(x))


def test_convert_rejects_other_files(tmp_path):
    p = tmp_path / "x.bin"
    p.write_bytes(b"\x00" * 64)
    with pytest.raises(NotAnArtifactError, match="neither a .pt2b artifact nor"):
        from exporter.cli.convert import convert
        convert(p, tmp_path / "y.pt2b")


def test_run_takes_extra_ops_for_a_custom_op(tmp_path):
    """Issue 39: `pt2b run` refused a custom op with no way to name it (Python had Runtime(extra_ops=))."""
    from exporter import export_model
    from tools.corpus.zoo import CUSTOM_OP_NAME, make_case

    case = make_case("custom_op")
    path = tmp_path / "custom.pt2b"
    export_model(case.model, case.args, path)
    code, out, err = run_cli("run", str(path), "--preset", "core", "--no-cache")
    assert code != 0 and CUSTOM_OP_NAME in err and "(pt2b run: --extra-ops)" in err
    code, out, err = run_cli("run", str(path), "--preset", "core", "--no-cache", "--extra-ops", CUSTOM_OP_NAME)
    assert code == 0 and out.startswith("output 0: float32"), err


def test_run_prints_values_timings_and_the_validation_verdict(tmp_path):
    """Issue 39: `pt2b run` printed output shapes only."""
    model, args, _, dynamic = make_model()
    path = tmp_path / "net.pt2b"
    export_model(model, args, path, dynamic_shapes=dynamic)
    code, out, err = run_cli("run", str(path), "--preset", "core", "--no-cache", "--repeat", "2")
    assert code == 0, err
    want = load(path)(*args)
    first = out.splitlines()[0]
    assert first.startswith("output 0: float32[2, 4]  min ") and f"max {want.max().item():.4g}" in first
    assert re.search(r"lowered in [\d.]+ s \(core@[\d.]+\); runtime_ref \(cpu\): prepared in [\d.]+ s, first run "
                     r"[\d.]+ ms, median of 2 more [\d.]+ ms", out)
    assert re.search(r"validation passed on \d input set\(s\)( \(the derived one op by op\)| \(no derived input needed: "
                     r"[^)]*\))? against the unlowered "
                     r"program: (exact|ulp \(float "
                     r"rounding\)), largest relative difference", out)


def test_run_on_a_backend(tmp_path):
    """`pt2b run --backend onnx`: lowered with the backend's preset, run on its hand-off."""
    pytest.importorskip("onnxruntime")
    from exporter import backends

    model, args, _, dynamic = make_model()
    path = tmp_path / "net.pt2b"
    export_model(model, args, path, dynamic_shapes=dynamic)
    code, out, err = run_cli("run", str(path), "--backend", "onnx", "--no-cache", "--repeat", "0")
    assert code == 0, err  # the program counts its steps: the count held by ONNX Runtime between calls
    assert "state held by onnx's runtime from call to call: steps" in out
    code, out, err = run_cli("run", str(path), "--backend", "onnx", "--no-cache", "--repeat", "0", "--frozen-state")
    assert code == 0, err
    key = backends.get("onnx").key
    assert f"lowered in" in out and f"({key}); {key}: prepared in" in out and "median" not in out
    assert "hand-off validation passed: 1 output(s) on the stored example inputs" in out  # the backend's own outputs
    code, out, err = run_cli("run", str(path), "--backend", "nonesuch")
    assert code != 0 and "unknown backend 'nonesuch'" in err
