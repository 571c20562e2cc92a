"""How the reference runtime runs grad-mode and autocast regions (a region op's runner, a region moved to
its device) and gives the caller back its grad mode and autocast state after every run, raised or not.
Which targets mark a region: exporter/shared/regions.py; the two forms: docs/architecture.md#run-runtime_refruntime."""

from __future__ import annotations

import torch
import torch.fx

from exporter._torch.dispatch import HigherOrderOperator
from exporter._torch.tracing import wrap_with_autocast, wrap_with_set_grad_enabled

from .bindings import TensorSpec

__all__ = ["recorded_device_types", "retarget_autocast", "region_callable", "RegionGuard"]

_SET_GRAD = torch._C._set_grad_enabled


def recorded_device_types(gm: torch.fx.GraphModule) -> frozenset[str]:
    """Device types of the tensors the program was recorded with (its placeholders' values)."""
    return frozenset(n.meta["val"].device.type for n in gm.graph.nodes
                     if n.op == "placeholder" and isinstance(n.meta.get("val"), (torch.Tensor, TensorSpec)))


def retarget_autocast(args: tuple, recorded: frozenset[str], device: torch.device) -> tuple:
    """An autocast marker's args with its device type moved to the runtime's, when the region autocasts
    the device the program was recorded on (a region for another device type is left as it is)."""
    if args and isinstance(args[0], str) and args[0] in recorded and args[0] != device.type:
        return (device.type, *args[1:])
    return args


def _grad_region(enable_grad, body, *args, **kwargs):
    """wrap_with_set_grad_enabled, run by the runtime: torch's minus the dynamo wrapper, and the
    grad mode is restored also when the body raises."""
    prev = torch.is_grad_enabled()
    _SET_GRAD(enable_grad)
    try:
        return body(*args, **kwargs)
    finally:
        _SET_GRAD(prev)


def _autocast_region(device_type, dtype, enabled, cache_enabled, body, *args, **kwargs):
    """wrap_with_autocast, run by the runtime: the body under torch.autocast, minus the dynamo wrapper."""
    with torch.autocast(device_type, dtype, enabled, cache_enabled):
        return body(*args, **kwargs)


_HOP_CALLS = {wrap_with_set_grad_enabled: _grad_region, wrap_with_autocast: _autocast_region}


def region_callable(target):
    """What a step calls for a region higher-order op, or None when target is not one."""
    return _HOP_CALLS.get(target) if isinstance(target, HigherOrderOperator) else None


# ---- the caller's state, given back after every run ----

def _autocast_nesting() -> int:
    torch.autocast_increment_nesting()
    return torch.autocast_decrement_nesting()


class RegionGuard:
    """Wraps a plan's `run(leaves)` for a program with regions: the caller's autocast state (per device
    type the program autocasts, the cache flag, the nesting level) is restored after the run, raised
    or not, grad mode is left off (Runtime.__call__ restores the caller's), and outputs that recorded
    autograd history inside an enable_grad region are detached, so no run hands out autograd graphs."""

    def __init__(self, device_types):
        self.device_types = tuple(sorted(device_types))

    def _save(self):
        return ([(t, torch.is_autocast_enabled(t), torch.get_autocast_dtype(t)) for t in self.device_types],
                torch.is_autocast_cache_enabled(), _autocast_nesting())

    @staticmethod
    def _restore(saved) -> None:
        per_device, cache, nesting = saved
        now = _autocast_nesting()
        while now > nesting:  # a region entered and never exited (the run raised inside it)
            now = torch.autocast_decrement_nesting()
            if now == 0:
                torch.clear_autocast_cache()
        while now < nesting:
            now = torch.autocast_increment_nesting()
        for t, enabled, dtype in per_device:
            torch.set_autocast_enabled(t, enabled)
            torch.set_autocast_dtype(t, dtype)
        torch.set_autocast_cache_enabled(cache)

    def wrap(self, run):
        save, restore = self._save, self._restore

        def guarded(leaves):
            saved = save()
            try:
                outs = run(leaves)
            finally:
                _SET_GRAD(False)
                restore(saved)
            return _detached(outs)

        guarded.__wrapped__ = run
        return guarded


def _detached(outs: tuple) -> tuple:
    """outs with every tensor that has autograd history (a grad_fn) detached; leaves stay as they are,
    as in runs without regions, and an output object returned twice stays one object."""
    if not any(isinstance(o, torch.Tensor) and o.grad_fn is not None for o in outs):
        return outs
    done: dict[int, torch.Tensor] = {}
    result = []
    for o in outs:
        if isinstance(o, torch.Tensor) and o.grad_fn is not None:
            if id(o) not in done:
                done[id(o)] = o.detach()
            o = done[id(o)]
        result.append(o)
    return tuple(result)
