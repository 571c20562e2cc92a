"""Graph-structure helpers for the reference runtime: walking higher-order-op subgraphs and
retargeting the devices baked into graphs (factory ops' device=, _to_copy, ...) to the runtime's."""

from __future__ import annotations

import copy

import torch
import torch.fx
import torch.utils._pytree as pytree

__all__ = ["walk_graphs", "subgraph_of", "retarget_devices", "uses_other_device"]


def subgraph_of(gm: torch.fx.GraphModule, node: torch.fx.Node):
    """The GraphModule a get_attr node refers to, or None when it names something else."""
    if node.op != "get_attr":
        return None
    obj = gm
    for part in str(node.target).split("."):
        obj = getattr(obj, part, None)
    return obj if isinstance(obj, torch.fx.GraphModule) else None


def walk_graphs(gm: torch.fx.GraphModule, prefix: str = ""):
    """Yield (prefix, graph module) for gm and, recursively, every get_attr'd GraphModule."""
    yield prefix, gm
    for node in gm.graph.nodes:
        sub = subgraph_of(gm, node)
        if sub is not None:
            yield from walk_graphs(sub, f"{prefix}{node.target}.")


def _map_devices(value, device: torch.device):
    return pytree.tree_map_only(torch.device, lambda _: device, value)


def _node_devices(node: torch.fx.Node):
    leaves = pytree.tree_leaves((node.args, node.kwargs))
    return [x for x in leaves if isinstance(x, torch.device)]


def uses_other_device(gm: torch.fx.GraphModule, device: torch.device) -> bool:
    """Whether any node in gm or its subgraphs bakes in a device other than `device`, or any
    tensor the module holds lies elsewhere."""
    if any(t.device != device for t in (*gm.parameters(), *gm.buffers())):
        return True
    return any(d != device for _, g in walk_graphs(gm) for n in g.graph.nodes for d in _node_devices(n))


def retarget_devices(gm: torch.fx.GraphModule, device: torch.device) -> torch.fx.GraphModule:
    """A copy of a (sub)graph module whose baked-in devices all read `device` (gm itself if none differ)."""
    if not uses_other_device(gm, device):
        return gm
    gm = copy.deepcopy(gm)
    for _, g in walk_graphs(gm):
        for node in g.graph.nodes:
            if _node_devices(node):
                node.args = _map_devices(node.args, device)
                node.kwargs = _map_devices(node.kwargs, device)
        g.recompile()
    return gm.to(device)
