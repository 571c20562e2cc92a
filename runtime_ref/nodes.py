"""The nodes a plan is made from: torch.fx nodes of a built program, or TableNodes read straight
from an artifact's graph table (table_program.py); the planner reads both alike."""

from __future__ import annotations

import torch.fx

__all__ = ["NODES", "TableNode"]


_NONE = object()  # no recorded value


class TableNode:
    """What the planner reads of an fx node: name, op, target, args, kwargs and meta["val"] (a
    bindings.TensorSpec for a tensor, a constant input's recorded value; none for a SymInt result)."""

    __slots__ = ("name", "op", "target", "args", "kwargs", "meta")

    def __init__(self, name: str, op: str, target, args=(), kwargs=None, val=_NONE):
        self.name, self.op, self.target, self.args = name, op, target, args
        self.kwargs = kwargs if kwargs is not None else {}
        self.meta = {} if val is _NONE else {"val": val}  # (a constant input's recorded value may be None)

    def __repr__(self) -> str:
        return f"TableNode({self.name}: {self.op} {self.target})"


NODES = (torch.fx.Node, TableNode)
