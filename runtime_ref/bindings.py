"""Fast callables for ATen ops: a node may call the op's Python binding (torch.*, torch._C._nn.*,
Tensor methods) instead of the OpOverload only when a trial on meta tensors proves both dispatch alike."""

from __future__ import annotations

import dataclasses

import torch
import torch.fx

from exporter._torch.dispatch import OpOverload, TorchDispatchMode
from exporter._torch.pytree import pytree

from .nested import any_leaf, map_leaves
from .nodes import NODES

__all__ = ["TensorSpec", "fast_callable", "meta_args"]

_BINDING_MODULES = (torch._C._VariableFunctions, torch._C._nn, torch._C._linalg, torch._C._special,
                    torch._C._fft)
_META = torch.device("meta")


class _NoMeta(Exception):
    """A node argument has no static meta value to build a trial input from."""


@dataclasses.dataclass(frozen=True)
class TensorSpec:
    """A strided tensor as recorded: what a trial's meta tensor is built from (and what keys the
    cache); table_program.py records call results as these instead of fake tensors."""

    dtype: torch.dtype
    shape: tuple
    stride: tuple
    device: torch.device = torch.device("cpu")

    def meta(self) -> torch.Tensor:
        return torch.empty_strided(self.shape, self.stride, dtype=self.dtype, device=_META)

    @property
    def static(self) -> bool:
        """Whether every size and stride is an int (table_program records a symbolic one otherwise)."""
        return all(type(s) is int for s in self.shape) and all(type(s) is int for s in self.stride)


def _value_spec(v):
    """One recorded value (a leaf of node.meta["val"]) as a trial describes it; _NoMeta for symbols."""
    if type(v) is TensorSpec:
        if not v.static:
            raise _NoMeta
        return v
    if isinstance(v, torch.Tensor):
        shape, stride = tuple(v.shape), tuple(v.stride())
        if not all(isinstance(s, int) for s in shape) or not all(isinstance(s, int) for s in stride):
            raise _NoMeta
        return TensorSpec(v.dtype, shape, stride, v.device)
    if isinstance(v, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        raise _NoMeta
    return v


def _arg_spec(a):
    """One leaf of a node argument: a node's recorded value, the meta device for a device."""
    if isinstance(a, NODES):
        if "val" not in a.meta:
            raise _NoMeta
        return map_leaves(_value_spec, a.meta["val"])
    return _META if isinstance(a, torch.device) else a


def _on_meta(spec) -> bool:
    return any_leaf(lambda x: type(x) is TensorSpec or x is _META, spec)


def _materialize(spec):
    """The trial (args, kwargs) of meta tensors a spec describes."""
    return map_leaves(lambda x: x.meta() if type(x) is TensorSpec else x, spec)


def meta_args(node: torch.fx.Node):
    """(args, kwargs) of a node described from its recorded values (tensors as the dtype, sizes and
    strides of the meta tensors a trial builds), or None when that cannot be done or the trial would
    not be on meta (a factory op without a device argument)."""
    try:
        spec = map_leaves(_arg_spec, tuple(node.args)), map_leaves(_arg_spec, dict(node.kwargs))
    except _NoMeta:
        return None
    return spec if _on_meta(spec) else None


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


def fast_callable(op: OpOverload, spec, cache: dict | None = None) -> object:
    """The op's Python binding when it dispatches exactly what op._op does on the trial (args,
    kwargs) of meta tensors that ``spec`` (meta_args) describes; otherwise op._op (the OpOverload
    minus one Python frame). `cache` (keyed by op and spec) spares repeating the trial for repeated
    layers: the meta tensors are built only when the key is new."""
    if spec is None or op.namespace != "aten":
        return op._op
    if cache is None:
        return _choose(op, _materialize(spec))
    key = (op, repr(spec))
    if key not in cache:
        cache[key] = _choose(op, _materialize(spec))
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
