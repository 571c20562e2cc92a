"""OpenVINO: ``openvino.convert_model(exported_program)`` reads a torch.export program through its
PyTorch frontend, which first runs torch's default decompositions minus the ops it translates itself
(``export_decompositions.ops_to_not_decompose()``) and translates whatever that leaves. The preset does
the same: that table, read from the installed torch and OpenVINO, and every op it leaves accepted (an
op OpenVINO then has no translator for is OpenVINO's gap, as it is on torch.export's own program). The
ops it names are the core ATen ops (torch.Tag.core) plus that list. The hand-off is an ``openvino.CompiledModel`` for the CPU device, in float32
(``INFERENCE_PRECISION_HINT=f32``: on CPUs with AMX or AVX512-BF16 OpenVINO otherwise computes in bf16).

pip install pt2b[openvino]
"""

from __future__ import annotations

import functools

import torch

from . import Backend, calling
from ..ops import op_name

SETTINGS = "device CPU, INFERENCE_PRECISION_HINT=f32 (OpenVINO computes in bf16 on AMX/AVX512-BF16 CPUs otherwise)"


@functools.cache
def _core_ops() -> frozenset[str]:
    """Every registered aten overload that carries torch.Tag.core."""
    out = set()
    for qualified in torch._C._dispatch_get_all_op_names():
        ns, _, rest = qualified.partition("::")
        if ns != "aten":
            continue
        name, _, overload = rest.partition(".")
        op = getattr(getattr(torch.ops.aten, name, None), overload or "default", None)
        if isinstance(op, torch._ops.OpOverload) and torch.Tag.core in op.tags:
            out.add(op_name(op))
    return frozenset(out)


def _supported_ops() -> tuple[str, ...]:
    return tuple(sorted(_core_ops() | {op_name(op) for op in _not_decomposed()}))


@functools.cache  # read once a process
def _not_decomposed() -> frozenset:
    from openvino.frontend.pytorch.torchdynamo.export_decompositions import ops_to_not_decompose

    return frozenset(op for op in ops_to_not_decompose() if isinstance(op, torch._ops.OpOverload))


def _table() -> dict:
    """convert_model's own table: torch's default decompositions minus the ops OpenVINO translates."""
    from ..lowering.tables import torch_default_table

    return {op: fn for op, fn in torch_default_table().items() if op not in _not_decomposed()}


def hand_off(ep, *, device: str = "CPU", config: dict | None = None):
    """``openvino.convert_model(ep)`` compiled for ``device`` in float32 unless ``config`` says otherwise."""
    import openvino

    model = openvino.convert_model(ep)
    settings = {"INFERENCE_PRECISION_HINT": "f32", **(config or {})}
    return openvino.Core().compile_model(model, device, settings), ep


def run(compiled, ep, args, kwargs):
    """The compiled model takes the program's user inputs in order and returns its tensor outputs in order."""
    leaves = calling.flat_inputs(ep, args, kwargs)
    result = compiled([leaf.numpy(force=True) if isinstance(leaf, torch.Tensor) else leaf for leaf in leaves])
    values = [torch.from_numpy(result[i].copy()) for i in range(len(result))]
    return calling.from_tensor_outputs(ep, values, leaves, "OpenVINO")


def backend() -> Backend:
    import openvino

    return Backend("openvino", openvino.__version__.split("-")[0], _supported_ops(),
                   "torch.export's default table minus openvino's export_decompositions.ops_to_not_decompose()",
                   _table, hand_off, run, SETTINGS, takes_what_its_table_leaves=True)
