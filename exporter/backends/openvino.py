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

import dataclasses
import functools

import torch

from . import Backend, calling
from .._torch.pytree import pytree
from ..errors import BackendRunError
from ..ops import op_name

SETTINGS = "device CPU, INFERENCE_PRECISION_HINT=f32 (OpenVINO computes in bf16 on AMX/AVX512-BF16 CPUs otherwise)"


def _supported_ops() -> tuple[str, ...]:
    from ..lowering.presets import core_names

    core = {n for n in core_names() if n.startswith("aten::")}
    return tuple(sorted(core | {op_name(op) for op in _not_decomposed()}))


@functools.cache  # read once a process
def _not_decomposed() -> frozenset:
    from openvino.frontend.pytorch.torchdynamo.export_decompositions import ops_to_not_decompose

    return frozenset(op for op in ops_to_not_decompose() if isinstance(op, torch._ops.OpOverload))


def _table() -> dict:
    """convert_model's own table: torch's default decompositions minus the ops OpenVINO translates."""
    from ..lowering.tables import torch_default_table

    return {op: fn for op, fn in torch_default_table().items() if op not in _not_decomposed()}


def hand_off(ep, *, device: str = "CPU", config: dict | None = None):
    """``openvino.convert_model`` of ``ep`` after OpenVINO's own table (as convert_model applies it),
    compiled for ``device`` in float32 unless ``config`` says otherwise."""
    import openvino
    from openvino.frontend.pytorch.fx_decoder import TorchFXPythonDecoder

    ep = ep.run_decompositions(_table())  # what convert_model's from_exported_program does first
    gm = ep.module()
    model = openvino.convert_model(TorchFXPythonDecoder(gm, dynamic_shapes=True))
    settings = {"INFERENCE_PRECISION_HINT": "f32", **(config or {})}
    return openvino.Core().compile_model(model, device, settings), ep, Converted(_result_names(gm), model)


@dataclasses.dataclass(frozen=True)
class Converted:
    """What running and saving the compiled model need beside it: the results' names in OpenVINO's
    order, and the model convert_model made (what openvino.save_model writes)."""

    names: list
    model: object


def _result_names(gm) -> list[str]:
    """The graph outputs OpenVINO makes results of, in its order: the unlifted module's flat outputs that
    are values (not None). That module may order them otherwise than the program's signature (torch's
    unlifting of a transformers ModelOutput holding None does), so results are matched by name."""
    out = next(n for n in gm.graph.nodes if n.op == "output")
    return [v.name for v in pytree.tree_leaves(out.args[0], is_leaf=lambda v: v is None)
            if isinstance(v, torch.fx.Node)]


def run(compiled, ep, args, kwargs, plan=None):
    """The compiled model takes the program's user inputs in order; its results, matched to the
    program's outputs by name, are put back into the program's own output structure."""
    leaves = calling.flat_inputs(ep, args, kwargs)
    result = compiled(calling.numpy_inputs(leaves))
    values = [torch.from_numpy(result[i].copy()) for i in range(len(result))]
    names = plan.names
    if len(values) != len(names):
        raise BackendRunError(f"OpenVINO returned {len(values)} results for the program's {len(names)} tensor outputs.")
    return calling.user_outputs(ep, dict(zip(names, values)), leaves)


def save(compiled, path: str) -> None:
    """The converted model as OpenVINO's IR (``path``.xml and its .bin), read by openvino.Core().read_model."""
    import openvino

    openvino.save_model(compiled.plan.model, path)


def backend() -> Backend:
    import openvino

    return Backend("openvino", openvino.__version__.split("-")[0], _supported_ops(),
                   "torch.export's default table minus openvino's export_decompositions.ops_to_not_decompose()",
                   _table, hand_off, run, SETTINGS, takes_what_its_table_leaves=True, save=save, file_suffix=".xml")
