"""Fast callables for ATen ops: a node may call the op's Python binding (torch.*, torch._C._nn.*,
Tensor methods) instead of the OpOverload only when a trial on meta tensors proves both dispatch alike."""

from __future__ import annotations

import torch
import torch.fx
import torch.utils._pytree as pytree
from torch._ops import OpOverload
from torch.utils._python_dispatch import TorchDispatchMode

__all__ = ["fast_callable", "meta_args"]

_BINDING_MODULES = (torch._C._VariableFunctions, torch._C._nn, torch._C._linalg, torch._C._special,
                    torch._C._fft)
_META = torch.device("meta")


class _NoMeta(Exception):
    """A node argument has no static meta value to build a trial input from."""


def _meta_value(v):
    if isinstance(v, torch.Tensor):
        if not all(isinstance(s, int) for s in (*v.shape, *v.stride())):
            raise _NoMeta
        return torch.empty_strided(v.shape, v.stride(), dtype=v.dtype, device=_META)
    if isinstance(v, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        raise _NoMeta
    return v


def _meta_arg(a):
    if isinstance(a, torch.fx.Node):
        if "val" not in a.meta:
            raise _NoMeta
        return pytree.tree_map(_meta_value, a.meta["val"])
    if isinstance(a, (list, tuple)):
        items = [_meta_arg(x) for x in a]
        return items if isinstance(a, list) else tuple(items)
    if isinstance(a, dict):
        return {k: _meta_arg(v) for k, v in a.items()}
    return _META if isinstance(a, torch.device) else a


def meta_args(node: torch.fx.Node):
    """(args, kwargs) of a node as meta tensors built from the recorded values, or None when that
    cannot be done or the trial would not be on meta (a factory op without a device argument)."""
    try:
        trial = _meta_arg(tuple(node.args)), _meta_arg(dict(node.kwargs))
    except _NoMeta:
        return None
    on_meta = any(isinstance(v, torch.Tensor) or v is _META for v in pytree.tree_leaves(trial))
    return trial if on_meta else None


def _summary(x):
    return pytree.tree_map(
        lambda v: ("tensor", v.dtype, tuple(v.shape), tuple(v.stride())) if isinstance(v, torch.Tensor) else v, x)


class _Recorder(TorchDispatchMode):
    """Records every op that reaches the Python dispatch key, with a summary of its arguments."""

    def __init__(self):
        super().__init__()
        self.calls = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        self.calls.append((func, _summary(args), _summary(kwargs)))
        return func(*args, **kwargs)


def _trace(fn, args, kwargs):
    with torch.no_grad(), _Recorder() as rec:
        out = fn(*args, **kwargs)
    return rec.calls, _summary(out)


def _candidates(op: OpOverload):
    name = op._schema.name.split("::", 1)[1]
    found = [getattr(m, name) for m in _BINDING_MODULES if hasattr(m, name)]
    method = getattr(torch._C.TensorBase, name, None)
    return found + ([method] if method is not None else [])


def fast_callable(op: OpOverload, trial, cache: dict | None = None) -> object:
    """The op's Python binding when it dispatches exactly what op._op does on the trial
    (args, kwargs) of meta tensors; otherwise op._op (the OpOverload minus one Python frame).
    `cache` (keyed by op and trial summary) spares repeating the trial for repeated layers."""
    if trial is None or op.namespace != "aten":
        return op._op
    if cache is None:
        return _choose(op, trial)
    key = (op, repr(_summary(trial)))
    if key not in cache:
        cache[key] = _choose(op, trial)
    return cache[key]


def _choose(op: OpOverload, trial) -> object:
    base = op._op
    try:
        expected = _trace(base, *trial)
    except Exception:  # no meta kernel, data-dependent output...: keep the overload
        return base
    for cand in _candidates(op):
        try:
            if _trace(cand, *trial) == expected:
                return cand
        except Exception:  # the binding does not take these arguments
            continue
    return base
