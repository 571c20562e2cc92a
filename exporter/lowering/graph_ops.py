"""What a program calls: op counts over the graph and every subgraph."""

from __future__ import annotations

import collections

import torch

from ..ops import op_name
from ..versioning.op_table import iter_graphs
from ..functionalize import is_mutating

def op_nodes(gm: torch.fx.GraphModule):
    """Every call_function node calling an OpOverload or higher-order op, subgraphs included."""
    for graph in iter_graphs(gm):
        for node in graph.nodes:
            if node.op == "call_function" and isinstance(
                node.target, (torch._ops.OpOverload, torch._ops.HigherOrderOperator)
            ):
                yield node


def op_counts(gm: torch.fx.GraphModule) -> dict[str, int]:
    counts = collections.Counter(op_name(n.target) for n in op_nodes(gm))
    return dict(sorted(counts.items()))


def ops_by_name(gm: torch.fx.GraphModule) -> dict[str, object]:
    return {op_name(n.target): n.target for n in op_nodes(gm)}


def mutating_ops(gm: torch.fx.GraphModule) -> list[str]:
    return sorted({op_name(n.target) for n in op_nodes(gm)
                   if isinstance(n.target, torch._ops.OpOverload) and is_mutating(n.target)})
