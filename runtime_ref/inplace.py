"""Reuse a dying intermediate's memory: an elementwise step whose first input dies at that step runs in
place (`x.add_(y)` for `add(x, y)`), saving an allocation per op where per-op overhead dominates.
Values stay bit-identical: the same kernel writes into the input. ``plan_in_place`` has the conditions;
docs/architecture.md#run-runtime_refruntime the runtime's contract."""

from __future__ import annotations

import torch

from exporter._torch.dispatch import OpOverload

from .bindings import TensorSpec
from .nodes import NODES

__all__ = ["IN_PLACE", "plan_in_place"]

_aten = torch.ops.aten
IN_PLACE = {
    _aten.add.Tensor: torch.Tensor.add_,
    _aten.sub.Tensor: torch.Tensor.sub_,
    _aten.mul.Tensor: torch.Tensor.mul_,
    _aten.div.Tensor: torch.Tensor.div_,
    _aten.relu.default: torch.Tensor.relu_,
    _aten.sigmoid.default: torch.Tensor.sigmoid_,
    _aten.tanh.default: torch.Tensor.tanh_,
    _aten.neg.default: torch.Tensor.neg_,
    _aten.exp.default: torch.Tensor.exp_,
}


def _fresh(target) -> bool:
    """Whether an operator's result is a new tensor (a single return with no alias annotation)."""
    if not isinstance(target, OpOverload):
        return False
    rets = target._schema.returns
    return len(rets) == 1 and rets[0].alias_info is None and isinstance(rets[0].type, torch._C.TensorType)


def _aliases_inputs(target) -> bool:
    """Whether a step's result may share memory with its inputs (conservative for non-operators)."""
    if not isinstance(target, OpOverload):
        return True
    return any(r.alias_info is not None for r in target._schema.returns)


def _layout(v):
    """(dtype, device, shape, strides) of a recorded strided tensor (a TensorSpec is one), else None."""
    if type(v) is TensorSpec:
        return v.dtype, v.device, [str(d) for d in v.shape], [str(s) for s in v.stride]
    if isinstance(v, torch.Tensor) and v.layout == torch.strided:
        return v.dtype, v.device, [str(d) for d in v.shape], [str(s) for s in v.stride()]
    return None


def _same_layout(a, b) -> bool:
    la = _layout(a)
    return la is not None and la == _layout(b)


def plan_in_place(step_nodes: list, outs: list, reads: list, slot_of: dict, n_user: int,
                  last_use: dict, skip=frozenset()) -> dict[int, object]:
    """step index -> in-place callable for the steps that may run in place, decided once at planning time.

    A step runs in place only when all of this holds:
    - its op is in IN_PLACE (elementwise, same-named in-place variant with the same arguments);
    - the first input is an intermediate produced by an operator whose schema returns a fresh tensor
      (not a user input, constant, state, view, tuple element or higher-order-op result), is not a graph
      output, is read nowhere else in the step, and dies at this step;
    - no alias of it is alive: every value that may alias it (the output of a view op, or of any
      non-operator step reading it) died before this step;
    - the recorded output has the input's dtype, device, shape and strides (so no promotion, no
      broadcasting of the first input, no layout change);
    - it does not run inside an autocast region (`skip`): autocast may cast the functional op's inputs,
      never the in-place variant's.

    step_nodes[k]: the fx node of step k; outs[k]: its output slot; reads[k]: slots it reads;
    last_use: slot -> step after which it is dead (slots absent from it never die: outputs, state);
    skip: indices of steps that must not run in place (inside autocast regions).
    """
    fresh: set[int] = set()
    never = len(step_nodes)
    classes = _AliasClasses(lambda m: last_use.get(m, never))
    chosen: dict[int, object] = {}
    for k, node in enumerate(step_nodes):
        target, out = node.target, outs[k]
        fn = IN_PLACE.get(target)
        first = node.args[0] if node.args else None
        if fn is not None and isinstance(first, NODES) and k not in skip:
            s = slot_of[first]
            others = [a for a in (*node.args[1:], *node.kwargs.values()) if a is first]
            if (s in fresh and s >= n_user and last_use.get(s) == k and not others
                    and classes.others_die_before(s, k)
                    and _same_layout(first.meta.get("val"), node.meta.get("val"))):
                chosen[k] = fn
        if _fresh(target):
            fresh.add(out)
        if _aliases_inputs(target):
            for r in reads[k]:
                classes.join(out, r)
    return chosen


class _AliasClasses:
    """Slots that may share memory, as classes closed under "may alias" (union-find), each class
    keeping its two latest-dying members: whether every other member of a slot's class is dead by a
    step is then one comparison, however large the class (a walk over the class's members would make
    planning quadratic in the program's length)."""

    def __init__(self, dies_at):
        self._dies_at = dies_at
        self._parent: dict[int, int] = {}
        self._last: dict[int, list] = {}  # root -> up to two (step it dies after, slot), latest first

    def _root(self, m: int) -> int:
        parent = self._parent
        if m not in parent:
            parent[m] = m
            self._last[m] = [(self._dies_at(m), m)]
            return m
        root = m
        while parent[root] != root:
            root = parent[root]
        while parent[m] != root:
            parent[m], m = root, parent[m]
        return root

    def join(self, a: int, b: int) -> None:
        ra, rb = self._root(a), self._root(b)
        if ra != rb:
            self._parent[rb] = ra
            self._last[ra] = sorted(self._last[ra] + self._last.pop(rb), reverse=True)[:2]

    def others_die_before(self, s: int, k: int) -> bool:
        """Whether every slot other than s that may alias s dies before step k."""
        if s not in self._parent:
            return True
        others = [lu for lu, m in self._last[self._root(s)] if m != s]
        return not others or others[0] < k
