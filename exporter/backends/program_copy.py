"""A program's graph copied for a hand-off to rewrite, the program the caller holds left as it is."""

from __future__ import annotations

import torch
import torch.fx

__all__ = ["graph_copy", "program_copy", "program_with"]


def graph_copy(ep: torch.export.ExportedProgram) -> torch.fx.GraphModule:
    """A GraphModule of ``ep``'s graph copied, its nodes named as ``ep``'s (a copy renames what shadows a
    builtin, torch.export's ``input`` coming back ``input_1``; the signature names the program's own)."""
    gm = torch.fx.GraphModule(ep.graph_module, ep.graph_module.graph.__deepcopy__())
    for old, node in zip(ep.graph.nodes, gm.graph.nodes):
        if node.name != old.name:
            node.name = old.name
    return gm


def program_with(ep: torch.export.ExportedProgram, gm: torch.fx.GraphModule) -> torch.export.ExportedProgram:
    """``ep`` with ``gm`` (a rewritten graph_copy of it) as its graph: the same signature, weights,
    constants, ranges and example inputs."""
    return torch.export.ExportedProgram(
        root=gm, graph=gm.graph, graph_signature=ep.graph_signature, state_dict=ep.state_dict,
        range_constraints=ep.range_constraints, module_call_graph=ep.module_call_graph,
        example_inputs=ep.example_inputs, constants=ep.constants, verifiers=ep.verifiers)


def program_copy(ep: torch.export.ExportedProgram) -> torch.export.ExportedProgram:
    """``ep`` with its graph copied: for an importer that rewrites the nodes it is given in place
    (iree-turbine's canonicalizes ``_local_scalar_dense`` into ``aten.Int``)."""
    return program_with(ep, graph_copy(ep))
