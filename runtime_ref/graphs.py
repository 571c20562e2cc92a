"""Retargeting the devices baked into a program's graphs and subgraphs (factory ops' device=,
_to_copy, autocast regions' device type, ...) to the runtime's."""

from __future__ import annotations

import copy

import torch
import torch.fx

from exporter._torch.pytree import pytree
from exporter.graph_walk import walk_graphs

from .regions import is_autocast_marker, retarget_autocast

__all__ = ["retarget_devices", "uses_other_device"]


def _map_devices(value, device: torch.device):
    return pytree.tree_map_only(torch.device, lambda _: device, value)


def _node_devices(node: torch.fx.Node):
    leaves = pytree.tree_leaves((node.args, node.kwargs))
    return [x for x in leaves if isinstance(x, torch.device)]


def _moved_autocast(node: torch.fx.Node, autocast_from: frozenset, device: torch.device):
    """The node's args with its autocast device type retargeted, or None (not an autocast region
    of a recorded device type other than the runtime's)."""
    if node.op != "call_function" or not is_autocast_marker(node.target):
        return None
    args = retarget_autocast(tuple(node.args), autocast_from, device)
    return args if args != tuple(node.args) else None


def uses_other_device(gm: torch.fx.GraphModule, device: torch.device, autocast_from: frozenset = frozenset()) -> bool:
    """Whether any node in gm or its subgraphs bakes in a device other than `device` (or autocasts
    a device type of `autocast_from` other than device's), or any tensor the module holds lies elsewhere."""
    if any(t.device != device for t in (*gm.parameters(), *gm.buffers())):
        return True
    nodes = [n for _, g in walk_graphs(gm) for n in g.graph.nodes]
    return (any(d != device for n in nodes for d in _node_devices(n))
            or any(_moved_autocast(n, autocast_from, device) is not None for n in nodes))


def retarget_devices(gm: torch.fx.GraphModule, device: torch.device,
                     autocast_from: frozenset = frozenset()) -> torch.fx.GraphModule:
    """A copy of a (sub)graph module whose baked-in devices all read `device`, and whose autocast
    regions for a device type in `autocast_from` autocast device's type (gm itself if nothing differs)."""
    if not uses_other_device(gm, device, autocast_from):
        return gm
    gm = copy.deepcopy(gm)
    for _, g in walk_graphs(gm):
        for node in g.graph.nodes:
            if _node_devices(node):
                node.args = _map_devices(node.args, device)
                node.kwargs = _map_devices(node.kwargs, device)
            moved = _moved_autocast(node, autocast_from, device)
            if moved is not None:
                node.args = moved
        g.recompile()
    return gm.to(device)
