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
    """Position among the program's user outputs -> value, of the outputs that are constants."""
    user = [s for s in ep.graph_signature.output_specs if _user(s)]
    return {i: s.arg.value for i, s in enumerate(user) if isinstance(s.arg, ConstantArgument)}


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


def without_constant_outputs(ep: torch.export.ExportedProgram, out_spec) -> torch.export.ExportedProgram:
    """``ep`` (returning ``out_spec``'s structure) without its constant user outputs: each is an empty
    tuple in the structure, which holds no leaf (None is a leaf to torch's pytree), and every class of it is a plain container (program_copy.plain_spec,
    as a retrace would rebuild a class without those fields otherwise); the rest of the structure stays
    (a lifted program's written state keeps its place)."""
    constants = constant_outputs(ep)
    kept = [(v, s) for v, s in _pairs(ep) if not (_user(s) and isinstance(s.arg, ConstantArgument))]
    marks = [() if i in constants else 0 for i in range(out_spec.num_leaves)]
    handed = pytree.tree_structure(pytree.tree_unflatten(marks, plain_spec(out_spec)))
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
