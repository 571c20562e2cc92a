"""Walking a GraphModule and the subgraphs its higher-order ops call (get_attr'd GraphModules)."""

from __future__ import annotations

import torch
import torch.fx

__all__ = ["subgraph_of", "walk_graphs"]


def subgraph_of(gm: torch.fx.GraphModule, node: torch.fx.Node):
    """The GraphModule a get_attr node refers to, or None when it names something else."""
    if node.op != "get_attr":
        return None
    obj = gm
    for part in str(node.target).split("."):
        obj = getattr(obj, part, None)
    return obj if isinstance(obj, torch.fx.GraphModule) else None


def walk_graphs(gm: torch.fx.GraphModule, prefix: str = ""):
    """Yield (prefix, graph module) for gm and, recursively, every get_attr'd GraphModule."""
    yield prefix, gm
    for node in gm.graph.nodes:
        sub = subgraph_of(gm, node)
        if sub is not None:
            yield from walk_graphs(sub, f"{prefix}{node.target}.")
