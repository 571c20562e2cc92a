"""The one home of grad-mode and autocast region markers: which call targets open, close or wrap a region
(flat calls, wrap_with_* higher-order ops), for exporter/ and runtime_ref/ alike (runtime_ref/regions.py runs them)."""

from __future__ import annotations

from collections.abc import Iterable

import torch
import torch.fx

from .._torch.tracing import enter_autocast, exit_autocast, wrap_with_autocast, wrap_with_set_grad_enabled
from ..graph_walk import call_nodes

__all__ = ["REGION_HOP_NAMES", "SERIALIZED_ENTER_AUTOCAST", "SERIALIZED_EXIT_AUTOCAST", "SERIALIZED_GRAD",
           "SERIALIZED_REGION_HOPS", "autocast_devices", "autocast_steps", "has_regions", "is_autocast_marker",
           "is_grad_marker", "is_region", "is_region_marker"]

_SET_GRAD = torch._C._set_grad_enabled
_MARKERS = (_SET_GRAD, enter_autocast, exit_autocast)
REGION_HOP_NAMES = frozenset({"wrap_with_set_grad_enabled", "wrap_with_autocast"})
# the same targets as torch.export's serializer names them (a serialized graph names its targets)
SERIALIZED_GRAD = "torch._C._set_grad_enabled"
SERIALIZED_ENTER_AUTOCAST = "torch.amp.autocast_mode._enter_autocast"
SERIALIZED_EXIT_AUTOCAST = "torch.amp.autocast_mode._exit_autocast"
SERIALIZED_REGION_HOPS = frozenset(f"torch.ops.higher_order.{name}" for name in REGION_HOP_NAMES)


def is_region_marker(target) -> bool:
    """A flat grad-mode or autocast marker (accepted whatever opset is chosen, like getitem)."""
    return any(target is m for m in _MARKERS)


def is_grad_marker(target) -> bool:
    """A flat call that sets grad mode (torch._C._set_grad_enabled), opening or closing a region."""
    return target is _SET_GRAD


def is_autocast_marker(target) -> bool:
    """A call that opens an autocast region (flat or wrapped); its first argument is the region's
    device type ('cpu', 'cuda')."""
    return target is enter_autocast or target is wrap_with_autocast


def is_region(target) -> bool:
    """A flat marker or a region higher-order op (wrap_with_set_grad_enabled, wrap_with_autocast)."""
    return is_region_marker(target) or target is wrap_with_set_grad_enabled or target is wrap_with_autocast


def has_regions(gm: torch.fx.GraphModule) -> bool:
    """Whether gm or any of its subgraphs marks a grad-mode or autocast region."""
    return any(is_region(n.target) for n in call_nodes(gm))


def autocast_devices(gm: torch.fx.GraphModule) -> frozenset[str]:
    """Device types of all autocast regions in gm and its subgraphs, as recorded."""
    return frozenset(n.args[0] for n in call_nodes(gm) if is_autocast_marker(n.target) and isinstance(n.args[0], str))


def autocast_steps(targets: Iterable) -> set[int]:
    """Indices of the calls that run inside a flat autocast region (between an _enter_autocast and its
    _exit_autocast, nesting counted), given the calls' targets in order."""
    inside, depth = set(), 0
    for k, target in enumerate(targets):
        if target is enter_autocast:
            depth += 1
        elif target is exit_autocast:
            depth = max(depth - 1, 0)
        elif depth:
            inside.add(k)
    return inside
