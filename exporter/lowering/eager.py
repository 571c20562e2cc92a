"""Eager-mode decompositions: run ordinary PyTorch code with every op outside a backend's opset
decomposed on the fly, recursively, so that only supported ops reach the kernels
(``with exporter.eager_decompositions(preset="core") as mode: y = model(x)``; ``mode.decomposed``,
``mode.unsupported``). A thread-local TorchDispatchMode; how and what it costs: docs/lowering.md#eager-mode."""

from __future__ import annotations

import collections
import contextlib

import torch
from torch.overrides import TorchFunctionMode

from .._torch import eager_hops
from .._torch.dispatch import TorchDispatchMode
from ..mutation import functional_variant
from ..ops import op_name
from .plan import LoweringPlan

# Ops that only move or describe data; no decomposition can remove them from eager execution.
_ALWAYS = {"aten::copy_.default", "aten::_local_scalar_dense.default", "aten::detach.default",
           "aten::lift_fresh.default", "aten::_to_copy.default", "aten::empty.memory_format",
           "aten::empty_strided.default", "aten::resize_.default", "aten::set_.source_Storage",
           "aten::set_.source_Storage_storage_offset"}


class EagerDecompositions(TorchDispatchMode):
    """The dispatch mode of eager_decompositions: runs each op as is when the lowering keeps it, else
    its decomposition; counts what it did in ``decomposed``, ``unsupported`` and ``ran``."""

    def __init__(self, plan: LoweringPlan):
        super().__init__()
        self.plan = plan  # (plan.plan_lowering, or exporter.request.plan_request from the user's words)
        self._decision: dict = {}
        self._active: set = set()  # ops being decomposed right now (a decomposition may call its own op)
        self.decomposed: collections.Counter = collections.Counter()
        self.unsupported: collections.Counter = collections.Counter()
        self.ran: collections.Counter = collections.Counter()

    def runs_as_is(self, func: torch._ops.OpOverload) -> bool:
        """Accepted by the opset, or plumbing: data movement (_ALWAYS), in-place view metadata
        changes (transpose_) and allocations."""
        name = op_name(func)
        return name in _ALWAYS or self.plan.accepts(func) or (
            isinstance(func, torch._ops.OpOverload) and (torch.Tag.inplace_view in func.tags
                                                         or name.startswith("aten::empty")))

    def _decide(self, func):
        d = self._decision.get(func)
        if d is None:
            from .._torch.tracing import decomposition_table

            name = op_name(func)
            twin = functional_variant(func) if isinstance(func, torch._ops.OpOverload) else None
            if self.runs_as_is(func):
                d = ("run", None)
            elif func in self.plan.table:
                d = ("decompose", self.plan.table[func])
            elif isinstance(func, torch._ops.OpOverload) and torch._C._dispatch_has_kernel_for_dispatch_key(
                    func.name(), "CompositeImplicitAutograd"):
                d = ("decompose", func.decompose)  # called from inside a decomposition: its own CIA kernel
            elif twin is not None:  # in place: the functional op (itself decomposed if need be), then copy_
                d = ("decompose", lambda self_, *a, **k: self_.copy_(twin(self_, *a, **k)))
            elif func in decomposition_table and name not in self.plan.withheld:
                d = ("decompose", decomposition_table[func])  # eager needs no functional graph
            elif func.namespace == "prims" and getattr(getattr(torch._prims, func._opname, None), "impl_aten", None):
                # a prim that a reference decomposition emitted: its ATen implementation, through the mode
                d = ("decompose", getattr(torch._prims, func._opname).impl_aten)
            else:
                d = ("unsupported", None)
            self._decision[func] = d
        return d

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        action, fn = self._decide(func)
        if action == "decompose" and func not in self._active:  # (an op inside its own decomposition runs)
            self._active.add(func)
            try:
                with self:  # the ops the decomposition calls come back here, recursively
                    out = fn(*args, **kwargs)
            finally:
                self._active.discard(func)
            if out is not NotImplemented:  # a decomposition may decline an input
                self.decomposed[op_name(func)] += 1
                return out
        if action == "decompose":
            action = "unsupported"
        if action == "unsupported":
            self.unsupported[op_name(func)] += 1
        else:
            self.ran[op_name(func)] += 1
        return func(*args, **kwargs)


class _NoFastPaths(TorchFunctionMode):
    """Passes every call through. Being active makes torch.overrides.has_torch_function() true, which
    is what nn modules check before taking fused fast paths (TransformerEncoderLayer's
    _transformer_encoder_layer_fwd, which has no decomposition): they take their op-by-op path."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


class EagerContext:
    """``with eager_decompositions(...) as mode``: enters eager_hops.eager, _NoFastPaths and the dispatch
    mode (in that order), leaves all three (also on exceptions); re-enterable; yields the
    EagerDecompositions."""

    def __init__(self, mode: EagerDecompositions):
        self.mode = mode
        self._stack: list = []

    def __enter__(self) -> EagerDecompositions:
        """Enter the mode; returns it, to read its counters after the block."""
        guards = contextlib.ExitStack()
        with guards:
            guards.enter_context(eager_hops.eager())  # control flow runs its rule below, not through dynamo
            guards.enter_context(_NoFastPaths())
            guards.enter_context(self.mode)
            self._stack.append(guards.pop_all())
        return self.mode

    def __exit__(self, *exc):
        self._stack.pop().__exit__(*exc)
        return False


# Higher-order ops ask each mode for a rule; these run the branches / bodies with the mode active
# so that their ops are decomposed too (the rules are keyed by this class: nothing else changes).
def _register_hop_rules():
    from .._torch.tracing import cond_op, map_dense, map_impl, while_loop_dense, while_loop_op

    @cond_op.py_impl(EagerDecompositions)
    def _cond(mode, pred, true_fn, false_fn, operands):
        with mode:
            return true_fn(*operands) if bool(pred) else false_fn(*operands)

    @map_impl.py_impl(EagerDecompositions)
    def _map(mode, f, xs, pos_args):
        with mode:
            return map_dense(f, xs, pos_args)

    @while_loop_op.py_impl(EagerDecompositions)
    def _while(mode, cond_fn, body_fn, carried_inputs, additional_inputs, *rest, **kwargs):
        with mode:
            return while_loop_dense(cond_fn, body_fn, carried_inputs, additional_inputs, *rest, **kwargs)


_register_hop_rules()
