"""ExecuTorch with its portable kernels: the op list is the runtime's own kernel registry
(``portable_lib._get_operator_names()``), where kernels are out-variants ("aten::add.out"); pt2b reads
each as its functional op, and a ``*_copy`` kernel also as the view op it copies (to_edge rewrites
``squeeze.dims`` into ``squeeze_copy.dims``: torch.Tag.view_copy names them), and ExecuTorch's
dim-order kernels as the ATen ops to_edge rewrites into them (``exir.passes.dim_order_ops_registry``).
The hand-off is ``to_edge(program).to_executorch()`` (an ``ExecutorchProgramManager``: ``.buffer``
is the .pte file); the runtime's pybindings run it.

pip install executorch  (about ten minutes; it keeps torch 2.13)
"""

from __future__ import annotations

import functools
import types

import torch

from . import Backend, calling, quiet_logger
from .complex_pairs import PAIRED_OPS, complex_as_real_pairs
from .fixed_numbers import fixed_numbers_read
from .program_copy import node_replaced, nodes_repaired
from ..ops import op_name, resolve_op


_TENSOR_OPTIONS = {"dtype", "layout", "device", "pin_memory"}  # factory functions' kwargs their out= form lacks


def _signature(op, drop_out: bool) -> list[tuple[str, str]]:
    return [(a.name, str(a.type)) for a in op._schema.arguments
            if not (drop_out and a.is_out) and a.name not in _TENSOR_OPTIONS]


def _functional(kernel: str):
    """The functional op of an out-variant kernel: the overload of the same op whose arguments are the
    out one's without its out= tensors (aten::add.out -> aten::add.Tensor; factory functions' tensor
    options aside: aten::full.out -> aten::full.default). A functional kernel (sym_size.int) is itself."""
    out = resolve_op(kernel)
    if out is None:
        return None
    if not out._schema.is_mutable:
        return out
    packet = getattr(getattr(torch.ops, out.namespace), out._schema.name.partition("::")[2])
    want = _signature(out, drop_out=True)
    for overload in packet.overloads():
        op = getattr(packet, overload)
        if not op._schema.is_mutable and _signature(op, drop_out=False) == want:
            return op
    return None


def _view_of(copy_op):
    """The view op a ``*_copy`` op copies (aten::squeeze_copy.dims -> aten::squeeze.dims), or None."""
    if torch.Tag.view_copy not in copy_op.tags:
        return None
    name = copy_op.__name__.partition(".")[0].removesuffix("_copy")
    return getattr(getattr(torch.ops.aten, name, None), copy_op._overloadname, None)


@functools.cache
def _edge_verifier():
    from executorch.exir.verification.verifier import EXIRATenDialectVerifier

    return EXIRATenDialectVerifier()


def _edge_accepts(op) -> bool:
    """Whether to_edge's own verifier takes ``op`` (core ATen, the *_copy ops of views, its exceptions)."""
    try:
        _edge_verifier().check_valid_op(op)
    except Exception:  # noqa: BLE001 -- its SpecViolationError: not an op to_edge takes
        return False
    return True


@functools.cache
def _supported() -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(accepted op names, kernel names this torch cannot map)."""
    from executorch.exir.passes.dim_order_ops_registry import MemoryFormatOpsMap
    from executorch.extension.pybindings import portable_lib

    accepted, unmapped = set(), []
    dim_order = {op_name(edge._op): op_name(aten._op) for edge, aten in MemoryFormatOpsMap.items()}
    for kernel in portable_lib._get_operator_names():
        ns, _, rest = kernel.partition("::")
        if ns == "executorch_prim" or ns == "et_copy":  # SymInt arithmetic, device copies: not graph ops
            continue
        op = _functional(kernel if "." in rest else kernel + ".default")
        if op is None:
            unmapped.append(kernel)
            continue
        name = dim_order.get(op_name(op), op_name(op))
        if not _edge_accepts(resolve_op(name) or op):
            unmapped.append(kernel)
            continue
        accepted.add(name)
        view = _view_of(op)
        if view is not None and _edge_accepts(view):  # (to_edge refuses unfold, which it has no decomposition for)
            accepted.add(op_name(view))
    # the ops making and reading complex tensors, which the hand-off gives as arithmetic on real pairs
    # (complex_pairs.py): the portable kernels have no complex dtype, and DeepSeek-V2's and Llama 4's rotary
    # embeddings view their queries as complex
    accepted.update(PAIRED_OPS)
    return tuple(sorted(accepted)), tuple(unmapped)


def _written_buffers(ep) -> list[str]:
    """The placeholder names of the buffers ``ep`` writes."""
    from .state import written_buffers

    written = set(written_buffers(ep))
    return [name for name, target in ep.graph_signature.inputs_to_buffers.items() if target in written]


def _negative_pad(node) -> bool:
    """A constant pad (constant_pad_nd, or aten.pad in "constant" mode in a program not lowered) with
    a negative pad."""
    if node.target is torch.ops.aten.pad.default:
        mode = node.args[2] if len(node.args) > 2 else node.kwargs.get("mode", "constant")
        if mode != "constant":
            return False
    elif node.target is not torch.ops.aten.constant_pad_nd.default:
        return False
    return any(isinstance(p, int) and p < 0 for p in node.args[1])


def _pad_as_slices(graph, node) -> None:
    """A constant_pad_nd with negative pads (torch crops there; ExecuTorch's kernel refuses them: "Padding
    values must be non-negative", RWKV's time shift, ZeroPad2d((0, 0, 1, -1))) as a slice of each side
    cropped, then the pad of the sides that grow, if any: the same values."""
    x, pad = node.args[0], list(node.args[1])
    if node.target is torch.ops.aten.pad.default:
        value = node.args[3] if len(node.args) > 3 else node.kwargs.get("value")
        value = (0.0,) if value is None else (value,)
    else:
        value = tuple(node.args[2:]) + tuple(node.kwargs.values())
    made, val = x, x.meta.get("val")
    for k in range(len(pad) // 2):
        dim, (before, after) = -(k + 1), pad[2 * k:2 * k + 2]
        if before >= 0 and after >= 0:
            continue
        start, end = max(-before, 0), (after if after < 0 else None)
        made = graph.call_function(torch.ops.aten.slice.Tensor, (made, dim, start, end))
        if isinstance(val, torch.Tensor):
            val = torch.ops.aten.slice.Tensor(val, dim, start, end)
            made.meta["val"] = val
    grow = [max(p, 0) for p in pad]
    if any(grow):
        made = graph.call_function(torch.ops.aten.constant_pad_nd.default, (made, grow, *value))
        if isinstance(val, torch.Tensor):  # (constant_pad_nd's own meta guards on a symbolic size: it would specialize)
            shape = list(val.shape)
            for k in range(len(grow) // 2):
                shape[-(k + 1)] = shape[-(k + 1)] + grow[2 * k] + grow[2 * k + 1]
            made.meta["val"] = val.new_empty(shape)
    node_replaced(graph, node, made)


def _empty_of_a_symbolic_size(node) -> bool:
    return (node.target is torch.ops.aten.empty.memory_format
            and any(isinstance(s, torch.fx.Node) for s in node.args[0]))


def _empty_as_full(graph, node) -> None:
    """An ``empty`` of a size the program computes as a ``full`` of zeros (an empty tensor's values are
    unspecified: zeros are some). to_edge's memory-format pass calls ``empty``'s dim-order form with the
    size it traced, which reads a symbolic size as a number and specializes it: the program then runs at
    the example's size only (a mixture of experts' ``empty_like`` of its routed rows)."""
    options = {k: v for k, v in node.kwargs.items() if k in ("dtype", "layout", "device", "pin_memory")}
    made = graph.call_function(torch.ops.aten.full.default, (node.args[0], 0), options)
    made.meta.update(node.meta)
    node_replaced(graph, node, made)


_LAID_OUT = (torch.ops.aten.clone.default, torch.ops.aten._to_copy.default)


def _laid_out_otherwise(node) -> bool:
    return node.target in _LAID_OUT and node.kwargs.get("memory_format") is not torch.contiguous_format


def _laid_out_contiguous(graph, node) -> None:
    """A clone or copy to another layout than contiguous (channels-last, or its input's) made contiguous:
    the same values. The portable kernels take every tensor of a call in one dim order, and to_edge gives
    such a copy the dim order asked for, or its input's as the program's trace laid it out (an add of a
    permuted view), where ExecuTorch's tensors are dense copies: a channels-last clone followed by a
    permute (the bicubic interpolation of vitdet's position embeddings) was refused ("2 input tensors have
    different dim orders", error 0x12: vitdet, pixio, lw_detr_vit, the video ViTs)."""
    node.kwargs = {**node.kwargs, "memory_format": torch.contiguous_format}


# (what a node needs, its repair): made on one copy of the program's graph before to_edge
_REPAIRS = ((_negative_pad, _pad_as_slices), (_empty_of_a_symbolic_size, _empty_as_full),
            (_laid_out_otherwise, _laid_out_contiguous))


def _python_sym_calls(ep) -> bool:
    """Whether ``ep`` calls Python's number functions (``torch.sym_min``, ``torch.sym_max``, ``sym_ite``...)
    that ExecuTorch runs as its own prim ops (``executorch_prim_ops_registry.is_sym_op``)."""
    from executorch.exir.passes.executorch_prim_ops_registry import is_sym_op

    return any(n.op == "call_function" and isinstance(n.target, types.FunctionType) and is_sym_op(n.target)
               for n in ep.graph.nodes)


def _edge_config(ep):
    """to_edge's settings: its edge verifier off for a program calling Python's number functions only. That
    verifier refuses any Python function in a graph ("assert op.__name__ in ('alloc',)": a bare
    AssertionError; deepseek_v32, glm_moe_dsa and axk2 take ``min`` of sizes), though to_executorch's own
    EdgeToBackendOpsPass then makes each one ExecuTorch's prim op (executorch 1.5.1); the hand-off check
    still compares what the runtime computes."""
    from executorch.exir import EdgeCompileConfig

    return EdgeCompileConfig(_check_ir_validity=not _python_sym_calls(ep))


def hand_off(ep):
    """``to_edge(ep).to_executorch()``: the ExecutorchProgramManager (``.buffer``: the .pte bytes), and
    the runtime's module loaded from those bytes. ExecuTorch stores a written buffer's shape and dtype
    only, and its runtime starts it from zeros, unless its InitializedMutableBufferPass marks it: every
    buffer the program writes is marked, so the first call starts from the program's own values (a
    counter at 5, a moving average, a cache's positions), as the program's own first call does."""
    from executorch.exir import ExecutorchBackendConfig, to_edge
    from executorch.exir.passes.init_mutable_pass import InitializedMutableBufferPass

    ep = nodes_repaired(fixed_numbers_read(complex_as_real_pairs(ep)), _REPAIRS)
    written = _written_buffers(ep)
    config = ExecutorchBackendConfig(passes=[InitializedMutableBufferPass(written)] if written else [])
    with quiet_logger("executorch"):
        manager = to_edge(ep, compile_config=_edge_config(ep)).to_executorch(config)
    return manager, ep, load(manager)


def load(manager):
    """The runtime's module loaded afresh from the .pte bytes (its buffers at the program's values)."""
    from executorch.extension.pybindings import portable_lib

    return portable_lib._load_for_executorch_from_buffer(manager.buffer)


def run(manager, ep, args, kwargs, plan=None):
    """``plan``: the loaded module hand_off made."""
    leaves = calling.flat_inputs(ep, args, kwargs)
    outs = plan.forward([leaf.contiguous() if isinstance(leaf, torch.Tensor) else leaf for leaf in leaves])
    return calling.from_tensor_outputs(ep, list(outs), leaves, "ExecuTorch")


def backend() -> Backend:
    from importlib.metadata import version

    accepted, _ = _supported()
    return Backend("executorch", version("executorch"), accepted,
                   "executorch's portable_lib._get_operator_names() (out-variant kernels, read as functional ops)",
                   dict, hand_off, run, "portable kernels, no delegate",
                   holds_state=True,  # the loaded Method keeps its mutable buffers between executions
                   load=load,
                   save=save, file_suffix=".pte", takes_ops_only=True)


def save(compiled, path: str) -> None:
    """The .pte program (ExecutorchProgramManager.buffer), loaded by ExecuTorch's runtime."""
    with open(path, "wb") as f:
        f.write(compiled.native.buffer)
