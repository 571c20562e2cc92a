"""A node copied into another graph under the name the program knows it by: a placeholder keeps its
own, which the graph signature names the input by (fx renames one that shadows a builtin: ``input``)."""

from __future__ import annotations

import torch


def copy_node(graph: torch.fx.Graph, node: torch.fx.Node, arg_transform) -> torch.fx.Node:
    """``graph.node_copy(node, arg_transform)``, a placeholder keeping ``node``'s name and target
    (nn.Sequential's input is named ``input``, which fx's namespace would make ``input_1``)."""
    new = graph.node_copy(node, arg_transform)
    if node.op == "placeholder":
        new.name = new.target = node.name
    return new
