"""What a program calls: its op nodes and their counts over the graph and every subgraph."""

from __future__ import annotations

import torch

from ..graph_walk import count_calls, iter_graphs


def op_nodes(gm: torch.fx.GraphModule):
    """Every call_function node calling an OpOverload or higher-order op, subgraphs included."""
    for graph in iter_graphs(gm):
        for node in graph.nodes:
            if node.op == "call_function" and isinstance(
                node.target, (torch._ops.OpOverload, torch._ops.HigherOrderOperator)
            ):
                yield node


def op_counts(gm: torch.fx.GraphModule) -> dict[str, int]:
    """Op name -> call sites of the op nodes (op_nodes), sorted by name."""
    return dict(sorted(count_calls(op_nodes(gm)).items()))
