"""The program's calling convention around a backend's own runner: (args, kwargs) flattened to the
program's user inputs by its in_spec, and the backend's outputs (by graph output name) put back into
the program's output structure, constants included; buffer updates stay inside the backend."""

from __future__ import annotations

import torch
from torch.export.graph_signature import ConstantArgument, OutputKind, TensorArgument

from .._torch.pytree import fx_pytree, pytree
from ..errors import BackendRunError


def _spec(ep: torch.export.ExportedProgram, which: str):
    """The program's ``in_spec`` or ``out_spec``, read where ``ep.call_spec`` reads it: that property makes
    a class at every access, a cost every call of a compiled program would pay (twice)."""
    graph = ep.module_call_graph
    if graph and graph[0].fqn == "" and graph[0].signature is not None:
        return getattr(graph[0].signature, which)
    return getattr(ep.call_spec, which)


def out_spec(ep: torch.export.ExportedProgram):
    """The structure of the program's outputs (its ``out_spec``)."""
    return _spec(ep, "out_spec")


def flat_inputs(ep: torch.export.ExportedProgram, args: tuple, kwargs: dict) -> list:
    """The program's user inputs, in its order, from a call's (args, kwargs)."""
    try:
        return list(fx_pytree.tree_flatten_spec((tuple(args), dict(kwargs)), _spec(ep, "in_spec")))
    except Exception as e:  # noqa: BLE001 (pytree's errors are bare: say what was expected)
        raise BackendRunError(f"the call does not match the program's inputs ({type(e).__name__}: {e}); "
                              f"call it as the exported model was called.") from None


def user_outputs(ep: torch.export.ExportedProgram, produced: dict, leaves: list | None = None):
    """The program's outputs in its own structure from ``produced`` (graph output name -> value, what
    the backend computed); the caller's input tensors that the program mutates are updated in place."""
    user_inputs = [s.arg.name for s in ep.graph_signature.input_specs if s.kind.name == "USER_INPUT"]
    # a weight the program returns as it is comes out of a backend named as the module's attribute ("w"),
    # the program naming it by its input ("p_w")
    attribute = {s.arg.name: s.target for s in ep.graph_signature.input_specs
                 if s.kind.name in ("PARAMETER", "BUFFER", "CONSTANT_TENSOR") and s.target is not None}
    out = []
    for spec in ep.graph_signature.output_specs:
        if spec.kind == OutputKind.USER_INPUT_MUTATION and leaves is not None and spec.arg.name in produced:
            leaves[user_inputs.index(spec.target)].copy_(produced[spec.arg.name])
        if spec.kind != OutputKind.USER_OUTPUT:
            continue
        if isinstance(spec.arg, ConstantArgument):
            out.append(spec.arg.value)
        elif spec.arg.name in produced:  # a tensor, SymInt or SymFloat the backend computed
            out.append(produced[spec.arg.name])
        elif attribute.get(spec.arg.name) in produced:
            out.append(produced[attribute[spec.arg.name]])
        else:
            raise BackendRunError(f"the backend did not return the program's output {spec.arg.name!r} (it returned "
                                  f"{', '.join(produced) or 'nothing'}).")
    return pytree.tree_unflatten(out, _spec(ep, "out_spec"))


def computed_specs(ep: torch.export.ExportedProgram) -> list:
    """The program's output specs a backend computes, in order: every output but its constants
    (constant_outputs: a backend is handed none, and returns none)."""
    return [s for s in ep.graph_signature.output_specs if not isinstance(s.arg, ConstantArgument)]


def with_constants(ep: torch.export.ExportedProgram, computed: list):
    """The program's outputs in its own structure from ``computed``, a backend's values of its user
    outputs that are not constants, in order (constant_outputs: a backend is handed none)."""
    user = [s for s in ep.graph_signature.output_specs if s.kind == OutputKind.USER_OUTPUT]
    values = iter(computed)
    return pytree.tree_unflatten([s.arg.value if isinstance(s.arg, ConstantArgument) else next(values) for s in user],
                                 _spec(ep, "out_spec"))


def numpy_inputs(leaves: list) -> list:
    """The program's user inputs as NumPy arrays (numbers as they are), for runtimes that take those."""
    return [leaf.numpy(force=True) if isinstance(leaf, torch.Tensor) else leaf for leaf in leaves]


def from_tensor_outputs(ep: torch.export.ExportedProgram, values: list, leaves: list, backend: str):
    """The program's outputs from a backend's list of its tensor user outputs, in the program's order;
    a backend that returns the constant outputs too (ExecuTorch) has them dropped."""
    user = [s for s in ep.graph_signature.output_specs if s.kind == OutputKind.USER_OUTPUT]
    tensors = [s for s in user if isinstance(s.arg, TensorArgument)]
    if len(values) == len(user) != len(tensors):
        values = [v for v, s in zip(values, user) if isinstance(s.arg, TensorArgument)]
    if len(values) != len(tensors):
        raise BackendRunError(f"{backend} returned {len(values)} outputs for the program's {len(tensors)} tensor outputs.")
    return user_outputs(ep, {s.arg.name: v for s, v in zip(tensors, values)}, leaves)
