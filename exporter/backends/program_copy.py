"""A program's graph copied for a hand-off to rewrite, the program the caller holds left as it is."""

from __future__ import annotations

import torch
import torch.fx

__all__ = ["graph_copy"]


def graph_copy(ep: torch.export.ExportedProgram) -> torch.fx.GraphModule:
    """A GraphModule of ``ep``'s graph copied, its nodes named as ``ep``'s (a copy renames what shadows a
    builtin, torch.export's ``input`` coming back ``input_1``; the signature names the program's own)."""
    gm = torch.fx.GraphModule(ep.graph_module, ep.graph_module.graph.__deepcopy__())
    for old, node in zip(ep.graph.nodes, gm.graph.nodes):
        if node.name != old.name:
            node.name = old.name
    return gm
