"""Inductor and AOTInductor, inside torch: the ops Inductor lowers itself or falls back to ATen for
(torch._inductor.lowering's ``lowerings`` and ``fallbacks``; with ``implicit_fallbacks`` on, its
default, any other op too), the decompositions Inductor applies itself
(torch._inductor.decomposition.select_decomp_table), and the hand-off to AOTInductor
(``aoti_compile_and_package``; ``aoti_load_package`` runs the package)."""

from __future__ import annotations

import functools
import os
import tempfile

import torch

from . import Backend, retraceable


def _supported_ops() -> tuple[str, ...]:
    from .._torch.compilers import inductor_lowerings

    lowerings, fallbacks = inductor_lowerings()
    ops = (op for op in (*lowerings, *fallbacks) if isinstance(op, torch._ops.OpOverload))
    return retraceable(sorted({f"{op.namespace}::{op._opname}.{op._overloadname}" for op in ops}))


def _views_as_reshapes(ep):
    """``ep`` with each ``aten.view`` as ``aten.reshape`` (a new program over the same weights). AOTInductor
    traces the program again and decomposes with its own table, which may lay an op's result out
    otherwise than the program recorded (flaubert's attention: a transposed result where the lowered
    program had a contiguous one), and a view of that result then fails. A lowered program is
    functional (nothing writes through a view), so a reshape, which views where it can and copies
    where it must, computes the same values."""
    import copy

    from ..graph_walk import call_nodes, walk_graphs

    view = torch.ops.aten.view.default
    if not any(n.target is view for n in call_nodes(ep.graph_module)):
        return ep
    gm = copy.deepcopy(ep.graph_module)
    for _, sub in walk_graphs(gm):  # the program's graph and the subgraphs its control flow calls
        for node in sub.graph.nodes:
            if node.op == "call_function" and node.target is view:
                node.target = torch.ops.aten.reshape.default
        sub.recompile()
    return ep._update(gm, ep.graph_signature)


def _select_scatter_of_a_number(node) -> bool:
    """A ``select_scatter`` writing a 0-d value into a 1-d tensor of static size and the same dtype."""
    if node.op != "call_function" or node.target is not torch.ops.aten.select_scatter.default:
        return False
    x, src = (a.meta.get("val") if isinstance(a, torch.fx.Node) else None for a in node.args[:2])
    return (isinstance(x, torch.Tensor) and isinstance(src, torch.Tensor) and src.dim() == 0 and x.dim() == 1
            and isinstance(x.shape[0], int) and x.dtype == src.dtype)


def _as_where(graph, node) -> None:
    """``select_scatter(x, v, 0, i)`` of a 1-d ``x`` as ``where(arange(len(x)) == i, v, x)``: Inductor's
    select_scatter unsqueezes ``v``, and a 0-d value Inductor folded to a constant cannot be viewed
    ("'Constant' object has no attribute 'data'": RT-DETR's ``spatial_shapes[level, 0] = height``,
    ZoeDepth). The same values, bit for bit."""
    from .program_copy import node_replaced

    aten = torch.ops.aten
    x, src, _, index = node.args
    val = x.meta["val"]
    size = val.shape[0]
    positions = graph.call_function(aten.arange.default, (size,), {"dtype": torch.int64, "device": val.device})
    picked = graph.call_function(aten.eq.Scalar, (positions, index % size if size else index))
    made = graph.call_function(aten.where.self, (picked, src, x))
    with val.fake_mode:  # (each new node's value as torch.export records it: a fake tensor)
        positions.meta["val"] = aten.arange.default(size, dtype=torch.int64, device=val.device)
        picked.meta["val"] = aten.eq.Scalar(positions.meta["val"], picked.args[1])
        made.meta["val"] = aten.where.self(picked.meta["val"], src.meta["val"], val)
    node_replaced(graph, node, made)


def _metadata_check_of_an_intermediate(node) -> bool:
    """An ``_assert_tensor_metadata`` (torch.export records one for each ``.to()``) of a value the graph
    computes, not of an input."""
    return (node.op == "call_function" and node.target is torch.ops.aten._assert_tensor_metadata.default
            and isinstance(node.args[0], torch.fx.Node) and node.args[0].op != "placeholder")


def _left_out(graph, node) -> None:
    """``node`` (a check of a value's dtype, device and layout that the graph fixes) left out. Inkling 2's
    AOTInductor package aborted on such checks ("corrupted double-linked list": six cases) and ran right
    without them; a check of an input, which the caller's values decide, stays."""
    graph.erase_node(node)


# (what a node needs, its repair): made on one copy of the program's graph before AOTInductor compiles it
_REPAIRS = ((_select_scatter_of_a_number, _as_where), (_metadata_check_of_an_intermediate, _left_out))


def _convolution_of_a_size_read_from_data(ep) -> bool:
    """Whether a convolution of ``ep`` has a size read from data (an unbacked symbol: the images a
    vision-language model keeps, ``pixel_values[keep]``). Inductor's layout optimization gives such a
    convolution a channels-last output while the views after it read it as laid out contiguously:
    SigLIP's patch embeddings (``conv(x).flatten(2)``) in Idefics3, SmolVLM and ModernVBERT came out
    3.6 off, as they do from AOTInductor on torch.export's own program."""
    from torch.fx.experimental.symbolic_shapes import free_unbacked_symbols

    from ..graph_walk import call_nodes
    from ..ops import op_name

    return any(isinstance(n.target, torch._ops.OpOverload) and op_name(n.target).startswith(_CONVOLUTIONS)
               and free_unbacked_symbols(n.meta.get("val")) for n in call_nodes(ep.graph_module))


# the convolutions a program may hold: ``convolution`` where it is lowered, ``conv2d`` and the like in
# torch.export's own program (AOTInductor takes either)
_CONVOLUTIONS = ("aten::convolution.", "aten::_convolution.", "aten::conv1d.", "aten::conv2d.", "aten::conv3d.",
                 "aten::conv_transpose")


def hand_off(ep, *, package_path: str | None = None, inductor_configs: dict | None = None) -> tuple:
    """Compile ``ep`` with AOTInductor into a package (a .pt2 zip): its path, and the package loaded.
    ``inductor_configs`` go to ``aoti_compile_and_package`` over pt2b's own: layout optimization off
    where a convolution's size is read from data (_convolution_of_a_size_read_from_data)."""
    from .fixed_numbers import fixed_numbers_read
    from .program_copy import nodes_repaired
    from .sym_ops import ops_only

    configs = {"layout_optimization": False} if _convolution_of_a_size_read_from_data(ep) else {}
    # a bool read from a tensor (``t.item()``) is a SymBool that Inductor's reinplacing pass cannot
    # compare with itself ("unsupported operand type(s) for -: 'Equality' and 'Equality'": RT-DETR's,
    # D-FINE's and VITS's ``torch._check``s); read as a number (sym_ops) it compares
    ep = nodes_repaired(ops_only(fixed_numbers_read(ep)), _REPAIRS)
    ep = _views_as_reshapes(ep)
    path = package_path or os.path.join(tempfile.mkdtemp(prefix="pt2b_aoti_"), "model.pt2")
    package = torch._inductor.aoti_compile_and_package(ep, package_path=path,
                                                       inductor_configs={**configs, **(inductor_configs or {})})
    return package, ep, torch._inductor.aoti_load_package(package)


def run(package: str, ep, args, kwargs, plan=None):
    """AOTInductor's runner (``plan``, loaded by hand_off) takes the model's arguments and returns its
    outputs in the structure of the program it compiled: plain containers where the program's own has a
    class of its own (the hand-off's plain_spec), without the constant outputs (constant_outputs), put
    back into that structure with them."""
    from .._torch.pytree import pytree
    from .calling import out_spec, with_constants

    out = plan(*args, **kwargs)
    return out if pytree.tree_structure(out) == out_spec(ep) else with_constants(ep, pytree.tree_leaves(out))


@functools.cache  # read once a process: every load_for_backend(path, "inductor") plans with it
def _decompositions() -> dict:
    from .._torch.compilers import inductor_decompositions

    return {op: fn for op, fn in inductor_decompositions().items() if isinstance(op, torch._ops.OpOverload)}


def backend() -> Backend:
    # Inductor makes a fallback to the ATen kernel for any op it has no lowering for while its
    # config.implicit_fallbacks is on (the default): an op no decomposition reaches its ops with is taken as it is
    implicit = bool(getattr(torch._inductor.config, "implicit_fallbacks", False))
    source = "torch._inductor.lowering.lowerings + fallbacks" + (
        ", and any other op by implicit fallback (torch._inductor.config.implicit_fallbacks)" if implicit else "")
    return Backend("inductor", torch.__version__.split("+")[0], _supported_ops(), source, _decompositions, hand_off,
                   run, falls_back_to_aten=implicit, save=save, file_suffix=".pt2")


def save(compiled, path: str) -> None:
    """AOTInductor's package (a .pt2 zip), loaded by torch._inductor.aoti_load_package."""
    import shutil

    if os.path.abspath(compiled.native) != os.path.abspath(path):
        shutil.copyfile(compiled.native, path)
