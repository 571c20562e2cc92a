"""Walking a program's graphs: a graph and, recursively, the subgraphs its higher-order ops call
(cond branches, loop and map bodies, regions), in an fx GraphModule and in a serialized graph; and
the calls found there counted by op name. The one home of these walks for exporter/ and runtime_ref/."""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import torch
import torch.fx

from .ops import op_name

__all__ = ["attr_of", "subgraph_of", "walk_graphs", "call_nodes", "iter_graphs", "iter_serialized_graphs", "count_calls",
           "op_nodes", "op_counts"]


def attr_of(gm: torch.fx.GraphModule, node: torch.fx.Node):
    """What a get_attr node refers to in ``gm`` (a subgraph, a constant tensor), or None."""
    if node.op != "get_attr":
        return None
    obj = gm
    for part in str(node.target).split("."):
        obj = getattr(obj, part, None)
    return obj


def subgraph_of(gm: torch.fx.GraphModule, node: torch.fx.Node):
    """The GraphModule a get_attr node refers to, or None when it names something else."""
    obj = attr_of(gm, node)
    return obj if isinstance(obj, torch.fx.GraphModule) else None


def walk_graphs(gm: torch.fx.GraphModule, prefix: str = "") -> Iterator[tuple[str, torch.fx.GraphModule]]:
    """Yield (prefix, graph module) for gm and, recursively, every get_attr'd GraphModule: the
    subgraphs its nodes call, each as often as it is referred to."""
    yield prefix, gm
    for node in gm.graph.nodes:
        sub = subgraph_of(gm, node)
        if sub is not None:
            yield from walk_graphs(sub, f"{prefix}{node.target}.")


def call_nodes(gm: torch.fx.GraphModule) -> Iterator[torch.fx.Node]:
    """Every call_function node of gm and of the subgraphs walk_graphs reaches, in walk order."""
    for _, g in walk_graphs(gm):
        yield from (n for n in g.graph.nodes if n.op == "call_function")


def iter_graphs(gm: torch.fx.GraphModule) -> Iterator[torch.fx.Graph]:
    """The graph of ``gm`` and of every GraphModule attached under it (named_modules, each once):
    walk_graphs's subgraphs, and also one that no node calls any more (a branch whose cond a
    dead-code pass removed), which the op table and the lowering's op counts have always included."""
    for _, mod in gm.named_modules():
        if isinstance(mod, torch.fx.GraphModule):
            yield mod.graph


def iter_serialized_graphs(graph) -> Iterator:
    """A serialized graph (torch._export.serde.schema.Graph) and every subgraph (higher-order op
    branches) nested in its nodes' ``as_graph`` inputs."""
    stack = [graph]
    while stack:
        g = stack.pop()
        yield g
        for node in g.nodes:
            for inp in node.inputs:
                arg = inp.arg
                if arg is not None and arg.type == "as_graph":
                    stack.append(arg.as_graph.graph)


def count_calls(nodes: Iterable[torch.fx.Node]) -> dict[str, int]:
    """Op name (ops.op_name of the target) -> number of call sites among ``nodes``, in the order
    of each name's first call."""
    counts: dict[str, int] = {}
    for node in nodes:
        name = op_name(node.target)
        counts[name] = counts.get(name, 0) + 1
    return counts


def op_nodes(gm: torch.fx.GraphModule) -> Iterator[torch.fx.Node]:
    """Every call_function node calling an OpOverload or higher-order op, over iter_graphs."""
    for graph in iter_graphs(gm):
        for node in graph.nodes:
            if node.op == "call_function" and isinstance(
                node.target, (torch._ops.OpOverload, torch._ops.HigherOrderOperator)
            ):
                yield node


def op_counts(gm: torch.fx.GraphModule) -> dict[str, int]:
    """Op name -> call sites of the op nodes (op_nodes), sorted by name."""
    return dict(sorted(count_calls(op_nodes(gm)).items()))
