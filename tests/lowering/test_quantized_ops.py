"""Issue 37, case 3: PT2E quantization's ops (quantized_decomposed::*) run on runtime_ref by default,
stay under core as torch keeps them, and are decomposed to aten ops by max and by a float-only
supported_ops list (exporter/lowering/tables.py: quantized_decompositions), all without validation."""

from __future__ import annotations

import pytest
import torch
import torch.ao.quantization.fx._decomposed  # noqa: F401 -- registers quantized_decomposed::*

from exporter import export_model, load_for_backend
from exporter.errors import OpsetError
from exporter.lowering import presets
from tests.support.helpers import assert_bitwise
from runtime_ref import Runtime

qd = torch.ops.quantized_decomposed
STATIC = {"quantized_decomposed::quantize_per_tensor.default", "quantized_decomposed::dequantize_per_tensor.default",
          "quantized_decomposed::quantize_per_channel.default", "quantized_decomposed::dequantize_per_channel.default"}


class Int8Linear(torch.nn.Module):
    """A linear layer quantized the PT2E way (static, per-tensor activations, per-channel weights)."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.weight = torch.nn.Parameter(torch.randn(6, 8))
        self.register_buffer("scales", torch.rand(6) * 0.05 + 0.01)
        self.register_buffer("zero_points", torch.zeros(6, dtype=torch.int64))

    def forward(self, x):
        q = qd.quantize_per_tensor(x, 0.05, 3, -128, 127, torch.int8)
        x = qd.dequantize_per_tensor(q, 0.05, 3, -128, 127, torch.int8)
        w = qd.quantize_per_channel(self.weight, self.scales, self.zero_points, 0, -127, 127, torch.int8)
        w = qd.dequantize_per_channel(w, self.scales, self.zero_points, 0, -127, 127, torch.int8)
        y = torch.nn.functional.linear(x, w)
        return qd.dequantize_per_tensor(qd.quantize_per_tensor(y, 0.1, 0, -128, 127, torch.int8),
                                        0.1, 0, -128, 127, torch.int8)


class DynamicQuant(torch.nn.Module):
    """Dynamic quantization: the scale is chosen from the input at run time."""

    def forward(self, x):
        scale, zero_point = qd.choose_qparams.tensor(x, -128, 127, 1e-5, torch.int8)
        q = qd.quantize_per_tensor.tensor(x, scale, zero_point, -128, 127, torch.int8)
        return qd.dequantize_per_tensor.tensor(q, scale, zero_point, -128, 127, torch.int8)


@pytest.fixture(scope="module")
def artifact(tmp_path_factory):
    path = tmp_path_factory.mktemp("q") / "int8_linear.pt2b"
    x = torch.randn(3, 8)
    export_model(Int8Linear(), (x,), path)
    return path, x, Int8Linear()(x)


def _quantized(lowered):
    return {op for op in lowered.ops() if op.startswith("quantized_decomposed::")}


def test_core_keeps_them_and_runtime_ref_runs_them_by_default(artifact):
    path, x, eager = artifact
    lowered = load_for_backend(path, "core", validate=False)
    assert _quantized(lowered) == STATIC
    assert_bitwise(Runtime(lowered)(x), eager)


def test_max_decomposes_them_to_aten_ops(artifact):
    path, x, eager = artifact
    lowered = load_for_backend(path, "max", validate=False)
    assert _quantized(lowered) == set()
    assert {op.split("::")[0] for op in lowered.ops()} <= {"aten", "prims"}
    assert_bitwise(Runtime(lowered)(x), eager)


def test_a_float_only_backend_reaches_them_through_their_decompositions(artifact):
    """A backend listing core ATen ops and nothing quantized: the closure decomposes the quantized ops."""
    path, x, eager = artifact
    core_ops = presets.load("core").opset
    lowered = load_for_backend(path, supported_ops=core_ops, validate=False)
    assert _quantized(lowered) == set()
    assert set(lowered.ops()) <= set(core_ops)
    assert_bitwise(Runtime(lowered)(x), eager)


def test_choose_qparams_stays_where_torchs_kernel_branches_on_values(tmp_path):
    """choose_qparams' kernel checks min <= max on the data: its decomposition declines and the op stays
    (named, with why); a backend without it gets an OpsetError naming it."""
    path = tmp_path / "dynamic.pt2b"
    x = torch.randn(4, 8)
    export_model(DynamicQuant(), (x,), path)
    lowered = load_for_backend(path, "max", validate=False)
    assert _quantized(lowered) == {"quantized_decomposed::choose_qparams.tensor"}
    assert "declined" in lowered.explain("quantized_decomposed::choose_qparams.tensor")
    assert_bitwise(Runtime(lowered)(x), DynamicQuant()(x))
    with pytest.raises(OpsetError, match=r"quantized_decomposed::choose_qparams\.tensor"):
        load_for_backend(path, supported_ops=presets.load("core").opset, validate=False)
