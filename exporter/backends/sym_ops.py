"""A program given to a backend that converts only ops (``Backend.takes_ops_only``), its Python calls made
ops or left out:

- ``torch.sym_ite(b, x, y)`` of a bool read from a tensor (``t.item()``), which torch.export records for
  ``torch._check(t.item())`` and transformers' data-dependent checks, becomes ``where(t, x, y).item()``
  (``t.to(int64).item()`` for 1 and 0): the same number, from ops the backend has;
- the flat grad-mode markers (``torch._C._set_grad_enabled``) of a ``no_grad`` region are left out: a
  program run for inference computes the same values in either mode;
- ``a % b`` of integer sizes becomes ``a - (a // b) * b``, Python's own identity for its floor division:
  iree-turbine imports the remainder as ``aten.fmod.int``, which IREE's compiler cannot lower (the
  chunked scans of mamba2, qwen3_5 and olmo_hybrid pad to a multiple: ``(c - L % c) % c``).

ExecuTorch's verifier refuses a Python function in a graph; TVM's and iree-turbine's importers and Core
ML's frontend convert neither call.

torch-mlir's FX importer (iree-turbine's copy of it) converts a Python comparison only where its value is
an expression, and no ``sym_not``, ``&`` or ``|`` at all. For those two backends (``FX_IMPORTER_REPAIRS``,
applied to the program as they are given it: a retrace in between asserts the shape environment's
deferred checks anew, as Python calls):

- a Python call on numbers whose value the program fixes (``1536 >= 1536``, or ``ite >= 0`` of an
  ``ite`` of 1 and 0: its value is a plain number, not an expression) is that number, and a runtime
  assertion of a fixed True is left out: the program's own shape reasoning proves it for every call it
  accepts (omniasr's checks on a width made static, the range of every ``sym_ite`` above);
- a runtime assertion of a condition built with ``torch.sym_not``, ``&`` or ``|`` (torch's checks on a
  count read from data: ``u0 != 0``, ``Eq(u0, 0) | (u0 > 0)``, smolvlm's and idefics' image rows) is
  computed by ops on 0-d tensors (``logical_not``/``and``/``or`` of the comparisons), read back as 0 or 1
  and asserted equal to 1: the same check, run where it was. ExecuTorch maps these calls to prim ops of
  its own (``_PYTHON_SYM_OPS_TO_EXECUTORCH_SYM_OPS``) and is given them as they are.
"""

from __future__ import annotations

import operator

import torch
import torch.fx

from .._torch.compat import with_tensor_meta
from ..functionalize import program_fake_mode
from ..lowering.fold import NUMBER_CALLS
from ..shared.regions import is_grad_marker
from .program_copy import emitted, graph_copy, program_with

__all__ = ["FX_IMPORTER_REPAIRS", "ops_only"]

_READS = (torch.ops.aten.item.default, torch.ops.aten._local_scalar_dense.default)


def _ite_of_value(node: torch.fx.Node) -> bool:
    """A sym_ite choosing between two literal numbers by a bool read from a tensor."""
    if node.op != "call_function" or node.target is not torch.sym_ite or len(node.args) != 3:
        return False
    cond, a, b = node.args
    return (isinstance(cond, torch.fx.Node) and cond.target in _READS and isinstance(a, (int, float))
            and isinstance(b, (int, float)) and type(a) is type(b))


def _integer_remainder(node: torch.fx.Node) -> bool:
    """``a % b`` of two integers (sizes, or a size and a literal)."""
    return (node.op == "call_function" and node.target is operator.mod
            and isinstance(node.meta.get("val"), (int, torch.SymInt))
            and all(isinstance(a.meta.get("val") if isinstance(a, torch.fx.Node) else a, (int, torch.SymInt))
                    for a in node.args))


_NUMBERS = (int, float, bool)
_ASSERT = torch.ops.aten._assert_scalar.default
_LOGIC = {torch.sym_not: torch.ops.aten.logical_not.default, operator.not_: torch.ops.aten.logical_not.default,
          operator.and_: torch.ops.aten.logical_and.default, operator.or_: torch.ops.aten.logical_or.default}
_COMPARED = {operator.lt: torch.ops.aten.lt.Tensor, operator.le: torch.ops.aten.le.Tensor,
             operator.gt: torch.ops.aten.gt.Tensor, operator.ge: torch.ops.aten.ge.Tensor,
             operator.eq: torch.ops.aten.eq.Tensor, operator.ne: torch.ops.aten.ne.Tensor}


def _fixed_number(node: torch.fx.Node) -> bool:
    """A Python call on numbers whose value is a plain number (the program's shapes fix it), which the
    program does not return (its signature names the node it returns)."""
    return (node.op == "call_function" and node.target in NUMBER_CALLS
            and type(node.meta.get("val")) in _NUMBERS and all(u.op != "output" for u in node.users))


def _given(graph: torch.fx.Graph, node: torch.fx.Node) -> None:
    """``node`` (a _fixed_number) replaced by its number where it is read."""
    value = node.meta["val"]
    for user in list(node.users):
        user.args, user.kwargs = torch.fx.node.map_arg((user.args, user.kwargs), lambda a: value if a is node else a)
    _unused_left_out(graph, [node])


def _asserts_true(node: torch.fx.Node) -> bool:
    """A runtime assertion of True, or of a _fixed_number that is True."""
    if node.op != "call_function" or node.target is not _ASSERT or not node.args:
        return False
    cond = node.args[0]
    return cond is True or (isinstance(cond, torch.fx.Node) and _fixed_number(cond) and cond.meta["val"] is True)


def _left_out(graph: torch.fx.Graph, node: torch.fx.Node) -> None:
    cond = node.args[0]
    graph.erase_node(node)
    _unused_left_out(graph, [cond])


def _assertion_of_logic(node: torch.fx.Node) -> bool:
    """A runtime assertion of a condition built with sym_not, and_ or or_ (of comparisons)."""
    return (node.op == "call_function" and node.target is _ASSERT and bool(node.args)
            and isinstance(node.args[0], torch.fx.Node) and node.args[0].target in _LOGIC
            and isinstance(node.args[0].meta.get("val"), torch.SymBool))


def _as_tensor(graph: torch.fx.Graph, value, fake_mode) -> torch.fx.Node:
    """A 0-d tensor holding ``value`` (a node of a number, or a number): a condition of _LOGIC and
    _COMPARED calls as those ops on 0-d tensors, a bool read from a one-element tensor as that tensor,
    any other number as a scalar_tensor of it (int64, float64 or bool as its kind)."""
    if isinstance(value, torch.fx.Node) and value.target in _LOGIC:
        return emitted(graph, _LOGIC[value.target], *(_as_tensor(graph, a, fake_mode) for a in value.args))
    if isinstance(value, torch.fx.Node) and value.target in _COMPARED:
        return emitted(graph, _COMPARED[value.target], *(_as_tensor(graph, a, fake_mode) for a in value.args))
    if isinstance(value, torch.fx.Node) and value.target in _READS and value.args[0].meta["val"].numel() == 1:
        return emitted(graph, torch.ops.aten.view.default, value.args[0], [])
    kind = value.meta["val"] if isinstance(value, torch.fx.Node) else value
    dtype = (torch.bool if isinstance(kind, (bool, torch.SymBool)) else
             torch.float64 if isinstance(kind, (float, torch.SymFloat)) else torch.int64)
    return emitted(graph, torch.ops.aten.scalar_tensor.default, value, dtype=dtype, fake_mode=fake_mode)


def _asserted_by_ops(graph: torch.fx.Graph, node: torch.fx.Node) -> None:
    """The assertion ``node`` of a _LOGIC condition made ``_assert_scalar(item(int64(cond)) == 1)``, cond
    computed by _as_tensor; the Python calls only the old condition read are left out."""
    cond = node.args[0]
    fake_mode = program_fake_mode(graph.owning_module)
    made = _as_tensor(graph, cond, fake_mode)
    number = emitted(graph, torch.ops.aten._to_copy.default, made, dtype=torch.int64)
    read = graph.call_function(torch.ops.aten._local_scalar_dense.default, (number,))
    read.meta["val"] = torch.sym_ite(cond.meta["val"], 1, 0)
    holds = graph.call_function(operator.eq, (read, 1))
    holds.meta["val"] = read.meta["val"] == 1
    node.args = (holds, *node.args[1:])
    _unused_left_out(graph, [cond])


def _unused_left_out(graph: torch.fx.Graph, nodes: list) -> None:
    """Each of ``nodes`` that nothing reads any more, a Python call on numbers, erased, and in turn the
    Python calls only it read."""
    while nodes:
        n = nodes.pop()
        if isinstance(n, torch.fx.Node) and not n.users and n.op == "call_function" and n.target in NUMBER_CALLS:
            nodes.extend(n.all_input_nodes)
            graph.erase_node(n)


# what torch-mlir's FX importer (iree-turbine's copy of it) cannot take, as (needs, repair) pairs for
# program_copy.nodes_repaired, in graph order: fixed numbers given, assertions of True left out, the
# others' sym_not/and_/or_ computed by ops
FX_IMPORTER_REPAIRS = ((_fixed_number, _given), (_asserts_true, _left_out), (_assertion_of_logic, _asserted_by_ops))


def ops_only(ep: torch.export.ExportedProgram) -> torch.export.ExportedProgram:
    """``ep`` with each such sym_ite made ``where(t, x, y).item()`` (1 and 0: ``t.to(int64).item()``), its
    grad-mode markers left out and its integer remainders made floor divisions; ``ep`` itself where it has
    none (it is never changed)."""
    if not any(_ite_of_value(n) or is_grad_marker(n.target) or _integer_remainder(n) for n in ep.graph.nodes):
        return ep
    gm = graph_copy(ep)
    graph = gm.graph
    for node in [n for n in graph.nodes if _integer_remainder(n)]:
        a, b = node.args
        value = lambda x: x.meta["val"] if isinstance(x, torch.fx.Node) else x  # noqa: E731
        with graph.inserting_before(node):
            quotient = graph.call_function(operator.floordiv, (a, b))
            quotient.meta["val"] = value(a) // value(b)
            product = graph.call_function(operator.mul, (quotient, b))
            product.meta["val"] = quotient.meta["val"] * value(b)
            rest = graph.call_function(operator.sub, (a, product))
            rest.meta["val"] = node.meta["val"]
        node.replace_all_uses_with(rest)
        graph.erase_node(node)
    for node in [n for n in graph.nodes if n.op == "call_function" and is_grad_marker(n.target)]:
        if not node.users:
            graph.erase_node(node)
    for node in [n for n in graph.nodes if _ite_of_value(n)]:
        (read, a, b), t = node.args, node.args[0].args[0]
        with graph.inserting_before(node):
            if (a, b) == (1, 0) and type(a) is int:  # (the bool as a number: a cast, which more converters take)
                chosen = graph.call_function(torch.ops.aten._to_copy.default, (t,), {"dtype": torch.int64})
            else:
                chosen = graph.call_function(torch.ops.aten.where.Scalar, (t, a, b))
            chosen.meta["val"] = chosen.target(t.meta["val"], *chosen.args[1:], **chosen.kwargs)
            value = graph.call_function(torch.ops.aten._local_scalar_dense.default, (chosen,))
            value.meta["val"] = node.meta["val"]
        node.replace_all_uses_with(value)
        graph.erase_node(node)
        if not read.users:
            graph.erase_node(read)
    with_tensor_meta(gm)  # (torch-mlir's importer, IREE's, reads a tensor's dtype there)
    gm.recompile()
    return program_with(ep, gm)
