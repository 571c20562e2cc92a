"""LiteRT: litert-torch's lowering registry as the op list and its decomposition tables, the hand-off its
ExportedProgram -> StableHLO MLIR -> TFLite conversion, run by ai-edge-litert's interpreter.

pip install litert-torch ai-edge-litert
"""

from __future__ import annotations

import torch

from . import Backend, calling, first_line, retraceable
from ..errors import BackendHandOffError, BackendRunError

SIGNATURE = "serving_default"  # the signature key TFLite's runners look a model's one signature up by


def _supported_ops() -> tuple[str, ...]:
    """The overloads litert-torch lowers to MLIR, read from its registry (a packet registers every
    overload); its other keys are Python's SymInt arithmetic, which every lowering keeps anyway. The
    hand-off retraces the program (its own run_decompositions), so the PrimTorch views are left out."""
    from litert_torch.backend.lowerings import registry

    from ..ops import op_name, resolve_op

    # a packet's overloads include TorchScript's (aten::acos.Scalar), which no dispatcher registers and no
    # program holds: only the overloads this torch registers are listed
    ops = {op_name(op) for op in registry.global_registry.registered_ops
           if isinstance(op, torch._ops.OpOverload) and resolve_op(op_name(op)) is op}
    return retraceable(sorted(ops))


def _table() -> dict:
    """litert-torch's decompositions: the table its converter runs after torch.export, with the one its
    lowering runs last over it (which adds to it: batch norm, padding, upsampling)."""
    from litert_torch.fx_infra import decomp

    table = {op: fn for op, fn in {**decomp.pre_convert_decomp(), **decomp.pre_lower_decomp()}.items()
             if isinstance(op, torch._ops.OpOverload)}
    # litert-torch decomposes _safe_softmax as plain softmax, which gives NaN on a row that attends to
    # nothing where torch gives 0 (every left-padded batch through scaled_dot_product_attention): torch's
    # own decomposition of it is used instead
    table.pop(torch.ops.aten._safe_softmax.default, None)
    return table


def _dynamic_dims(ep) -> list[str]:
    """Where ``ep``'s user inputs have dynamic dims: ``x[0] (s27)``, each input by its placeholder's name."""
    user = {s.arg.name for s in ep.graph_signature.input_specs if s.kind.name == "USER_INPUT"}
    return [f"{node.name}[{i}] ({d})" for node in ep.graph.nodes if node.op == "placeholder" and node.name in user
            for i, d in enumerate(getattr(node.meta.get("val"), "shape", ())) if isinstance(d, torch.SymInt)]


def _specialized(ep):
    """``ep`` exported again at its stored example inputs, every dim static; the same ops."""
    args, kwargs = ep.example_inputs
    return torch.export.export(ep.module(), tuple(args), dict(kwargs))


def _input_names(ep) -> list[str]:
    """The user inputs' names for the model's signature: each placeholder's name as the program names it
    (``x``, ``input_ids``), a leaf inside a keyword argument's dict or list by its path there (a carried
    state's buffers: ``state.<buffer>``)."""
    from .._torch.pytree import pytree

    names = [s.arg.name for s in ep.graph_signature.input_specs if s.kind.name == "USER_INPUT"]
    spec = ep.call_spec.in_spec
    paths, _ = pytree.tree_flatten_with_path(pytree.tree_unflatten(list(range(spec.num_leaves)), spec))
    if len(paths) != len(names):
        return names
    key = lambda k: str(getattr(k, "key", getattr(k, "idx", k)))  # noqa: E731
    return [".".join(key(k) for k in path[1:]) if getattr(path[0], "idx", 0) == 1 and len(path) > 2 else name
            for (path, _), name in zip(paths, names)]


def _index_put_summed(x, indices, values, accumulate=False):
    """``index_put(x, indices, values, accumulate=True)`` without a scatter: a one-hot matrix of the indexed
    positions (duplicates summed, as torch sums them) times the values, added to ``x``. The converter
    makes a scatter-add a STABLEHLO_SCATTER whose add the TFLite runtime refuses ("Only update, Add,
    Multiply, Maximum and Minimum operations are currently supported"): every index_put accumulating
    (index_add, in-place ``x[idx] += v``) and scatter_add. Index tensors at the leading dims only;
    anything else is left to the converter (NotImplemented)."""
    import math

    if (not accumulate or not indices or any(i is None or i.dtype == torch.bool for i in indices)
            or x.dtype == torch.bool):
        return NotImplemented
    lead, rest = x.shape[:len(indices)], x.shape[len(indices):]
    index = torch.broadcast_tensors(*indices)
    flat = torch.zeros_like(index[0])
    for size, i in zip(lead, index):
        flat = flat * size + torch.remainder(i, size)  # (negative indices count from the end)
    positions, width = math.prod(lead), math.prod(rest)
    spread = values.expand(*index[0].shape, *rest).reshape(-1, width)
    one_hot = (flat.reshape(-1, 1) == torch.arange(positions, device=x.device)).to(x.dtype)
    summed = one_hot.t() @ spread if x.is_floating_point() else (one_hot.unsqueeze(-1) * spread.unsqueeze(1)).sum(0)
    return x + summed.reshape(x.shape)


def _scatter_add_summed(x, dim, index, src):
    """``scatter_add(x, dim, index, src)`` without a scatter, as _index_put_summed: each position's one-hot
    row along ``dim`` times ``src``, summed over ``dim`` and added to ``x`` (the positions ``index`` does
    not reach add 0)."""
    import torch.nn.functional as F

    dim = dim % x.dim() if x.dim() else 0
    if x.dtype == torch.bool or x.dim() == 0:
        return NotImplemented
    one_hot = (index.unsqueeze(-1) == torch.arange(x.shape[dim], device=x.device)).to(x.dtype)
    part = src[tuple(slice(0, n) for n in index.shape)]
    summed = (part.unsqueeze(-1) * one_hot).sum(dim).movedim(-1, dim)
    pad = [p for d in reversed(range(x.dim())) for p in (0, x.shape[d] - summed.shape[d])]
    return x + F.pad(summed, pad)


# the ops the converter makes a scatter-add of, and what the hand-off makes of them first
_SUMMED = {torch.ops.aten.index_put.default: _index_put_summed, torch.ops.aten.scatter_add.default: _scatter_add_summed}


def _summing_without_scatter(ep):
    """``ep`` with each scatter-add of _SUMMED made of other ops (a new program), or ``ep`` if it has none."""
    put = torch.ops.aten.index_put.default
    adds = [n for n in ep.graph.nodes if n.target in _SUMMED and (n.target is not put or (
        n.args[3] if len(n.args) > 3 else n.kwargs.get("accumulate", False)))]
    if not adds:
        return ep
    return ep.run_decompositions({op: fn for op, fn in _SUMMED.items() if any(n.target is op for n in adds)})


def hand_off(ep, *, specialize: bool = False, enable_x64: bool = False):
    """litert-torch's conversion of ``ep`` as it is (its last decompositions, its lowering to StableHLO
    MLIR, its converter passes to TFLite; ``exported_programs_to_flatbuffer``, what its ``convert``
    does after torch.export): the ``.tflite`` flatbuffer's bytes, and ai-edge-litert's Interpreter of
    it. The converter takes static shapes only: a program with dynamic dims is a BackendHandOffError
    naming them, or with ``specialize=True`` converted at its stored example inputs' sizes.
    ``enable_x64``: keep int64/float64 inputs and outputs (litert-torch narrows them to 32 bits by
    default; run() casts back to the program's dtypes)."""
    from litert_torch._convert import litert_converter, signature

    if ep.example_inputs is None:
        raise BackendHandOffError("litert-torch's conversion reads the program's example inputs, and this program "
                                  "stores none: export it with example inputs (export_model does).")
    dims = _dynamic_dims(ep)
    taken = ep
    if dims:
        if not specialize:
            raise BackendHandOffError(
                f"LiteRT's converter takes static shapes only, and the program's inputs have dynamic dims "
                f"{', '.join(dims)}: "
                f"to_backend(..., specialize=True) converts it at the stored example inputs' sizes (the "
                f"compiled model then takes only those), or export it with static shapes.")
        taken = _specialized(ep)
    taken = _summing_without_scatter(taken)
    # the Signature names the model's inputs (what its runner takes them by) from its sample kwargs
    sig = signature.Signature(SIGNATURE, None, (), {n: torch.empty(0) for n in _input_names(ep)})
    exporter = litert_converter.exported_programs_to_flatbuffer([taken], [sig], enable_x64=enable_x64)
    data = exporter.to_bytes()
    return data, ep, _interpreter(data)


def _interpreter(data: bytes):
    from ai_edge_litert.interpreter import Interpreter

    interpreter = Interpreter(model_content=data)
    interpreter.allocate_tensors()
    return interpreter


def run(data: bytes, ep, args, kwargs, plan=None):
    """``plan``: the Interpreter hand_off made. The model takes the program's tensor user inputs in order,
    at the sizes it was converted at, in its own dtypes (int32 for int64 unless enable_x64), and
    returns its tensor user outputs in order, cast back to the dtypes the program records."""
    import numpy as np

    leaves = calling.flat_inputs(ep, args, kwargs)
    inputs = [v for v in calling.numpy_inputs(leaves) if isinstance(v, np.ndarray)]
    details = plan.get_input_details()
    if len(inputs) != len(details):
        raise BackendRunError(f"the LiteRT model takes {len(details)} tensor inputs, and the call gives {len(inputs)}.")
    for d, value in zip(details, inputs):
        if tuple(value.shape) != tuple(d["shape"]):
            named = {v["index"]: k for k, v in plan.get_signature_runner(SIGNATURE).get_input_details().items()}
            raise BackendRunError(f"the LiteRT model's input {named.get(d['index'], d['name'])!r} is "
                                  f"{tuple(int(n) for n in d['shape'])} and the call gives {tuple(value.shape)}: the "
                                  f"model was converted at static sizes; call it at those.")
        plan.set_tensor(d["index"], np.require(value.astype(d["dtype"], copy=False), requirements="C"))
    try:
        plan.invoke()
    except Exception as e:  # noqa: BLE001 (the interpreter raises bare RuntimeErrors: typed and chained)
        raise BackendRunError(f"LiteRT's interpreter could not run the model: {first_line(e)}") from e
    values = [torch.from_numpy(np.array(plan.get_tensor(d["index"]))) for d in plan.get_output_details()]  # (a copy)
    return calling.from_tensor_outputs(ep, _recorded_dtypes(ep, values), leaves, "LiteRT")


def _recorded_dtypes(ep, values: list) -> list:
    """``values`` (the model's outputs, the program's tensor user outputs in order) each in the dtype
    the program records for it, where the converter narrowed it (int64 to int32)."""
    from torch.export.graph_signature import OutputKind, TensorArgument

    out = {n.name: n for n in ep.graph.output_node().all_input_nodes}
    wanted = [getattr(out.get(s.arg.name), "meta", {}).get("val") for s in ep.graph_signature.output_specs
              if s.kind == OutputKind.USER_OUTPUT and isinstance(s.arg, TensorArgument)]
    if len(wanted) != len(values):
        return values
    return [v.to(w.dtype) if isinstance(w, torch.Tensor) and v.dtype != w.dtype else v for v, w in zip(values, wanted)]


def save(compiled, path: str) -> None:
    """The ``.tflite`` flatbuffer, which ai-edge-litert's Interpreter loads with no torch or pt2b: its
    signature ``serving_default`` takes the program's inputs by name (a carried state's buffers after
    them as ``state.<buffer>``) and returns its outputs named by litert-torch (``output_0``, or the
    keys of a dict the program returns), a carried state's new values after them."""
    with open(path, "wb") as f:
        f.write(compiled.native)


def backend() -> Backend:
    from importlib.metadata import version

    return Backend("litert", f"{version('litert-torch')}+litert{version('ai-edge-litert')}", _supported_ops(),
                   "litert_torch.backend.lowerings.registry (its registry of ATen ops lowered to MLIR)", _table,
                   hand_off, run, "ai-edge-litert's Interpreter on the CPU (XNNPACK), static shapes", save=save,
                   file_suffix=".tflite",
                   # the lowering drops the buffer writes (it returns only the user outputs): state comes lifted
                   holds_state=False)
