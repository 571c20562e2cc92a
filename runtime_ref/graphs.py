"""Retargeting the devices baked into a program's graphs and subgraphs (factory ops' device=,
_to_copy, autocast regions' device type, ...) to the runtime's, and what else a program recorded on one
device type must loosen to run on another (moved_call):

- the strides its values were recorded with: another device's kernels may lay their outputs out
  otherwise (CUDA's attention kernels do), so a `view` that the recording proved possible may not be;
  in a functional program a view's value equals a reshape's, so there ``view`` runs as ``reshape``
  (a view where the strides allow, a copy where they do not);
- the dtypes an autocast region gave its values: each device type has its own autocast policy (CUDA
  runs ``exp`` in float32, the CPU in bfloat16), so a moved region's tensor-metadata assertions keep
  their device and layout but not their dtype;
- the CPU scalars prims read: an elementwise prim takes a 0-dim CPU tensor beside tensors of any shape
  and device, and the decompositions that end in prims (the `max` preset) count on it (a `where` over a
  `scalar_tensor`, an `add` of a `sum` over all dimensions); on another device that value is a 0-dim
  tensor of the wrong shape to them, so a prim reading one runs with it expanded (with_device_scalars).
  Subgraphs (control flow, region bodies) are run by torch as recorded there."""

from __future__ import annotations

import copy

import torch
import torch.fx

from exporter._torch.pytree import pytree
from exporter.shared import is_autocast_marker, walk_graphs

from .nodes import NODES
from .regions import retarget_autocast

__all__ = ["retarget_devices", "uses_other_device", "moves_autocast", "moved_call", "reads_cpu_scalars",
           "with_device_scalars"]

_VIEWS = (torch.ops.aten.view.default, torch.ops.aten._unsafe_view.default)
_RESHAPE = torch.ops.aten.reshape.default
_ASSERT_METADATA = torch.ops.aten._assert_tensor_metadata.default


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


def reads_cpu_scalars(node: torch.fx.Node) -> bool:
    """Whether node (an fx node or a table's) is a prim reading a value recorded as a 0-dim CPU tensor (see
    the module's docstring)."""
    if not (isinstance(node.target, torch._ops.OpOverload) and node.target.namespace == "prims"):
        return False
    inputs = [a for a in pytree.tree_leaves((node.args, node.kwargs)) if isinstance(a, NODES)]
    return any(getattr(v, "shape", None) == () and getattr(v, "device", None) == torch.device("cpu")
               for v in (n.meta.get("val") for n in inputs))


def with_device_scalars(fn):
    """fn called with each 0-dim tensor argument that is not on the CPU expanded to the shape of its
    tensor arguments of more dimensions (a view: no copy), as an elementwise prim takes it."""
    def call(*args, **kwargs):
        shape = next((a.shape for a in args if isinstance(a, torch.Tensor) and a.dim()), None)
        if shape is not None:
            args = tuple(a.expand(shape) if isinstance(a, torch.Tensor) and a.dim() == 0 and a.device.type != "cpu"
                         else a for a in args)
        return fn(*args, **kwargs)
    return call


def moves_autocast(gm: torch.fx.GraphModule, device: torch.device, autocast_from: frozenset) -> bool:
    """Whether gm or any of its subgraphs has an autocast region that the runtime moves to device's type."""
    return any(_moved_autocast(n, autocast_from, device) is not None for _, g in walk_graphs(gm) for n in g.graph.nodes)


def moved_call(target, args: tuple, kwargs: dict, *, other_device: bool, autocast_moved: bool):
    """(target, args, kwargs) of a call as a program recorded on another device type runs it (see the
    module's docstring); the call itself where nothing moves."""
    if other_device and target in _VIEWS:
        return _RESHAPE, args, kwargs
    if autocast_moved and target is _ASSERT_METADATA:
        args = tuple(None if i == 3 else a for i, a in enumerate(args))  # (a, size, stride, dtype)
        return target, args, {k: v for k, v in kwargs.items() if k != "dtype"}
    return target, args, kwargs


def retarget_devices(gm: torch.fx.GraphModule, device: torch.device,
                     autocast_from: frozenset = frozenset()) -> torch.fx.GraphModule:
    """A copy of a (sub)graph module whose baked-in devices all read `device`, whose autocast regions for
    a device type in `autocast_from` autocast device's type, and whose calls are loosened as moved_call
    says (gm itself if nothing differs)."""
    other_device = bool(autocast_from) and device.type not in autocast_from
    has_views = other_device and any(n.target in _VIEWS for _, g in walk_graphs(gm) for n in g.graph.nodes)
    if not has_views and not uses_other_device(gm, device, autocast_from):
        return gm
    autocast_moved = moves_autocast(gm, device, autocast_from)
    gm = copy.deepcopy(gm)
    for _, g in walk_graphs(gm):
        for node in g.graph.nodes:
            if _node_devices(node):
                node.args = _map_devices(node.args, device)
                node.kwargs = _map_devices(node.kwargs, device)
            moved = _moved_autocast(node, autocast_from, device)
            if moved is not None:
                node.args = moved
            if node.op == "call_function":
                node.target, node.args, node.kwargs = moved_call(node.target, tuple(node.args), dict(node.kwargs),
                                                                 other_device=other_device,
                                                                 autocast_moved=autocast_moved)
        g.recompile()
    return gm.to(device)
