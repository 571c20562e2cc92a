"""Issue 39: tensor-subclass weights (torchao's quantized weights, TwoTensor) are unwrapped into their
plain inner tensors when export_model captures the module; an ExportedProgram that already holds them,
of a class not registered with exporter.register_tensor_subclass, is refused before anything is written,
with an UnsupportedValueError that names the value and what to do, never a raw error from deep in the
writer (registered classes: test_tensor_subclasses.py)."""

from __future__ import annotations

import pytest
import torch
from torch.testing._internal.two_tensor import TwoTensor

import exporter
import runtime_ref
from exporter import export_model
from exporter.errors import ExportError, UnsupportedValueError


def _subclass_weight_model():
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU(), torch.nn.Linear(3, 2))
    for lin in (m[0], m[2]):
        w = lin.weight.detach()
        lin.weight = torch.nn.Parameter(TwoTensor(w.clone(), w.clone() * 0.5), requires_grad=False)
    return m


def test_an_exported_program_with_a_subclass_weight_is_refused_by_name_with_the_remedy(tmp_path):
    """torchao's quantized weights are tensor subclasses: the writer crashed with "Attempted to access the
    data pointer on an invalid python storage" (a RuntimeError from the weights plan)."""
    m, x = _subclass_weight_model(), torch.randn(2, 4)
    ep = torch.export.export(m, (x,))
    assert isinstance(ep.state_dict["0.weight"], TwoTensor)  # torch.export takes it
    path = tmp_path / "m.pt2b"
    with pytest.raises(UnsupportedValueError, match=r"'0\.weight' is a tensor subclass, torch\.testing\._internal\."
                                                    r"two_tensor\.TwoTensor \(it wraps the tensors a, b\), and no name "
                                                    r"is registered for it: call exporter\.register_tensor_subclass"
                                                    r"\(TwoTensor\).* give export_model the module itself"):
        export_model(ep, path)
    assert not path.exists() and not list(tmp_path.iterdir())
    assert issubclass(UnsupportedValueError, ExportError)


def test_a_program_exported_under_fake_tensors_is_refused_as_such(tmp_path):
    """A program exported under FakeTensorMode has weights with no values: refused naming that, not as
    a tensor subclass (which a FakeTensor is to Python)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode(allow_non_fake_inputs=True):
        ep = torch.export.export(torch.nn.Linear(4, 3), (torch.randn(2, 4),))
    path = tmp_path / "m.pt2b"
    with pytest.raises(UnsupportedValueError, match=r"'weight' is a fake tensor: the program was exported under a "
                                                    r"FakeTensorMode, and its weights have shapes and dtypes but no "
                                                    r"values.* Export the module with its real weights"):
        export_model(ep, path)
    assert not list(tmp_path.iterdir())


def test_a_subclass_torch_cannot_trace_the_construction_of_is_refused_by_node(tmp_path):
    """TwoTensor's constructor is a Python call torch.export records as flat_apply (a callable by object):
    after unwrapping, the writer refuses it by name instead of torch's serializer failing deep inside."""
    m, x = _subclass_weight_model(), torch.randn(2, 4)
    path = tmp_path / "m.pt2b"
    with pytest.raises(UnsupportedValueError, match=r"node 'flat_apply\w*' calls a Python function through "
                                                    r"torch\.ops\.higher_order\.flat_apply \(here: twotensor"):
        export_model(m, (x,), path)
    assert isinstance(m[0].weight, TwoTensor) and not hasattr(m[0], "parametrizations")  # the user's module is as it was
    assert not path.exists() and not list(tmp_path.iterdir())


def test_torchao_int8_weight_only_is_written_as_int8_and_runs_as_eager(tmp_path):
    torchao = pytest.importorskip("torchao")
    from torchao.quantization import Int8WeightOnlyConfig, quantize_

    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.GELU(), torch.nn.Linear(512, 256)).eval()
    x = torch.randn(3, 256)
    export_model(m, (x,), tmp_path / "fp32.pt2b")
    quantize_(m, Int8WeightOnlyConfig())
    with torch.no_grad():
        want = m(x)
    export_model(m, (x,), tmp_path / "int8.pt2b")
    assert type(m[0].weight).__name__ == "Int8Tensor"  # the user's module is as it was
    prog = exporter.load(tmp_path / "int8.pt2b")
    assert prog.provenance["subclass_weights_unwrapped"] == "2 x torchao.quantization.Int8Tensor"
    torch.testing.assert_close(prog(x), want, rtol=0, atol=0)
    sd = prog.exported_program().state_dict
    assert sorted({t.dtype for t in sd.values()}, key=str) == [torch.float32, torch.int8]
    assert (tmp_path / "int8.pt2b").stat().st_size < 0.3 * (tmp_path / "fp32.pt2b").stat().st_size
    lowered = exporter.load_for_backend(tmp_path / "int8.pt2b", "core", cache=False)
    assert lowered.validation.status == "passed", lowered.validation.describe()
    torch.testing.assert_close(runtime_ref.Runtime(lowered)(x), want, rtol=1e-5, atol=1e-5)
    assert torchao.__version__


def test_torchao_float8_weight_only_is_written_as_float8_and_runs_as_eager(tmp_path):
    pytest.importorskip("torchao")
    from torchao.quantization import Float8WeightOnlyConfig, quantize_

    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.GELU(), torch.nn.Linear(128, 64)).eval()
    x = torch.randn(3, 64)
    quantize_(m, Float8WeightOnlyConfig())
    with torch.no_grad():
        want = m(x)
    export_model(m, (x,), tmp_path / "f8.pt2b")
    prog = exporter.load(tmp_path / "f8.pt2b")
    assert torch.float8_e4m3fn in {t.dtype for t in prog.exported_program().state_dict.values()}
    torch.testing.assert_close(prog(x), want, rtol=0, atol=0)
    lowered = exporter.load_for_backend(tmp_path / "f8.pt2b", "core", cache=False)
    assert lowered.validation.status == "passed", lowered.validation.describe()
    torch.testing.assert_close(runtime_ref.Runtime(lowered)(x), want, rtol=1e-6, atol=1e-6)
