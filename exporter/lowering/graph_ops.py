"""What a program calls: op counts over the graph and every subgraph, mutation detection."""

from __future__ import annotations

import collections

import torch

from ..ops import op_name
from ..versioning.op_table import iter_graphs
from .tables import is_mutating

# Ops whose schemas do not declare that they update an argument, but do (running stats).
HIDDEN_MUTATION = {
    "aten::batch_norm.default", "aten::_batch_norm_impl_index.default", "aten::instance_norm.default",
    "aten::native_batch_norm.default", "aten::_native_batch_norm_legit.default",
    "aten::cudnn_batch_norm.default", "aten::miopen_batch_norm.default",
}


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


def may_mutate(ep) -> bool:
    """True when functionalization has work to do on ``ep``."""
    return not _is_functional_graph(ep)


def _is_functional_graph(ep) -> bool:
    for node in op_nodes(ep.graph_module):
        op = node.target
        if isinstance(op, torch._ops.HigherOrderOperator):
            continue
        if is_mutating(op) or (op_name(op) in HIDDEN_MUTATION and _updates_running_stats(node)):
            return False
    return True


def _updates_running_stats(node) -> bool:
    """A batch/instance norm node updates its running stats unless its training (use_input_stats)
    flag is literally False (eval mode), or it has no running stats."""
    names = [a.name for a in node.target._schema.arguments]

    def arg(name):
        if name not in names:
            return None
        i = names.index(name)
        return node.args[i] if i < len(node.args) else node.kwargs.get(name)

    flag = arg("training") if "training" in names else arg("use_input_stats")
    return flag is not False and not (arg("running_mean") is None and arg("running_var") is None)


def mutating_ops(gm: torch.fx.GraphModule) -> list[str]:
    return sorted({op_name(n.target) for n in op_nodes(gm)
                   if isinstance(n.target, torch._ops.OpOverload) and is_mutating(n.target)})
