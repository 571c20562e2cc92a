"""What a program needs before any hand-off: its writes in its signature (``functional``), and no weight
the graph never reads sharing memory with one it writes (``without_unread_aliases``).

A transformers static cache, which transformers exports through TorchDynamo, is lifted twice over the
same tensors: the cache's own buffers (``key_cache_0``), which the graph never reads, and the
attention's constants (``lifted_tensor_2``), which it reads and writes. A retrace (torch.onnx,
OpenVINO's table, AOTInductor, to_edge) then meets a written input aliasing another input and stops
("expected compiled_fn to be GraphModule": AOTAutograd's runtime wrapper for aliased inputs has no
export form), on torch.export's own program too. An input the graph never reads changes no value: without it there is nothing aliased."""

from __future__ import annotations

import torch
from torch.export.graph_signature import ExportGraphSignature, InputKind, OutputKind

from ..mutation import written_args
from .program_copy import graph_copy

__all__ = ["functional", "unread_aliases", "without_unread_aliases", "written_in_graph"]

_WEIGHTS = (InputKind.PARAMETER, InputKind.BUFFER, InputKind.CONSTANT_TENSOR)


def _memory(value: torch.Tensor) -> tuple:
    storage = value.untyped_storage()
    return storage.device.type, storage.data_ptr()


def _writing_schema(node):
    """The schema of the op ``node`` calls where that op writes in place, else None."""
    schema = getattr(node.target, "_schema", None) if node.op == "call_function" else None
    return schema if schema is not None and schema.is_mutable else None


def written_in_graph(graph) -> list:
    """The nodes an op of ``graph`` writes in place (a program as torch.export gives it, not functional)."""
    return [arg for node in graph.nodes for arg in written_args(node)]


def unread_aliases(ep: torch.export.ExportedProgram) -> list[str]:
    """The weights (their placeholders' names) the graph does not read whose memory a weight the program
    writes shares."""
    values = {**ep.state_dict, **ep.constants}
    read = {n.name for n in ep.graph.nodes if n.op == "placeholder" and n.users}
    written = {s.target for s in ep.graph_signature.output_specs
               if s.kind in (OutputKind.BUFFER_MUTATION, OutputKind.PARAMETER_MUTATION)}
    target = {s.arg.name: s.target for s in ep.graph_signature.input_specs if s.kind in _WEIGHTS}
    written |= {target[a.name] for a in written_in_graph(ep.graph) if a.name in target}
    groups: dict[tuple, list] = {}
    for spec in ep.graph_signature.input_specs:
        value = values.get(spec.target) if spec.kind in _WEIGHTS else None
        if isinstance(value, torch.Tensor) and value.untyped_storage().nbytes() > 0:
            groups.setdefault(_memory(value), []).append(spec)
    unread = []
    for specs in groups.values():
        if len(specs) < 2 or not any(s.target in written for s in specs):  # (tied weights, only read, stay)
            continue
        unread += [s.arg.name for s in specs if s.arg.name not in read and s.target not in written]
    return unread


def without_unread_aliases(ep: torch.export.ExportedProgram) -> torch.export.ExportedProgram:
    """``ep`` without the weights of unread_aliases (a new program; ``ep`` itself where there are none)."""
    unread = set(unread_aliases(ep))
    if not unread:
        return ep
    gm = graph_copy(ep)
    for node in list(gm.graph.nodes):
        if node.op == "placeholder" and node.name in unread:
            gm.graph.erase_node(node)
    gm.recompile()
    sig = ep.graph_signature
    kept = [s for s in sig.input_specs if s.arg.name not in unread]
    gone = {s.target for s in sig.input_specs if s.arg.name in unread} - {s.target for s in kept}
    return torch.export.ExportedProgram(
        root=gm, graph=gm.graph, graph_signature=ExportGraphSignature(kept, list(sig.output_specs)),
        state_dict={k: v for k, v in ep.state_dict.items() if k not in gone}, range_constraints=ep.range_constraints,
        module_call_graph=ep.module_call_graph, example_inputs=ep.example_inputs,
        constants={k: v for k, v in ep.constants.items() if k not in gone}, verifiers=ep.verifiers)


def functional(ep: torch.export.ExportedProgram) -> torch.export.ExportedProgram:
    """``ep`` with its writes in its signature: a program as torch.export gives it writes in its graph
    (``index_copy_`` into a cache) and names no write, and is made functional by torch's
    ``run_decompositions({})``, which decomposes nothing; ``ep`` itself where no op writes in place. A
    program whose writes reach its inputs or weights and that torch cannot make functional is a
    BackendStateError: handed over as it is, its state would be frozen."""
    from ..errors import BackendStateError

    if not any(_writing_schema(n) is not None for n in ep.graph.nodes):
        return ep
    try:
        return ep.run_decompositions({})
    except Exception as e:  # noqa: BLE001 -- (torch's retrace fails in many ways; which writes matter is below)
        written = sorted({n.name for n in written_in_graph(ep.graph) if n.op == "placeholder"})
        if not written:  # (writes into the graph's own temporaries change no state)
            return ep
        raise BackendStateError(
            f"the program writes {', '.join(written[:6])} in its graph and torch could not make it functional "
            f"({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}); lower it first "
            f"(export_model, then load_for_backend(path, backend=NAME)), which records its writes.") from e
