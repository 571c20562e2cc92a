"""Programs torch's export serializer writes in a form its own deserializer cannot read, repaired in the
serialized tree (torch's schema dataclasses) before pt2b packs it. Each repair keeps what the program
computes; module_stacks.py holds the one for module names.

- A dead `aten.item` call whose value torch never recorded (no users, no "val": seen in transformers'
  static-cache decoders exported non-strict) is written with an `as_none` output; the deserializer
  reads every item output as a symbol name and fails. Nothing can refer to a value that was not
  written, and item computes nothing else, so such nodes are dropped.
"""

from __future__ import annotations

from torch._export.serde import schema as S

_ITEM = "torch.ops.aten.item.default"


def _valueless_item(node: S.Node) -> bool:
    return (node.target == _ITEM and len(node.outputs) == 1
            and node.outputs[0].type == "as_none")


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
        keep = [n for n in graph.nodes if not _valueless_item(n)]
        changed += len(graph.nodes) - len(keep)
        graph.nodes = keep
    return changed
