"""Apache TVM (Relax): its op list read from its torch.export importer's convert map, and the hand-off
(from_exported_program with TVM's conversions fixed where they miss torch's semantics, tvm.compile for
llvm, the Relax VM running it).

pip install apache-tvm
"""

from __future__ import annotations

import functools

import torch

from . import Backend, calling
from ..errors import BackendRunError
from ..ops import op_name, registered_overload

TARGET = "llvm"


@functools.cache  # read once a process
def _convert_map_keys() -> tuple[str, ...]:
    from tvm.relax.frontend.torch.exported_program_translator import ExportedProgramImporter

    return tuple(ExportedProgramImporter().create_convert_map())


def _supported() -> tuple[str, ...]:
    """The ATen ops the importer converts. It finds a node's conversion by the text of its target without
    the namespace ("add.Tensor"); a key without an overload names a Python callable (SymInt arithmetic,
    ``getitem``), and a key this torch's ATen lacks names another library's op (torchvision's
    ``roi_align``) or none (``softsign.default``): neither is an ATen op a lowering decomposes to."""
    ops = set()
    for key in _convert_map_keys():
        name, dot, overload = key.partition(".")
        op = registered_overload("aten", name, overload) if dot else None
        if op is not None:
            ops.add(op_name(op))
    return tuple(sorted(ops))


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")  # torch.bool -> "bool", TVM's name for it


def _replacing(importer, node, own, replaced: dict):
    """``own(node)`` (TVM's conversion) with the converted values of some of the node's inputs replaced
    (``replaced``: node -> relax expression) while it converts."""
    saved = {n: importer.env[n] for n in replaced}
    importer.env.update(replaced)
    try:
        return own(node)
    finally:
        importer.env.update(saved)


def _input_in_recorded_dtype(node, importer, own):
    """``aten::cumsum``/``aten::cumprod`` on the input cast to the result dtype the program records: torch
    accumulates integers and bools in int64, TVM in the input's dtype (a bool causal mask's cumsum then
    fails to compile, an int32 one overflows where torch's does not)."""
    from tvm import relax

    source, want = node.args[0], _dtype_name(node.meta["val"].dtype)
    x = importer.env[source]
    if str(x.ty.dtype) == want:
        return own(node)
    return _replacing(importer, node, own, {source: importer.block_builder.emit(relax.op.astype(x, want))})


def _additive_mask(node, importer, own):
    """``aten::scaled_dot_product_attention`` with a bool mask (transformers' attention masks), which TVM's
    conversion refuses (it takes a float mask): converted with the float mask, 0 where True and the
    dtype's lowest value where False, and the rows that attend to nothing made 0, as torch makes them
    (-inf there would give NaN)."""
    from tvm import relax

    source = node.args[3] if len(node.args) > 3 else node.kwargs.get("attn_mask")
    if source is None or str(importer.env[source].ty.dtype) != "bool":
        return own(node)
    mask, dtype = importer.env[source], str(importer.env[node.args[0]].ty.dtype)
    emit = importer.block_builder.emit
    lowest = relax.const(torch.finfo(getattr(torch, dtype)).min, dtype)
    additive = emit(relax.op.where(mask, relax.const(0.0, dtype), lowest))
    attended = emit(relax.op.max(relax.op.astype(mask, dtype), axis=-1, keepdims=True))  # 1: any key
    return emit(relax.op.multiply(_replacing(importer, node, own, {source: additive}), attended))


def _sorted_topk(node, importer, own):
    """``aten::topk`` with ``sorted=False`` (transformers' mixture-of-experts routers pick their experts so),
    which TVM's conversion refuses ("Currently supports only sorted output for topk operator"): converted
    sorted, one of the orders ``sorted=False`` allows (what reads the k values in an order of its own is
    caught by the hand-off check)."""
    args = tuple(node.args)
    if len(args) < 5 or args[4]:
        return own(node)
    node.args = (*args[:4], True)
    try:
        return own(node)
    finally:
        node.args = args


# TVM's conversions that compute wrong on, or refuse, what torch programs hold, and what the hand-off does first
_BEFORE = {"cumsum.default": _input_in_recorded_dtype, "cumprod.default": _input_in_recorded_dtype,
           "scaled_dot_product_attention.default": _additive_mask, "topk.default": _sorted_topk}


def _conversions() -> dict:
    """Every conversion of the importer's map (``custom_convert_map``), each TVM's own with two fixes: the
    ones of _BEFORE, and its result cast to the dtype the program records for the node where TVM's differs
    (its ``new_ones`` ignores ``dtype=`` and makes a bool mask int64; the next op then fails or computes
    in the wrong type)."""
    from tvm import relax
    from tvm.relax.frontend.torch.exported_program_translator import ExportedProgramImporter

    held: dict = {}

    def own_map(importer) -> dict:  # the importer's own conversions (its map holds these over them), once
        if held.get("importer") is not importer:
            held.update(importer=importer, map=ExportedProgramImporter.create_convert_map(importer))
        return held["map"]

    def entry(key: str):
        # the importer passes itself to the entries of custom_convert_map, except in the branches of a
        # cond, which it converts after the cond's own entry
        def convert(node, importer=None):
            importer = importer if importer is not None else held["importer"]
            own = own_map(importer)[key]
            result = _BEFORE[key](node, importer, own) if key in _BEFORE else own(node)
            val = node.meta.get("val")
            made = getattr(getattr(result, "ty", None), "dtype", None)
            if isinstance(val, torch.Tensor) and made is not None and str(made) != _dtype_name(val.dtype):
                result = importer.block_builder.emit(relax.op.astype(result, _dtype_name(val.dtype)))
            return result

        return convert

    return {key: entry(key) for key in _convert_map_keys()}


def _index_put_every_dim(x, indices, values, accumulate=False):
    """``index_put`` with an index tensor for every dim of ``x``: each sliced dim (a None index, or one past
    the last index given) indexed by its ``arange``, shaped so that all of them broadcast to the shape
    ``x[indices]`` has (the sliced dims before, the index tensors' broadcast shape, the sliced dims after),
    the same positions. TVM's conversion requires one index per dim ("IndexPut requires the number of
    index tensors (3) to match the data tensor dimensions (4)": a static KV cache written at
    ``cache[:, :, position]``) and broadcasts the aranges it makes for None wrongly where two dims are
    sliced. Where the index tensors are not adjacent torch puts their dims first: left as it is
    (NotImplemented), as is a bool index."""
    given = list(indices) + [None] * (x.dim() - len(indices))
    at = [d for d, i in enumerate(given) if i is not None]
    if (not at or len(at) == len(given) or at != list(range(at[0], at[-1] + 1))
            or any(given[d].dtype == torch.bool for d in at)):
        return NotImplemented
    shape = torch.broadcast_shapes(*(given[d].shape for d in at))
    before, after = at[0], x.dim() - at[-1] - 1
    full = []
    for d, index in enumerate(given):
        if index is not None:
            full.append(index.reshape(*[1] * (len(shape) - index.dim()), *index.shape, *[1] * after))
            continue
        # a sliced dim: its own axis, every other position of the result shape broadcast
        lead = d if d < before else before + len(shape) + (d - at[-1] - 1)
        rank = before + len(shape) + after
        full.append(torch.arange(x.shape[d], device=x.device).reshape([-1] + [1] * (rank - lead - 1)))
    return torch.ops.aten.index_put.default(x, full, values, accumulate)


def _every_dim_indexed(ep):
    """``ep`` with each ``index_put`` that leaves dims sliced made one that indexes every dim (a new
    program), or ``ep`` if it has none."""
    put = torch.ops.aten.index_put.default
    short = [n for n in ep.graph.nodes if n.target is put and (
        len(n.args[1]) < n.args[0].meta["val"].dim() or any(i is None for i in n.args[1]))]
    return ep.run_decompositions({put: _index_put_every_dim}) if short else ep


def hand_off(ep, *, target: str = TARGET, custom_convert_map: dict | None = None):
    """``from_exported_program(ep)`` (pt2b's lowering as it is: TVM's own run_decompositions is not run
    again) with TVM's conversions fixed as above and ``custom_convert_map`` over them, compiled by
    ``tvm.compile`` for ``target``: the ``VMExecutable`` (``export_library(path)``), and the Relax VM
    that runs it."""
    import tvm
    from tvm import relax
    from tvm.relax.frontend.torch import from_exported_program

    entries = {**_conversions(), **(custom_convert_map or {})}
    mod = from_exported_program(_every_dim_indexed(ep), run_ep_decomposition=False,
                                custom_convert_map=entries)
    executable = tvm.compile(mod, target=target)
    return executable, ep, relax.VirtualMachine(executable, tvm.cpu())


def run(executable, ep, args, kwargs, plan=None):
    """``plan``: the Relax VM hand_off made; its ``main`` takes the program's user inputs in order and
    returns its tensor outputs as a tuple (the importer drops the buffer writes it holds as constants)."""
    import numpy as np
    import tvm

    leaves = calling.flat_inputs(ep, args, kwargs)
    # C order, as TVM reads an array's buffer (np.ascontiguousarray would make a 0-d state 1-d)
    inputs = [tvm.runtime.tensor(np.require(v, requirements="C")) if isinstance(v, np.ndarray) else v
              for v in calling.numpy_inputs(leaves)]
    try:
        result = plan["main"](*inputs)
    except Exception as e:  # noqa: BLE001 (TVM's runtime errors are its own types: typed and chained)
        raise BackendRunError(f"TVM's Relax VM could not run the program: {type(e).__name__}: "
                              f"{str(e).strip().splitlines()[-1] if str(e).strip() else ''}") from e
    values = [torch.from_numpy(v.numpy()) if hasattr(v, "numpy") else v for v in result]
    return calling.from_tensor_outputs(ep, values, leaves, "TVM")


def backend() -> Backend:
    from importlib.metadata import version

    return Backend("tvm", version("apache-tvm"), _supported(),
                   "tvm.relax.frontend.torch's ExportedProgramImporter().create_convert_map() (its ATen keys)",
                   dict, hand_off, run, f"target {TARGET}, Relax VM on tvm.cpu()",
                   # the importer binds buffers as constants and drops their writes: state comes lifted
                   holds_state=False, save=save, file_suffix=".so", takes_ops_only=True)


def save(compiled, path: str) -> None:
    """The compiled executable as a shared library (``VMExecutable.export_library``, linked by the
    system's C compiler), loaded by ``tvm.runtime.load_module`` and run by ``relax.VirtualMachine``."""
    compiled.native.export_library(str(path))
