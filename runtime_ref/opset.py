"""The reference runtime's opset: which call targets it accepts, how they are named.
Owns the default "functional ATen" predicate, opset normalization and OpsetError reporting (op names
and their spellings: exporter/ops.py, through the shared core exporter/shared/)."""

from __future__ import annotations

import math
import operator
from collections.abc import Callable, Iterable
from typing import Any

import torch

from exporter._torch.dispatch import HigherOrderOperator, OpOverload, OpOverloadPacket
from exporter.errors import OpsetError
from exporter.shared.kernels import missing_kernels
from exporter.shared import (REGION_HOP_NAMES, OpSpec, is_mutating, is_region_marker, normalize_text, op_name,
                             resolve_op, updates_hidden_state, walk_graphs)

__all__ = [
    "op_name",
    "default_opset_accepts",
    "normalize_ops",
    "Acceptor",
    "check_program_ops",
    "check_device_kernels",
]

# quantized_decomposed: the functional (de)quantize and choose_qparams ops torch registers with CPU
# kernels, which PT2E-quantized programs keep after core and max (as torch's own lowering keeps them)
DEFAULT_NAMESPACES = frozenset({"aten", "prims", "quantized_decomposed"})

# Python-level SymInt/SymFloat/SymBool arithmetic as it appears in dynamic-shape graphs.
_SYM_PYTHON = frozenset({
    operator.add, operator.sub, operator.mul, operator.floordiv, operator.truediv, operator.mod,
    operator.pow, operator.neg, operator.pos, operator.abs, operator.eq, operator.ne, operator.lt,
    operator.le, operator.gt, operator.ge, operator.and_, operator.or_, operator.xor, operator.not_,
    operator.invert, operator.lshift, operator.rshift,
    math.ceil, math.floor, math.trunc, math.sqrt,
    torch.sym_float, torch.sym_int, torch.sym_max, torch.sym_min, torch.sym_not, torch.sym_ite,
    torch.sym_sum, torch._sym_sqrt,
})

# Accepted whatever opset is chosen: tuple unpacking, shape queries, runtime assertions, and the
# grad-mode/autocast region markers (exporter/shared/regions.py: torch._C._set_grad_enabled, _enter/_exit_autocast).
_ALWAYS_NAMES = frozenset({
    "aten::sym_size.int", "aten::sym_size.default", "aten::sym_stride.int", "aten::sym_stride.default",
    "aten::sym_numel.default", "aten::sym_storage_offset.default",
    "aten::_assert_scalar.default", "aten::_assert_async.default", "aten::_assert_async.msg",
    "aten::_assert_tensor_metadata.default", "aten::sym_constrain_range.default",
    "aten::sym_constrain_range_for_size.default", "aten::_functional_assert_async.msg",
    "aten::_functional_assert_scalar.default", "aten::_functional_sym_constrain_range.default",
    "aten::_functional_sym_constrain_range_for_size.default",
})

HOP_NAMES = frozenset({"cond", "while_loop", "map_impl", "with_effects"}) | REGION_HOP_NAMES


def _always_accepted(target) -> bool:
    if target is operator.getitem or (getattr(target, "__hash__", None) is not None and target in _SYM_PYTHON):
        return True
    if is_region_marker(target):
        return True
    if isinstance(target, HigherOrderOperator):
        return target.name() in HOP_NAMES
    return isinstance(target, OpOverload) and op_name(target) in _ALWAYS_NAMES


def _resolve(op) -> object:
    """A string op name resolved to its OpOverload (or the object itself)."""
    if not isinstance(op, str):
        return op
    name = normalize_text(op, default_overload=True)
    resolved = resolve_op(name)
    if resolved is None:
        raise ValueError(f"unknown operator {op!r}: the running torch registers no {name}")
    return resolved


def default_opset_accepts(op: OpSpec | Callable[..., Any]) -> bool:
    """Whether the default "functional ATen" opset accepts `op` (an OpOverload, a HOP, a Python
    callable, or a name like "aten::add.Tensor"): functional aten/prims overloads, getitem, SymInt
    arithmetic, runtime assertions, the cond/while_loop/map_impl/with_effects higher-order ops and
    grad-mode/autocast regions (flat markers and the wrap_with_* higher-order ops); the functional
    quantized_decomposed ops too (quantize/dequantize per tensor or channel, choose_qparams)."""
    op = _resolve(op)
    if _always_accepted(op):
        return True
    return isinstance(op, OpOverload) and op.namespace in DEFAULT_NAMESPACES and not is_mutating(op)


def normalize_ops(ops: Iterable) -> frozenset[str]:
    """Canonical names of an iterable of OpOverloads, OpOverloadPackets (all overloads) or strings (an
    overload-less one names the default overload: normalize_text's default_overload)."""
    names = set()
    for op in [ops] if isinstance(ops, (str, OpOverload, OpOverloadPacket)) else ops:
        if isinstance(op, str):
            names.add(normalize_text(op, default_overload=True))
        elif isinstance(op, OpOverloadPacket):
            names.update(op_name(getattr(op, o)) for o in op.overloads())
        elif isinstance(op, (OpOverload, HigherOrderOperator)):
            names.add(op_name(op))
        else:
            raise TypeError(f"opset entries must be OpOverloads or 'ns::op.overload' strings, got {op!r}")
    return frozenset(names)


class Acceptor:
    """Decides, per call target, whether the runtime accepts it."""

    def __init__(self, opset=None, extra_ops=()):
        self.restricted = opset is not None
        self.names = normalize_ops(opset) if opset is not None else frozenset()
        self.extra = normalize_ops(extra_ops)

    def accepts(self, target) -> bool:
        if is_mutating(target):
            return False
        if _always_accepted(target):
            return True
        name = op_name(target)
        if name in self.extra or name in self.names:
            return True
        return not self.restricted and default_opset_accepts(target)

    def describe(self) -> str:
        if self.restricted:
            base = f"the given opset ({len(self.names)} ops)"
        else:
            base = "the default opset (functional aten/prims/quantized_decomposed ops)"
        extra = f" plus extra_ops {sorted(self.extra)}" if self.extra else ""
        return (base + extra + ", getitem, SymInt arithmetic, runtime assertions, cond/while_loop/map_impl/with_effects"
                " and grad-mode/autocast regions")


# ---- graph checks ----

def _offenders(gm: torch.fx.GraphModule, acceptor: Acceptor):
    """{op name: [node paths]} for refused ops and {op name} of those refused for mutating."""
    refused: dict[str, list[str]] = {}
    mutating: set[str] = set()
    for prefix, g in walk_graphs(gm):
        for node in g.graph.nodes:
            name = _refused_name(node, acceptor)
            if name is None:
                continue
            refused.setdefault(name, []).append(prefix + node.name)
            if node.op == "call_function" and (is_mutating(node.target) or updates_hidden_state(node)):
                mutating.add(name)
    return refused, mutating


def _refused_name(node, acceptor: Acceptor) -> str | None:
    if node.op in ("call_module", "call_method"):
        return f"{node.op}:{node.target}"
    if node.op != "call_function":
        return None
    if updates_hidden_state(node):
        return op_name(node.target) + " (training mode, updates running stats)"
    return None if acceptor.accepts(node.target) else op_name(node.target)


def _format(refused, mutating, acceptor: Acceptor) -> str:
    lines = [f"program uses {len(refused)} operator(s) the reference runtime does not accept "
             f"(accepted: {acceptor.describe()}):"]
    for name, nodes in sorted(refused.items()):
        why = " [mutates its inputs]" if name in mutating else ""
        shown = ", ".join(nodes[:8]) + (f", ... ({len(nodes)} nodes)" if len(nodes) > 8 else "")
        lines.append(f"  {name}{why}: used by {shown}")
    if mutating:
        lines.append("The graph still mutates tensors in place: lower/functionalize it first "
                     "(e.g. ep.run_decompositions({}) or pt2b's load_for_backend), then build the Runtime.")
    else:
        lines.append("Decompose these ops to the accepted set, or pass them in extra_ops= (pt2b run: --extra-ops) "
                     "if the runtime should call them as they are.")
    return "\n".join(lines)


def check_program_ops(gm: torch.fx.GraphModule, acceptor: Acceptor) -> None:
    """Raise ONE OpsetError listing every refused op (with the nodes using it) over all subgraphs."""
    refused, mutating = _offenders(gm, acceptor)
    if refused:
        raise OpsetError(_format(refused, mutating, acceptor))


def check_device_kernels(gm: torch.fx.GraphModule, device: torch.device) -> None:
    """Raise ONE OpsetError naming every op the running torch has no kernel of for ``device`` (missing_kernels)."""
    message = missing_kernels(gm, device, "the reference runtime")
    if message:
        raise OpsetError(message)
