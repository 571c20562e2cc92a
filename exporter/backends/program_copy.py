"""A program's graph copied for a hand-off to rewrite, the program the caller holds left as it is."""

from __future__ import annotations

import contextlib

import torch
import torch.fx

from .._torch.pytree import pytree

__all__ = ["calls_decomposed", "emitted", "graph_copy", "handed_spec", "node_replaced", "nodes_repaired",
           "nodes_rewritten", "plain_spec", "program_copy", "program_returning", "program_with"]


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


def nodes_rewritten(ep: torch.export.ExportedProgram, picks, rewrite) -> torch.export.ExportedProgram:
    """``ep`` with each node that ``picks(node)`` selects given to ``rewrite(graph, node)`` in the graph's
    order, on a copy of its graph (nodes ``rewrite`` makes go before the node); ``ep`` itself where none
    is picked (it is never changed)."""
    if not any(picks(n) for n in ep.graph.nodes):
        return ep
    gm = graph_copy(ep)
    for node in [n for n in gm.graph.nodes if picks(n)]:
        with gm.graph.inserting_before(node):
            rewrite(gm.graph, node)
    gm.recompile()
    return program_with(ep, gm)


def nodes_repaired(ep: torch.export.ExportedProgram, repairs) -> torch.export.ExportedProgram:
    """nodes_rewritten with a table: each node some ``needs(node)`` of ``repairs`` ((needs, repair)
    pairs) selects given to the first such pair's ``repair(graph, node)``, all on one copy of the graph."""
    def needing(node):
        return next((repair for needs, repair in repairs if needs(node)), None)

    return nodes_rewritten(ep, lambda node: needing(node) is not None, lambda graph, node: needing(node)(graph, node))


def calls_decomposed(ep: torch.export.ExportedProgram, table: dict) -> torch.export.ExportedProgram:
    """``ep`` retraced once with run_decompositions, each op of ``table`` (op -> (decomposition, which
    calls need it)) decomposed where some call of it in the graph needs it (the decomposition returns
    NotImplemented on the calls it leaves); ``ep`` itself where no call does. A decomposition, not a
    node rewrite: it is written in ops, shapes and dtypes follow, and the retrace checks it."""
    decompositions = {}
    for node in ep.graph.nodes:
        entry = table.get(node.target)
        if entry is not None and node.target not in decompositions and entry[1](node):
            decompositions[node.target] = entry[0]
    return ep.run_decompositions(decompositions) if decompositions else ep


def emitted(graph: torch.fx.Graph, target, *args, fake_mode=None, **kwargs) -> torch.fx.Node:
    """A call of ``target`` made in ``graph`` (at its insertion point), its ``meta["val"]`` computed from
    its arguments' values: under ``fake_mode`` where the call makes a tensor of no tensor (a number's)."""
    made = graph.call_function(target, args, kwargs)
    vals = torch.fx.node.map_arg((args, kwargs), lambda n: n.meta["val"])
    with fake_mode if fake_mode is not None else contextlib.nullcontext():
        made.meta["val"] = target(*vals[0], **vals[1])
    return made


def node_replaced(graph: torch.fx.Graph, node: torch.fx.Node, made: torch.fx.Node) -> None:
    """``node`` replaced by ``made`` in ``graph``, which takes its name: the graph signature names an
    output (and a written buffer's new value) by its node."""
    node.replace_all_uses_with(made)
    name = node.name
    graph.erase_node(node)
    made.name = name


def program_copy(ep: torch.export.ExportedProgram) -> torch.export.ExportedProgram:
    """``ep`` with its graph copied: for an importer that rewrites the nodes it is given in place
    (iree-turbine's canonicalizes ``_local_scalar_dense`` into ``aten.Int``)."""
    return program_with(ep, graph_copy(ep))


def handed_spec(spec):
    """The output structure a hand-off gives a backend for a program returning ``spec``: ``spec`` where
    the values it structures flatten back to it, plain_spec(spec) where they do not."""
    import torch

    rebuilt = pytree.tree_unflatten([torch.empty(0) for _ in range(spec.num_leaves)], spec)
    return spec if pytree.tree_structure(rebuilt) == spec else plain_spec(spec)


def plain_spec(spec):
    """``spec`` with every node of a class of its own (transformers' ModelOutput, a dataclass, a
    namedtuple) a tuple of its children: the same leaves in the same order. A retrace flattens what the
    program returns again, and a class whose flattening does not give back the order it was built from
    permutes the outputs: a ModelOutput rebuilt from its keys orders them as its fields, not as the model
    set them (torch's run_decompositions kept the out_spec and reordered the graph's outputs under it)."""
    if spec.is_leaf():
        return spec
    children = [plain_spec(child) for child in spec.children()]
    if spec.type is dict:
        return pytree.treespec_dict(dict(zip(spec.context, children)))
    if spec.type is list:
        return pytree.TreeSpec(list, None, children)
    return pytree.treespec_tuple(children)


def program_returning(ep: torch.export.ExportedProgram, out_spec, copy: bool = True, *, gm=None,
                      signature=None) -> torch.export.ExportedProgram:
    """``ep`` returning its outputs in ``out_spec``'s structure (as many leaves, in the graph's order),
    its graph copied unless ``copy`` is False (a program the caller does not hold); ``gm`` and
    ``signature``: a graph and graph signature of ``ep`` rewritten, used as they are."""
    import dataclasses

    from torch.export.exported_program import ModuleCallEntry

    calls = [ModuleCallEntry("", dataclasses.replace(entry.signature, out_spec=out_spec))
             if entry.fqn == "" and entry.signature is not None else entry for entry in ep.module_call_graph]
    gm = gm if gm is not None else graph_copy(ep) if copy else ep.graph_module
    return torch.export.ExportedProgram(
        root=gm, graph=gm.graph, graph_signature=signature or ep.graph_signature, state_dict=ep.state_dict,
        range_constraints=ep.range_constraints, module_call_graph=calls,
        example_inputs=ep.example_inputs, constants=ep.constants, verifiers=ep.verifiers)
