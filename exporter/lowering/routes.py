"""The "bus route" of a decomposition: which ops an op's decomposition emits, recursively, traced
on the fake values of a real call site (no global state touched: a dispatch-mode recorder)."""

from __future__ import annotations

import torch
import torch.fx

from .._torch.dispatch import TorchDispatchMode, detect_fake_mode
from .._torch.pytree import pytree
from ..ops import op_name

MAX_DEPTH = 12


class _Recorder(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.ops: list = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append((func, args, kwargs or {}))
        return func(*args, **(kwargs or {}))


def _fake_args(node: torch.fx.Node):
    def val(a):
        return a.meta.get("val") if isinstance(a, torch.fx.Node) else a

    return pytree.tree_map(val, node.args), pytree.tree_map(val, node.kwargs)


def emitted(fn, args, kwargs) -> list[tuple]:
    """(op, args, kwargs) of every op ``fn`` calls on fake inputs, in call order."""
    fake_mode = detect_fake_mode(pytree.tree_leaves((args, kwargs)))
    rec = _Recorder()
    try:
        if fake_mode is not None:
            with fake_mode, rec:
                fn(*args, **kwargs)
        else:
            with rec:
                fn(*args, **kwargs)
    except Exception:
        pass  # a route is an explanation: what was traced before the failure is still useful
    # TorchScript "prim::" helpers (prim::device, ...) never appear in an exported graph
    return [(op, a, k) for op, a, k in rec.ops
            if isinstance(op, torch._ops.OpOverload) and op.namespace != "prim"]


def route_tree(op, args, kwargs, table: dict, stop, depth: int = 0) -> dict:
    """{"op": name, "decomposed": bool, "children": [...]}: ops reached from ``op`` with ``table``.
    ``stop(op)`` says an op is acceptable as is (supported/kept)."""
    node = {"op": op_name(op), "decomposed": False, "children": []}
    if stop(op) or op not in table or depth >= MAX_DEPTH:
        return node
    node["decomposed"] = True
    seen = set()
    for child, a, k in emitted(table[op], args, kwargs):
        if child == op or child in seen:
            continue
        seen.add(child)
        node["children"].append(route_tree(child, a, k, table, stop, depth + 1))
    return node


def tree_for_node(node: torch.fx.Node, table: dict, stop) -> dict:
    args, kwargs = _fake_args(node)
    return route_tree(node.target, args, kwargs, table, stop)


def paths_to(tree: dict, target: str, prefix=()) -> list[tuple[str, ...]]:
    """Every path from the root of ``tree`` down to ``target``."""
    here = prefix + (tree["op"],)
    if tree["op"] == target and prefix:
        return [here]
    out = []
    for child in tree["children"]:
        out.extend(paths_to(child, target, here))
    return out


def render(tree: dict, indent: str = "") -> list[str]:
    mark = "decomposed into" if tree["decomposed"] else "stays"
    lines = [f"{indent}{tree['op']}" + (f"  ({mark}:)" if tree["children"] else "")]
    for child in tree["children"]:
        lines.extend(render(child, indent + "  "))
    return lines
