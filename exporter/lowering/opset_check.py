"""Opset membership: which ops of a lowered program fall outside the accepted opset, and each one's
route (running the program on inputs is lowering/validate.py)."""

from __future__ import annotations

import operator

import torch

from ..ops import op_name
from . import routes
from ..graph_walk import op_nodes

# Graph plumbing every opset accepts: shape queries, runtime assertions, control flow.
INFRASTRUCTURE = {
    "aten::_assert_scalar.default", "aten::_assert_tensor_metadata.default",
    "aten::sym_size.int", "aten::sym_stride.int", "aten::sym_numel.default",
    "aten::sym_storage_offset.default", "aten::sym_constrain_range_for_size.default",
    "aten::sym_constrain_range.default", "aten::_assert_async.msg",
}


def is_infrastructure(op) -> bool:
    return (op is operator.getitem or isinstance(op, torch._ops.HigherOrderOperator)
            or op_name(op) in INFRASTRUCTURE)


def refused_nodes(gm: torch.fx.GraphModule, accepts) -> list[torch.fx.Node]:
    """The op nodes of ``gm`` whose op ``accepts(op)`` rejects (plumbing excluded)."""
    return [node for node in op_nodes(gm) if not is_infrastructure(node.target) and not accepts(node.target)]


def outside(gm: torch.fx.GraphModule, accepts) -> dict[str, int]:
    """op name -> number of call sites, for ops ``accepts(op)`` rejects (plumbing excluded)."""
    out: dict[str, int] = {}
    for node in refused_nodes(gm, accepts):
        name = op_name(node.target)
        out[name] = out.get(name, 0) + 1
    return dict(sorted(out.items()))


def origin_node(node: torch.fx.Node, source_nodes: dict[str, torch.fx.Node]):
    """The node of the undecomposed program that ``node`` was created from, if recorded."""
    for src in node.meta.get("from_node") or []:
        while getattr(src, "from_node", None):
            src = src.from_node[0]
        found = source_nodes.get(getattr(src, "name", None))
        if found is not None:
            return found
    return None


def _routes(name: str, lowered_gm, source_gm, table: dict, stop):
    """(origin node, its decomposition paths down to op ``name``; None when the program calls ``name``
    itself) for each distinct op of the undecomposed program a call of ``name`` was created from."""
    source_nodes = {n.name: n for n in op_nodes(source_gm)}
    seen = set()
    for node in op_nodes(lowered_gm):
        if op_name(node.target) != name:
            continue
        origin = origin_node(node, source_nodes) or source_nodes.get(node.name)
        if origin is None or origin.target in seen:
            continue
        seen.add(origin.target)
        if op_name(origin.target) == name:
            yield origin, None
        else:
            yield origin, routes.paths_to(routes.tree_for_node(origin, table, stop), name)


def route_lines(name: str, lowered_gm, source_gm, table: dict, stop) -> list[str]:
    """How op ``name`` ended up in the lowered program: the decomposition paths that emit it."""
    lines = []
    for origin, paths in _routes(name, lowered_gm, source_gm, table, stop):
        if paths is None:
            lines.append(f"{name} is called by the program itself (node {origin.name})")
            continue
        for path in paths[:3]:
            lines.append(" -> ".join(path) + f"  (from node {origin.name})")
        if not paths:
            lines.append(f"{op_name(origin.target)} -> ... -> {name}  (from node {origin.name})")
    return lines


def support_hint(names, lowered_gm, source_gm, table: dict, stop) -> str:
    """What an OpsetError says to add to supported_ops for ops ``names`` outside it: for a prims op that
    only decompositions of ATen ops emit, those ATen ops (what a backend implements: kept whole, they
    emit no prims op)."""
    instead = {}
    for name in names:
        above = set()
        for _, paths in (_routes(name, lowered_gm, source_gm, table, stop) if name.startswith("prims::") else ()):
            above.update(next((o for o in reversed(p[:-1]) if o.startswith("aten::")), None) for p in paths or [()])
        if above and None not in above:
            instead[name] = sorted(above)
    if not instead:
        return "Add them to supported_ops"
    return ("Add them to supported_ops (rather than a prims op, the ATen op whose decomposition emits it: "
            + "; ".join(f"{', '.join(ops)} for {name}" for name, ops in instead.items()) + ")")
