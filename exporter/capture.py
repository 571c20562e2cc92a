"""Capture an nn.Module with torch.export: pre-autograd training IR, no decomposition, no
functionalization (in-place ops such as add_ stay in the graph)."""

from __future__ import annotations

import torch

from .errors import ExportError


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


def capture(model, args, kwargs=None, *, dynamic_shapes=None, strict: bool = False):
    """torch.export.export at the highest level torch offers (its default training IR)."""
    args, kwargs = check_inputs(model, args, kwargs)
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
