"""Programs torch's export serializer writes in a form its own deserializer cannot read, repaired in the
serialized tree (torch's schema dataclasses) before pt2b packs it: a dead `aten.item` without a value
(_valueless_item) and a pure grad-mode or autocast region without outputs (_dead_region) are dropped.
Each repair keeps what the program computes; module_stacks.py holds the one for module names.
Where it runs: docs/architecture.md#capture-and-write-export_model."""

from __future__ import annotations

import torch

from ..._torch.serde import schema as S
from ... import ops
from ...shared.regions import SERIALIZED_REGION_HOPS

_ITEM = "torch.ops.aten.item.default"
_REGIONS = SERIALIZED_REGION_HOPS


def _valueless_item(node: S.Node) -> bool:
    """A dead `aten.item` call whose value torch never recorded (no users, no "val": seen in
    transformers' static-cache decoders exported non-strict), which torch writes with an `as_none`
    output; the deserializer reads every item output as a symbol name and fails. Nothing can refer
    to a value that was not written, and item computes nothing else, so such nodes are dropped."""
    return (node.target == _ITEM and len(node.outputs) == 1
            and node.outputs[0].type == "as_none")


def _pure(graph: S.Graph) -> bool:
    """Every node of ``graph`` calls a registered operator that writes nothing and draws no random
    numbers (nested graphs are not looked into: a node holding one is not pure)."""
    for node in graph.nodes:
        op = ops.op_of_target(node.target)
        if not isinstance(op, torch._ops.OpOverload) or op._schema.is_mutable \
                or torch.Tag.nondeterministic_seeded in op.tags:
            return False
        if any(inp.arg.type == "as_graph" for inp in node.inputs):
            return False
    return True


def _dead_region(node: S.Node) -> bool:
    """A grad-mode or autocast region with no outputs (`with torch.no_grad(): mask = ...` whose result
    the model never uses: phi4_multimodal), written as a `wrap_with_set_grad_enabled` /
    `wrap_with_autocast` node without outputs; the deserializer's verifier then wants a value it never
    had. When every op of its body is functional and draws no random numbers (so running it changes
    nothing, not even the generator's state), the region is dead code and is dropped; otherwise it is
    left alone (and the write => read check refuses the program with torch's reason)."""
    return node.target in _REGIONS and not node.outputs and any(
        inp.arg.type == "as_graph" and _pure(inp.arg.as_graph.graph) for inp in node.inputs)


def _graphs(graph: S.Graph):
    yield graph
    for node in graph.nodes:
        for inp in node.inputs:
            arg = inp.arg
            if arg.type == "as_graph":
                yield from _graphs(arg.as_graph.graph)


def repair(serialized: S.ExportedProgram) -> int:
    """Apply every repair to ``serialized`` in place; the number of nodes changed."""
    changed = 0
    for graph in _graphs(serialized.graph_module.graph):
        keep = [n for n in graph.nodes if not _valueless_item(n) and not _dead_region(n)]
        changed += len(graph.nodes) - len(keep)
        graph.nodes = keep
    return changed
