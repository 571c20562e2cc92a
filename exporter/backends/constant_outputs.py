"""A program's constant outputs kept from the backend and put back after its hand-off.

torch.export records a Python number the model returns (the spatial sizes transformers' Swin returns
beside its hidden states) as a constant output: a literal in the graph's output node, with no node
computing it. torch.onnx's translation and OpenVINO's convert_model read every output as a node and
refuse such a program ("'int' object has no attribute 'name'"). The value is known at capture and is
the same on every call, so no backend needs to compute it: the backend gets the program returning its
other outputs, and the program it took gets the constants back at their places, in the program's own
output structure."""

from __future__ import annotations

import torch
from torch.export.graph_signature import ConstantArgument, ExportGraphSignature, OutputKind, OutputSpec

from .._torch.pytree import pytree
from .program_copy import graph_copy, plain_spec, program_returning

__all__ = ["constant_outputs", "with_constant_outputs", "without_constant_outputs"]


def _user(spec) -> bool:
    return spec.kind == OutputKind.USER_OUTPUT


def constant_outputs(ep: torch.export.ExportedProgram) -> dict[int, object]:
    """Position among the program's user outputs -> value, of the outputs that are constants; none
    where every user output is one (the backend then gets the program as it is)."""
    user = [s for s in ep.graph_signature.output_specs if _user(s)]
    found = {i: s.arg.value for i, s in enumerate(user) if isinstance(s.arg, ConstantArgument)}
    return found if len(found) < len(user) else {}


def _with_outputs(ep: torch.export.ExportedProgram, outputs: list, out_spec) -> torch.export.ExportedProgram:
    """``ep`` on a copy of its graph returning ``outputs`` ((value or node name, output spec) pairs, in
    the output node's order), structured by ``out_spec``."""
    gm = graph_copy(ep)
    nodes = {n.name: n for n in gm.graph.nodes}
    out = gm.graph.output_node()
    out.args = ([nodes[v] if isinstance(v, str) and not isinstance(s.arg, ConstantArgument) else v
                 for v, s in outputs],)
    gm.recompile()
    signature = ExportGraphSignature(input_specs=list(ep.graph_signature.input_specs),
                                     output_specs=[s for _, s in outputs])
    return program_returning(ep, out_spec, gm=gm, signature=signature)


def _pairs(ep: torch.export.ExportedProgram) -> list:
    """(what the output node returns: a node's name or a constant, its output spec) of ``ep``."""
    returned = ep.graph.output_node().args[0]
    return [(v.name if isinstance(v, torch.fx.Node) else v, s)
            for v, s in zip(returned, ep.graph_signature.output_specs)]


def _pruned(spec, constants: dict, first: int = 0, root: bool = True):
    """(``spec`` without the leaves at ``constants``' positions, counted from ``first``, and without a
    container that leaves empty, but for the children of a tuple at the root, which stay as empty
    tuples (a lifted program returns (outputs, written state)); None where nothing is left; the number
    of leaves ``spec`` had)."""
    if spec.is_leaf():
        return (None if first in constants else spec), 1
    kept, count = [], 0
    for key, child in zip(spec.context or [None] * spec.num_children, spec.children()):
        pruned, n = _pruned(child, constants, first + count, root=False)
        count += n
        if pruned is None and root and spec.type is tuple:
            pruned = pytree.treespec_tuple([])
        if pruned is not None:
            kept.append((key, pruned))
    if not kept:
        return None, count
    if spec.type is dict:
        return pytree.treespec_dict({k: c for k, c in kept}), count
    if spec.type is list:
        return pytree.TreeSpec(list, None, [c for _, c in kept]), count
    return pytree.treespec_tuple([c for _, c in kept]), count


def without_constant_outputs(ep: torch.export.ExportedProgram, out_spec) -> torch.export.ExportedProgram:
    """``ep`` (returning ``out_spec``'s structure) without its constant user outputs: they leave the
    structure, a container they leave empty too, and every class of it is a plain container
    (program_copy.plain_spec, as a retrace would rebuild a class without those fields otherwise). An
    empty tuple in their place broke LiteRT's converter ("SmallVector unable to grow")."""
    constants = constant_outputs(ep)
    kept = [(v, s) for v, s in _pairs(ep) if not (_user(s) and isinstance(s.arg, ConstantArgument))]
    handed, _ = _pruned(plain_spec(out_spec), constants)
    return _with_outputs(ep, kept, handed)


def with_constant_outputs(took: torch.export.ExportedProgram, constants: dict[int, object], out_spec):
    """``took`` (a backend's program of one without_constant_outputs gave it) returning ``constants``
    again at their places among its user outputs, structured by ``out_spec`` (the original program's);
    None where ``took`` does not return as many user outputs as that needs."""
    pairs = _pairs(took)
    user = [p for p in pairs if _user(p[1])]
    if len(user) + len(constants) != out_spec.num_leaves:
        return None
    computed = iter(user)
    merged = [(value, _constant_spec(value)) if i in constants else next(computed)
              for i, value in ((i, constants.get(i)) for i in range(out_spec.num_leaves))]
    return _with_outputs(took, [p for p in pairs if not _user(p[1])] + merged, out_spec)


def _constant_spec(value) -> OutputSpec:
    return OutputSpec(kind=OutputKind.USER_OUTPUT, arg=ConstantArgument(name="", value=value), target=None)
