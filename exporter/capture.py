"""Capture an nn.Module with torch.export: pre-autograd training IR, no decomposition, no
functionalization (in-place ops such as add_ stay in the graph)."""

from __future__ import annotations

import collections
import copy
import itertools
import typing

import torch

from .errors import ExportError, UnsupportedValueError


class BoundMethod(torch.nn.Module):
    """A bound method of a module (``model.encode``) as a module torch.export captures: the owner's
    parameters, buffers and submodules under their own names, so that every method of one model
    names (and shares) its weights alike; forward is the method. (torch's own wrap_method shares
    only the owner's direct parameters and buffers.)"""

    def __init__(self, method):
        super().__init__()
        owner = method.__self__
        for attr in ("_parameters", "_buffers", "_modules", "_non_persistent_buffers_set"):
            object.__setattr__(self, attr, getattr(owner, attr))
        self.forward = method


def as_module(fn, what: str) -> torch.nn.Module:
    """``fn`` as the module torch.export captures: a module itself, a bound method of a module wrapped."""
    if isinstance(fn, torch.nn.Module):
        return fn
    owner = getattr(fn, "__self__", None)
    if isinstance(owner, torch.nn.Module) and callable(fn):
        return BoundMethod(fn)
    raise ExportError(f"{what} must be an nn.Module or a bound method of one (model.encode), got "
                      f"{type(fn).__name__}; wrap a plain function in an nn.Module whose forward calls it.")


def check_inputs(model, args, kwargs) -> tuple[tuple, dict | None]:
    """Normalize example inputs or explain what is wrong with them."""
    if not isinstance(model, torch.nn.Module):
        raise ExportError(
            f"export_model needs a torch.nn.Module or a torch.export.ExportedProgram, got "
            f"{type(model).__name__}. Wrap a plain function in an nn.Module whose forward calls it."
        )
    if isinstance(args, torch.Tensor):
        args = (args,)
    elif isinstance(args, list):
        args = tuple(args)
    elif args is None:
        args = ()
    if not isinstance(args, tuple):
        raise ExportError(
            f"example args must be a tuple of the forward's positional inputs, got "
            f"{type(args).__name__}; write (x,) for a single input."
        )
    if kwargs is not None and not isinstance(kwargs, dict):
        raise ExportError(f"example kwargs must be a dict of keyword inputs, got {type(kwargs).__name__}.")
    return args, kwargs


def subclass_weights(model: torch.nn.Module) -> dict[str, str]:
    """Weight name -> class of each parameter or buffer that is a tensor subclass torch can flatten
    into plain tensors (torchao's quantized weights, TwoTensor): what capture() unwraps."""
    from ._torch.dispatch import is_traceable_wrapper_subclass

    return {name: f"{type(t).__module__}.{type(t).__qualname__}"
            for name, t in itertools.chain(model.named_parameters(remove_duplicate=False),
                                           model.named_buffers(remove_duplicate=False))
            if is_traceable_wrapper_subclass(t)}


def describe_subclass_weights(found: dict[str, str]) -> str:
    """"14 x torchao.quantization.Int8Tensor" for subclass_weights()' result (the provenance entry)."""
    return ", ".join(f"{n} x {cls}" for cls, n in sorted(collections.Counter(found.values()).items()))


def with_plain_weights(model: torch.nn.Module) -> torch.nn.Module:
    """``model`` itself when its weights are plain tensors; else a copy sharing its tensors (the user's
    module is left as it is) whose subclass weights are unwrapped by torch's own
    unwrap_tensor_subclass_parameters, as run_decompositions does: each becomes its inner plain tensors
    (``<name>.parametrizations.weight.original0``, ...), and the capture traces the subclass's own
    arithmetic on them into the graph (docs/architecture.md#capture-and-write-export_model)."""
    found = subclass_weights(model)
    if not found:
        return model
    from ._torch.functorch import unwrap_tensor_subclass_parameters

    memo = {id(t): t for t in itertools.chain(model.parameters(), model.buffers())}
    try:
        twin = copy.deepcopy(model, memo)
        unwrap_tensor_subclass_parameters(twin)
    except Exception as e:  # noqa: BLE001 -- an attribute deepcopy refuses, a subclass torch cannot unwrap
        name, cls = next(iter(found.items()))
        raise UnsupportedValueError(
            f"{name!r} is a tensor subclass, {cls}, and pt2b could not unwrap it into plain tensors "
            f"({type(e).__name__}: {str(e)[:200]}): .pt2b stores plain tensors. Unwrap the subclass weights "
            f"before export (torchao.utils.unwrap_tensor_subclass(model) for torchao's), or keep the weights "
            f"as plain tensors.") from e
    return twin


def capture(model, args, kwargs=None, *, dynamic_shapes=None, strict: bool = False):
    """torch.export.export at the highest level torch offers (its default training IR); tensor-subclass
    weights are unwrapped into plain tensors first (with_plain_weights)."""
    args, kwargs = check_inputs(model, args, kwargs)
    model = with_plain_weights(model)
    try:
        return torch.export.export(model, args, kwargs, dynamic_shapes=dynamic_shapes, strict=strict)
    except Exception as e:
        raise ExportError(
            f"torch.export could not capture {type(model).__name__} "
            f"({'strict' if strict else 'non-strict'} mode): {type(e).__name__}: {e}"
        ) from e


def ir_level_of(ep) -> str:
    """The IR level an ExportedProgram is at, from its verifier dialect ("training", "aten", ...)."""
    dialects = [v.dialect for v in ep.verifiers] or ["ATEN"]
    return dialects[0].lower()


class Unused(typing.NamedTuple):
    """What the written program leaves out of a captured one: the placeholders of weights its graph never
    reads, and the stored names (state_dict or constants) no other placeholder reads."""

    inputs: frozenset[str] = frozenset()
    targets: tuple[str, ...] = ()


def unused_weights(ep: torch.export.ExportedProgram) -> Unused:
    """The parameters, buffers and constant tensors ``ep``'s graph never reads (the fp32 originals a PT2E
    quantization leaves beside the int8 weights it folded, a pooler a task model never calls), which the
    writer leaves out of the program it writes (writer.MethodSource.unused); ``ep`` itself is never
    changed, and an empty Unused where it reads every one. A mutated buffer is read by its mutation and
    stays (docs/architecture.md#capture-and-write-export_model). The writer drops them from torch's
    serialized program rather than from a copy of the fx graph: a graph copy costs as much as torch's
    serializer, on every program with a BatchNorm (whose num_batches_tracked eval never reads)."""
    from torch.export.graph_signature import InputKind

    unused = {n.name for n in ep.graph.nodes if n.op == "placeholder" and not n.users}
    kinds = (InputKind.PARAMETER, InputKind.BUFFER, InputKind.CONSTANT_TENSOR)
    drop = [s for s in ep.graph_signature.input_specs if s.kind in kinds and s.arg.name in unused]
    if not drop:
        return Unused()
    values = {**ep.state_dict, **ep.constants}
    kept = [values[s.target] for s in ep.graph_signature.input_specs if s not in drop and s.target in values]
    kept_storages = {t.untyped_storage().data_ptr() for t in kept if isinstance(t, torch.Tensor)}
    # a view of a storage the program keeps (a tied weight, a transposed buffer) costs no byte: its
    # name stays with it
    drop = [s for s in drop if not (isinstance(values.get(s.target), torch.Tensor)
                                    and values[s.target].untyped_storage().data_ptr() in kept_storages)]
    if not drop:
        return Unused()
    targets = {s.target for s in drop}
    # a target another input spec still reads (one weight under two placeholders) stays stored
    targets -= {s.target for s in ep.graph_signature.input_specs if s not in drop}
    return Unused(frozenset(s.arg.name for s in drop), tuple(sorted(targets)))
