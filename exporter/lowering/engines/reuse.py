"""Lower a program of repeated identical layers by tracing one layer and copying the result: a chain of
equal blocks is collapsed to its first, lowered once and expanded, each copy on its own weights. The
caller lowers the program whole where this does not apply. How and when:
docs/lowering.md#repeated-layers-are-traced-once."""

from __future__ import annotations

import collections
import operator

import torch
from torch.export.exported_program import ExportedProgram
from torch.export.graph_signature import ExportGraphSignature, OutputKind, OutputSpec, TensorArgument

from ..._torch.pytree import pytree
from ...mutation import may_mutate
from .node_copy import copy_node

__all__ = ["Reused", "expand", "find_blocks", "lower_with_reuse", "program_with_graph", "valid_recipe"]

MIN_BLOCKS = 2


# ---- when it applies ----
def _eligible(ep) -> bool:
    if any(e.signature is not None for e in ep.module_call_graph[1:]) or may_mutate(ep):
        return False
    for node in ep.graph.nodes:
        if node.op == "call_function" and not isinstance(node.target, torch._ops.OpOverload):
            if node.target is not operator.getitem:
                return False
        if node.op == "get_attr":
            return False
        for v in pytree.tree_leaves(node.meta.get("val")):
            if isinstance(v, (torch.SymInt, torch.SymFloat, torch.SymBool)):
                return False
            if isinstance(v, torch.Tensor) and not all(isinstance(d, int) for d in (*v.shape, *v.stride())):
                return False
    return all(s.kind == OutputKind.USER_OUTPUT for s in ep.graph_signature.output_specs)


# ---- finding blocks ----
def _label(node, depth: int):
    stack = list((node.meta.get("nn_module_stack") or {}).values())
    if len(stack) <= depth:
        return None
    fqn, typ = stack[depth]
    last = str(fqn).rsplit(".", 1)[-1]
    return (str(fqn), str(typ)) if last.isdigit() else None


def _meta_sig(node):
    out = []
    for v in pytree.tree_leaves(node.meta.get("val")):
        if isinstance(v, torch.Tensor):
            out.append((tuple(v.shape), tuple(v.stride()), v.dtype, v.device.type, v.requires_grad))
        else:
            out.append(repr(v))
    return tuple(out)


def _segment_io(nodes: list) -> tuple[list, list]:
    """(external inputs in order of first use, outputs in graph order) of a run of nodes."""
    inside = set(nodes)
    inputs: dict = {}
    for n in nodes:
        for a in n.all_input_nodes:
            if a not in inside and a not in inputs:
                inputs[a] = None
    outputs = [n for n in nodes if any(u not in inside for u in n.users)]
    return list(inputs), outputs


def _canon(nodes: list, inputs: list, outputs: list):
    """What must be equal for two segments to lower alike: ops, argument structure, metadata."""
    index = {n: ("n", i) for i, n in enumerate(nodes)}
    index.update({x: ("x", i) for i, x in enumerate(inputs)})

    def arg(a):
        return pytree.tree_map_only(torch.fx.Node, lambda n: index[n], a)

    body = tuple((n.target, repr(arg(n.args)), repr(arg(dict(n.kwargs))), _meta_sig(n)) for n in nodes)
    ins = tuple((x.op == "placeholder", _meta_sig(x)) for x in inputs)
    return body, ins, tuple(index[o] for o in outputs)


def find_blocks(ep):
    """[(nodes, inputs, outputs), ...] of the largest set of equal consecutive blocks, or []."""
    calls = [n for n in ep.graph.nodes if n.op == "call_function"]
    best, best_saved = [], 0
    for depth in (1, 2, 3):
        runs: list[tuple[object, list]] = []
        for n in calls:
            lab = _label(n, depth)
            if runs and runs[-1][0] == lab:
                runs[-1][1].append(n)
            else:
                runs.append((lab, [n]))
        labels = [lab for lab, _ in runs if lab is not None]
        if len(labels) != len(set(labels)):
            continue  # a block's nodes are not contiguous
        classes = collections.defaultdict(list)
        for lab, nodes in runs:
            if lab is None:
                continue
            ins, outs = _segment_io(nodes)
            classes[_canon(nodes, ins, outs)].append((nodes, ins, outs))
        for members in classes.values():
            saved = (len(members) - 1) * len(members[0][0])
            if len(members) >= MIN_BLOCKS and saved > best_saved:
                best, best_saved = members, saved
    return best


# ---- collapse, lower once, expand ----
def _chain(blocks: list) -> list:
    """The blocks when they form one chain x -> B1 -> B2 -> ... -> Bn: each has one output, which
    only the next block reads, at the same input position in every block; every other input is a
    weight (a placeholder) or the very value block 1 reads there (a shared mask). [] otherwise."""
    if any(len(outs) != 1 for _, _, outs in blocks):
        return []
    chained = None
    for k in range(1, len(blocks)):
        nodes, ins, _ = blocks[k]
        prev_out = blocks[k - 1][2][0]
        if set(prev_out.users) - set(nodes):
            return []
        for i, (x1, xk) in enumerate(zip(blocks[0][1], ins)):
            if x1.op == "placeholder" and xk.op == "placeholder":
                continue
            if xk is prev_out:
                if chained not in (None, i):
                    return []
                chained = i
            elif xk is not x1:
                return []
    return blocks if chained is not None else []


def program_with_graph(ep, graph: torch.fx.Graph, range_constraints: dict | None = None,
             mutations: list = ()) -> ExportedProgram:
    """``graph`` (same placeholders as ``ep``) as a program with ``ep``'s inputs, state and outputs
    (and ``ep``'s range constraints, or those given), after the outputs of ``mutations`` ([(output
    kind, target)]: the inputs the graph returns written, first). ExportedProgram makes the graph
    module itself from ``ep``'s (one code generation, not two)."""
    outs = [a.name if isinstance(a, torch.fx.Node) else None for a in pytree.tree_leaves(graph.output_node().args[0])]
    specs = [(kind, None, target) for kind, target in mutations] + \
        [(s.kind, s.arg, s.target) for s in ep.graph_signature.output_specs]
    if len(specs) != len(outs):
        raise ValueError(f"{len(outs)} outputs for {len(specs)} output specs")
    output_specs = [OutputSpec(kind, TensorArgument(name) if name else arg, target)
                    for (kind, arg, target), name in zip(specs, outs)]
    sig = ExportGraphSignature(list(ep.graph_signature.input_specs), output_specs)
    return ExportedProgram(root=ep.graph_module, graph=graph, graph_signature=sig, state_dict=ep.state_dict,
                           range_constraints=ep.range_constraints if range_constraints is None else range_constraints,
                           module_call_graph=ep.module_call_graph,
                           example_inputs=ep.example_inputs, constants=ep.constants, verifiers=ep.verifiers)


def _collapsed(ep, chain: list) -> torch.fx.Graph:
    """``ep``'s graph without blocks 2..n: what consumed Bn's output consumes B1's."""
    drop = {n for nodes, _, _ in chain[1:] for n in nodes}
    g = torch.fx.Graph()
    env = {chain[-1][2][0]: None}
    for n in ep.graph.nodes:
        if n in drop:
            continue
        env[n] = copy_node(g, n, lambda a: env[a])
        if n is chain[0][2][0]:
            env[chain[-1][2][0]] = env[n]
    return g


class Reused:
    """A lowering made by reuse: the lowered collapsed program and the recipe that expands it
    (``expand``). The lowering cache stores these two (a fraction of the expanded graph's size)."""

    def __init__(self, collapsed, recipe: dict):
        self.collapsed, self.recipe = collapsed, recipe

    def expand(self):
        """The lowered program of the whole chain, or None when the recipe does not fit."""
        return expand(self.collapsed, self.recipe)


def lower_with_reuse(ep, decompose) -> Reused | None:
    """``ep`` lowered by ``decompose(ExportedProgram) -> ExportedProgram`` with a chain of equal
    blocks traced once: the program is lowered with the chain collapsed to its first block, whose
    lowered nodes are then copied for the other blocks (Reused.expand()). None when this does not
    apply (the caller lowers ``ep`` whole)."""
    if not _eligible(ep):
        return None
    chain = _chain(find_blocks(ep))
    if len(chain) < MIN_BLOCKS:
        return None
    low = decompose(program_with_graph(ep, _collapsed(ep, chain)))
    recipe = {"block": _block_fqn(chain[0][0]),
              "inputs": [[x.name if x.op == "placeholder" else None for x in ins] for _, ins, _ in chain]}
    return Reused(low, recipe)


def valid_recipe(recipe) -> bool:
    """Whether ``recipe`` (read back from a cache entry) has the shape ``expand`` needs."""
    if not isinstance(recipe, dict) or not isinstance(recipe.get("block"), str):
        return False
    inputs = recipe.get("inputs")
    return (isinstance(inputs, list) and len(inputs) >= MIN_BLOCKS
            and all(isinstance(b, list) and len(b) == len(inputs[0]) for b in inputs)
            and all(x is None or isinstance(x, str) for b in inputs for x in b))


def expand(low, recipe: dict):
    """The collapsed lowered program ``low`` with its first block copied per ``recipe`` (block 1's
    module path, and each block's input placeholders by position), or None when it does not fit."""
    first = [n for n in low.graph.nodes if n.op == "call_function" and _has_fqn(n, recipe["block"])]
    graph = _expand(low.graph, first, recipe["inputs"])
    return None if graph is None else program_with_graph(low, graph)


def _block_fqn(nodes):
    common = None
    for n in nodes:
        fqns = {str(f) for f, _ in (n.meta.get("nn_module_stack") or {}).values()}
        common = fqns if common is None else common & fqns
    return max(common, key=len)


def _has_fqn(node, fqn: str) -> bool:
    return any(str(f) == fqn for f, _ in (node.meta.get("nn_module_stack") or {}).values())


def _expand(graph: torch.fx.Graph, first: list, inputs: list):
    """``graph`` with copies of the lowered first block ``first`` for blocks 2..n (``inputs[k]``: block
    k's input placeholder names by position, None for activations), or None when the lowered block
    is not one contiguous run with one chained activation in and one value out."""
    order = {n: i for i, n in enumerate(graph.nodes)}
    if not first or order[first[-1]] - order[first[0]] != len(first) - 1:
        return None
    inside = set(first)
    acts = {a for n in first for a in n.all_input_nodes if a not in inside and a.op != "placeholder"}
    outs = [n for n in first if any(u not in inside for u in n.users)]
    if len(outs) != 1:
        return None
    (out,) = outs
    chained = [a for a in acts if _meta_sig(a) == _meta_sig(out)]  # the rest are shared (a mask)
    if len(chained) != 1:
        return None
    (act,) = chained
    placeholders = {n.name: n for n in graph.nodes if n.op == "placeholder"}
    g = torch.fx.Graph()
    env = {}
    for n in graph.nodes:
        env[n] = copy_node(g, n, lambda a: env[a])
        if n is not first[-1]:
            continue
        prev = env[out]
        for names in inputs[1:]:  # block k: block 1's lowered nodes on block k's weights
            val_map = {act: prev}
            for x1, xk in zip(inputs[0], names):
                if x1 is not None:
                    if x1 not in placeholders or xk not in placeholders:
                        return None
                    val_map[placeholders[x1]] = env[placeholders[xk]]
            for m in first:
                val_map[m] = g.node_copy(m, lambda a: val_map[a] if a in val_map else env[a])
            prev = val_map[out]
        env[out] = prev  # what follows the chain reads the last block's output
    return g
