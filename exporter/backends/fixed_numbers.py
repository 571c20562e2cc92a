"""A number the program reads from a tensor it fixes, handed to a backend as the number itself.

Mimi's and Pocket TTS's convolutions keep their padding, kernel size and stride in buffers and read
them with ``.item()``: each read is a symbol torch.export knows nothing of (an unbacked SymInt), and
every size computed from it is an expression of such symbols. AOTInductor folds the 0-d buffer to a
constant and then cannot read it ("AssertionError: <class 'torch._inductor.ir.Constant'>"), and
ExecuTorch cannot decide a guard on the expressions ("Could not guard on data-dependent expression
u102 + u252 + 16 < 1"). The value is fixed: the buffer is never written, and the ops between it and
the read are deterministic (fold.fixed_value). The backend gets the number in place of the read, and
its sizes are numbers again."""

from __future__ import annotations

import torch
import torch.fx

from ..lowering.fold import fixed_tensors, fixed_value
from ..mutation import is_mutating
from .program_copy import graph_copy, program_with

__all__ = ["fixed_numbers_read"]

_READS = (torch.ops.aten._local_scalar_dense.default, torch.ops.aten.item.default)


def fixed_numbers_read(ep: torch.export.ExportedProgram) -> torch.export.ExportedProgram:
    """``ep`` with each read of a number (``_local_scalar_dense``, ``item``) whose tensor the program
    fixes replaced by that number, on a copy of its graph; ``ep`` itself where there is none, or where
    the program writes anything in place (a buffer written through a view is not told apart)."""
    reads = [n for n in ep.graph.nodes if n.op == "call_function" and n.target in _READS]
    if not reads or any(n.op == "call_function" and is_mutating(n.target) for n in ep.graph.nodes):
        return ep
    fixed = fixed_tensors(ep, unwritten_buffers=True)
    gm = graph_copy(ep)
    memo: dict = {}
    changed = False
    for node in [n for n in gm.graph.nodes if n.op == "call_function" and n.target in _READS]:
        value = fixed_value(node, fixed, memo)
        if not isinstance(value, (int, float, bool)):
            continue
        for user in list(node.users):
            user.args = torch.fx.node.map_arg(user.args, lambda a, node=node, value=value: value if a is node else a)
            user.kwargs = torch.fx.node.map_arg(user.kwargs, lambda a, node=node, value=value: value if a is node else a)
        changed = True
    if not changed:
        return ep
    gm.graph.eliminate_dead_code()
    gm.recompile()
    return program_with(ep, gm)
