"""What in a program draws random numbers, and which of its outputs those draws reach.

A program that draws (``rand``, ``randn_like``, a dropout in training mode) gives other values on
every run, and a backend's generator is not torch's: two runs agree on the values computed from the
draws only by chance. A comparison of such an output proves nothing and fails with neither side
wrong, so the checks that compare runs (the lowering's, the hand-off's) compare the outputs no draw
reaches and only the shape and dtype of the others; ``reached_outputs`` says which those are."""

from __future__ import annotations

import dataclasses

import torch
import torch.fx

from ..graph_walk import iter_graphs, subgraph_of, walk_graphs
from ..mutation import written_args
from ..ops import op_name

__all__ = ["Drawn", "can_draw", "drawing_ops", "drawn_results", "reached_outputs"]


def can_draw(node: torch.fx.Node) -> bool:
    """Whether ``node`` calls a random op that may draw: not a dropout whose ``train`` is False or
    whose probability (``p``, ``dropout_p``) is 0 (an eval-mode model's dropout and attention)."""
    if node.op != "call_function" or not isinstance(node.target, torch._ops.OpOverload) \
            or torch.Tag.nondeterministic_seeded not in node.target.tags:
        return False
    schema = node.target._schema.arguments
    bound = {a.name: a.default_value for a in schema if a.has_default_value()}
    bound.update(zip((a.name for a in schema), node.args))
    bound.update(node.kwargs)
    if bound.get("train", True) is False:
        return False
    return not any(name in bound and bound[name] == 0 and not isinstance(bound[name], torch.fx.Node)
                   for name in ("p", "dropout_p"))


def drawing_ops(ep) -> list[str]:
    """The random ops of the program (and of its subgraphs) that may draw, by name, sorted."""
    return sorted({op_name(n.target) for g in iter_graphs(ep.graph_module) for n in g.nodes if can_draw(n)})


def _draws_within(gm: torch.fx.GraphModule, node: torch.fx.Node) -> bool:
    """Whether a node calls, through a subgraph it names (a cond branch, a loop body), an op that draws."""
    for arg in node.args:
        sub = subgraph_of(gm, arg) if isinstance(arg, torch.fx.Node) else None
        if sub is not None and any(can_draw(n) for _, g in walk_graphs(sub) for n in g.graph.nodes):
            return True
    return False


def _reached(ep) -> dict:
    """node -> the drawing ops its value is computed from, for the nodes of the program's graph a draw
    reaches (a placeholder too, where the graph writes a draw into it in place)."""
    gm = ep.graph_module
    reached: dict[torch.fx.Node, set[str]] = {}
    for node in gm.graph.nodes:
        ops = set()
        if can_draw(node):
            ops.add(op_name(node.target))
        elif node.op == "call_function" and _draws_within(gm, node):
            ops.add(f"{op_name(node.target)} (a subgraph that draws)")
        for arg in node.all_input_nodes:
            ops |= reached.get(arg, set())
        if ops:
            reached[node] = ops
            for arg in written_args(node):  # (a graph with in-place ops: what reads the arg later reads the draw)
                reached[arg] = reached.get(arg, set()) | ops
    return reached


def _returned(ep, reached: dict) -> dict[int, set]:
    """Position among the values the program's graph returns -> the drawing ops, for those a draw reaches."""
    out = next(n for n in reversed(ep.graph_module.graph.nodes) if n.op == "output")
    values = out.args[0] if isinstance(out.args[0], (list, tuple)) else [out.args[0]]
    return {i: reached[v] for i, v in enumerate(values) if isinstance(v, torch.fx.Node) and v in reached}


def reached_outputs(ep) -> dict[int, list[str]]:
    """The positions, among the values the program's graph returns (its output node's flat list, the
    written buffers and inputs first, as the graph signature orders them), of those computed from a
    random draw, each with the drawing ops it depends on; empty where the program does not draw."""
    return {i: sorted(ops) for i, ops in _returned(ep, _reached(ep)).items()}


@dataclasses.dataclass(frozen=True)
class Drawn:
    """What of a program's results random draws reach, as a caller sees them."""

    outputs: frozenset = frozenset()  # positions among the user outputs' leaves (the out_spec's order)
    buffers: frozenset = frozenset()  # the written buffers, by qualified name
    inputs: frozenset = frozenset()  # positions among the user inputs' leaves that the program writes
    ops: tuple = ()  # the drawing ops they are computed from


def drawn_results(ep) -> Drawn:
    """What of a program's results random draws reach, as its caller sees them: user output leaves,
    buffers and user inputs written (returned as new values by a functional graph, or written in place)."""
    reached = _reached(ep)
    if not reached:
        return Drawn()
    drawn = _returned(ep, reached)
    sig, kind = ep.graph_signature, torch.export.graph_signature.OutputKind
    in_kind = torch.export.graph_signature.InputKind
    user_inputs = [s.arg.name for s in sig.input_specs if s.kind == in_kind.USER_INPUT]
    outputs, buffers, inputs, user = set(), set(), set(), 0
    for i, spec in enumerate(sig.output_specs):
        if spec.kind == kind.USER_OUTPUT:
            if i in drawn:
                outputs.add(user)
            user += 1
        elif i in drawn and spec.kind == kind.BUFFER_MUTATION:
            buffers.add(spec.target)
        elif i in drawn and spec.kind == kind.USER_INPUT_MUTATION and spec.target in user_inputs:
            inputs.add(user_inputs.index(spec.target))
    written = {n.name for n in reached if n.op == "placeholder"}  # (in place)
    for spec in sig.input_specs:
        if getattr(spec.arg, "name", None) in written:
            if spec.kind == in_kind.BUFFER:
                buffers.add(spec.target)
            elif spec.kind == in_kind.USER_INPUT:
                inputs.add(user_inputs.index(spec.arg.name))
    return Drawn(frozenset(outputs), frozenset(buffers), frozenset(inputs),
                 tuple(sorted({op for ops in reached.values() for op in ops})))
