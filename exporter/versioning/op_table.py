"""The operator table of an artifact: every op it calls with its full schema, and the check
on load that the running torch has each of them registered."""

from __future__ import annotations

import collections
import operator

import torch
import torch.fx

from ..graph_walk import iter_graphs
from ..ops import resolve_op
from ..layout.generated import pt2b_generated as G

ATEN_NAMESPACES = {"aten", "prims", "_quantized", "quantized"}


def describe_target(target) -> tuple[str, str, str, int]:
    """(qualified name, overload, schema string, OperatorKind) of a call_function target."""
    if isinstance(target, torch._ops.OpOverload):
        ns = target.namespace
        kind = G.OperatorKind.ATEN if ns in ATEN_NAMESPACES else G.OperatorKind.CUSTOM
        return target._schema.name, target._overloadname, str(target._schema), kind
    if isinstance(target, torch._ops.HigherOrderOperator):
        return f"higher_order::{target.name()}", "", "", G.OperatorKind.HIGHER_ORDER
    name = f"{getattr(target, '__module__', '?')}.{getattr(target, '__qualname__', repr(target))}"
    return name, "", "", G.OperatorKind.PYTHON


def collect(gm: torch.fx.GraphModule) -> list:
    """OperatorRecordT for every distinct op called anywhere in ``gm``, sorted by name."""
    counts: collections.Counter = collections.Counter()
    for graph in iter_graphs(gm):
        for node in graph.nodes:
            if node.op == "call_function":
                if node.target is operator.getitem and not node.users:
                    continue  # an unused output selector: torch's serializer drops it, so it is not a call
                counts[describe_target(node.target)] += 1
    out = []
    for (qname, overload, schema, kind), n in sorted(counts.items()):
        r = G.OperatorRecordT()
        r.qualifiedName, r.overload, r.schema, r.kind, r.count = qname, overload, schema, kind, n
        out.append(r)
    return out


def resolve(qualified_name: str, overload: str):
    """The running torch's OpOverload for an aten/custom op record, or None if unregistered."""
    return resolve_op(f"{qualified_name}.{overload or 'default'}")
