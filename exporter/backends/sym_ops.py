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
ML's frontend convert neither call."""

from __future__ import annotations

import operator

import torch
import torch.fx

from .._torch.compat import with_tensor_meta
from ..shared.regions import is_grad_marker
from .program_copy import graph_copy, program_with

__all__ = ["ops_only"]

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
