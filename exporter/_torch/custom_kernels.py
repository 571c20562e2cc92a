"""The implementation behind a custom op, as a decomposition: the kernel its author registered for every
device (CompositeExplicitAutograd, torch.library.custom_op's default), called so that the ops it runs are traced."""

from __future__ import annotations

import inspect
from typing import Callable

import torch

_ALL_DEVICES = "CompositeExplicitAutograd"


def is_functional(op: torch._ops.OpOverload) -> bool:
    """Whether ``op`` writes none of its arguments and returns no view of them (its schema says so)."""
    schema = op._schema
    return not schema.is_mutable and not any(r.alias_info is not None for r in schema.returns)


def composite_kernel(op: torch._ops.OpOverload) -> Callable | None:
    """``op``'s kernel for every device as a function of its arguments, or None: an op without one, or one
    that writes its arguments or returns a view of them (a decomposition must be functional). Calling
    the function dispatches straight to that kernel, so that the modes tracing a lowering (fake
    tensors, the proxy tracer) see the ops it calls, not the op itself."""
    if not is_functional(op) or not torch._C._dispatch_has_kernel_for_dispatch_key(op.name(), _ALL_DEVICES):
        return None
    keys = torch._C.DispatchKeySet(torch._C.DispatchKey.CompositeExplicitAutograd)

    def kernel(*args, **kwargs):
        return op.redispatch(keys, *args, **kwargs)

    fn = _python_function(op)
    kernel.__wrapped__ = fn  # (what keys a lowering cache entry: the author's code)
    # messages name the author's function ("mylib.ops.gated"), not this wrapper
    kernel.__module__ = getattr(fn, "__module__", None) or "torch.library"
    kernel.__name__ = kernel.__qualname__ = getattr(fn, "__qualname__", None) or f"{op.name()} kernel"
    return kernel


def _python_function(op) -> Callable | None:
    """The Python function torch.library holds for ``op``'s kernel, when one does (custom_op's)."""
    from .library import OPDEFS

    opdef = OPDEFS.get(op._schema.name)
    if opdef is None:
        return None
    fn = getattr(opdef, "_init_fn", None) or (getattr(opdef, "_backend_fns", {}) or {}).get(None)
    return inspect.unwrap(fn) if fn is not None else None


def where_defined(op: torch._ops.OpOverload) -> str:
    """Where ``op``'s kernel is written ("mylib/ops.py:12"), or what registered it when no Python
    function stands behind it."""
    fn = _python_function(op)
    try:
        return f"{inspect.getsourcefile(fn)}:{inspect.getsourcelines(fn)[1]}" if fn is not None else "a C++ kernel"
    except (OSError, TypeError):
        return getattr(fn, "__qualname__", "a Python function")
