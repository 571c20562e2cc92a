"""The runtime assertions a lowered program holds (torch._check, torch._check_tensor_all, size ranges):
what each checks, and whether the backend runs it, drops it, or the declared input ranges prove it."""

from __future__ import annotations

import copy
import dataclasses

import sympy
import torch

from ..graph_walk import walk_graphs
from ..ops import op_name

__all__ = ["RuntimeAssertion", "runtime_assertions", "ASSERTION_OPS", "PROVED"]

# The ops torch records for a runtime assertion (and their functionalized forms): nothing reads
# what they return, they stop a run whose values break the check.
ASSERTION_OPS = frozenset({
    "aten::_assert_scalar.default", "aten::_functional_assert_scalar.default",
    "aten::_assert_async.default", "aten::_assert_async.msg", "aten::_functional_assert_async.msg",
    "aten::sym_constrain_range.default", "aten::_functional_sym_constrain_range.default",
    "aten::sym_constrain_range_for_size.default", "aten::_functional_sym_constrain_range_for_size.default",
    "aten::_assert_tensor_metadata.default",
})

PROVED = "proved for the declared input ranges"
KEPT = "kept"


@dataclasses.dataclass(frozen=True)
class RuntimeAssertion:
    """One runtime assertion of a lowered program: its node (``branch.node`` inside a control-flow
    subgraph), op, message as the graph records it, what it checks, and what becomes of it (``fate``)."""

    node: str
    op: str
    message: str
    checks: str
    fate: str

    def describe(self) -> str:
        message = f" ({self.message!r})" if self.message else ""
        return f"{self.node}: {self.checks} -- {self.fate}{message}"


def _arguments(node: torch.fx.Node) -> dict:
    names = [a.name for a in node.target._schema.arguments]
    return {**dict(zip(names, node.args)), **node.kwargs}


def _expr(value):
    """The sympy expression of a graph value (a node holding a SymInt/SymBool, or a constant), or None."""
    if isinstance(value, torch.fx.Node):
        value = value.meta.get("val")
    if isinstance(value, (torch.SymInt, torch.SymBool, torch.SymFloat)):
        return value.node.expr
    if isinstance(value, (bool, int)):
        return sympy.sympify(value)
    return None


def _condition(node: torch.fx.Node) -> tuple[str, object]:
    """(what the assertion checks, in words or as torch's sympy expression; that expression, or None
    where the check is on a tensor's values or metadata and not an expression of sizes)."""
    args = _arguments(node)
    base = op_name(node.target).removeprefix("aten::").removeprefix("_functional").split(".")[0]
    if base == "_assert_scalar":
        expr = _expr(args["self"])
        return (str(expr) if expr is not None else str(args["self"])), expr
    if base == "_assert_async":
        tensor = args["self"]
        return f"the value of {getattr(tensor, 'name', tensor)} is nonzero", None
    if base in ("sym_constrain_range", "sym_constrain_range_for_size"):
        expr = _expr(args["size"])
        low = args.get("min")
        low = 0 if low is None and base.endswith("_for_size") else low
        high = args.get("max")
        if expr is None:
            return f"{args['size']} in [{low}, {high}]", None
        bounds = [b for b in (expr >= low if low is not None else None, expr <= high if high is not None else None)
                  if b is not None]
        both = sympy.And(*bounds) if bounds else sympy.true
        return str(both), both
    tensor = args["a"]
    given = ", ".join(f"{k} {args[k]}" for k in ("size", "stride", "dtype", "device", "layout")
                      if args.get(k) is not None)
    return f"{getattr(tensor, 'name', tensor)} has {given or 'its recorded metadata'}", None


def _input_ranges(ep: torch.export.ExportedProgram) -> dict:
    """symbol -> its declared range, for the symbols of the program's inputs (their sizes, strides,
    offsets and symbolic numbers): the ranges the program checks its inputs against. A symbol read
    from data (an unbacked u0) has none here: its recorded range is what the assertions themselves
    establish, so proving an assertion from it would prove the assertion from itself."""
    symbols = set()
    for node in ep.graph.nodes:
        if node.op != "placeholder":
            continue
        val = node.meta.get("val")
        sizes = [*val.shape, *val.stride(), val.storage_offset()] if isinstance(val, torch.Tensor) else [val]
        for size in sizes:
            expr = _expr(size) if not isinstance(size, (bool, int)) else None
            if expr is not None:
                symbols |= expr.free_symbols
    return {s: r for s, r in ep.range_constraints.items() if s in symbols}


def _proved(expr, ranges: dict) -> bool:
    """Whether ``expr`` is true for every value of its symbols: an input's within its declared range
    (``ranges``), any other (read from data) whatever its value. False where torch's value-range
    analysis cannot settle it."""
    from .._torch.symbolic import ValueRanges, bound_sympy

    if expr is None:
        return False
    if expr in (sympy.true, sympy.false):
        return expr is sympy.true
    if not isinstance(expr, sympy.Basic) or not expr.free_symbols:
        return False
    given = {s: ranges[s] if s in ranges else ValueRanges.unknown_int() if s.is_integer else ValueRanges.unknown()
             for s in expr.free_symbols}
    try:
        bound = bound_sympy(expr, given)
    except Exception:  # noqa: BLE001 (an expression the analysis cannot bound is not proved)
        return False
    return bound.lower is sympy.true and bound.upper is sympy.true


def _onnx_dropped(gm: torch.fx.GraphModule) -> set[str]:
    """The assertion nodes torch.onnx's own pass erases before translating (run on a copy)."""
    from .._torch.compilers import onnx_assertion_pass

    before = {f"{prefix}{n.name}" for prefix, g in walk_graphs(gm) for n in g.graph.nodes}
    copied = copy.deepcopy(gm)
    onnx_assertion_pass()(copied)
    return before - {f"{prefix}{n.name}" for prefix, g in walk_graphs(copied) for n in g.graph.nodes}


def _fates(gm: torch.fx.GraphModule, backend: str | None, nodes: list[str]) -> dict[str, str]:
    """node -> what ``backend`` makes of the assertion, from what each converter does with them:
    torch.onnx erases them with its own pass (ONNX has no op that stops a run); OpenVINO has none
    either (its decoder skips _assert_async, and its model holds only what its results read);
    Inductor generates code that raises for each; the lowered program itself runs them."""
    if backend is None or backend == "inductor":
        return dict.fromkeys(nodes, KEPT)
    if backend == "onnx":
        dropped = _onnx_dropped(gm)
        return {n: "dropped by onnx's converter" if n in dropped else "handed to onnx as it is" for n in nodes}
    if backend == "openvino":
        return dict.fromkeys(nodes, "dropped by openvino's converter")
    return dict.fromkeys(nodes, f"handed to {backend} as it is (what {backend} does with it is not known to pt2b)")


def runtime_assertions(ep: torch.export.ExportedProgram, backend: str | None = None) -> list[RuntimeAssertion]:
    """Every runtime assertion of ``ep`` (a lowered program; control-flow subgraphs included), in graph
    order, with what becomes of it for ``backend`` (a backend's name, or None: the lowered program run
    as it is): proved for the declared input ranges where the ranges of the program's input sizes
    imply it, else kept, or dropped by the backend's converter."""
    found = [(f"{prefix}{n.name}", n) for prefix, g in walk_graphs(ep.graph_module) for n in g.graph.nodes
             if n.op == "call_function" and isinstance(n.target, torch._ops.OpOverload)
             and op_name(n.target) in ASSERTION_OPS]
    if not found:
        return []
    ranges = _input_ranges(ep)
    fates = _fates(ep.graph_module, backend, [name for name, _ in found])
    out = []
    for name, node in found:
        checks, expr = _condition(node)
        message = _arguments(node).get("assert_msg") or ""
        fate = PROVED if _proved(expr, ranges) else fates[name]
        out.append(RuntimeAssertion(name, op_name(node.target), str(message), checks, fate))
    return out
