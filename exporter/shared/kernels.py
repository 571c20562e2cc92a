"""Which devices the running torch has a kernel of an op for: an op with device-specific kernels only (an
MPS attention) runs nowhere else, and pt2b names it before torch's dispatcher fails deep inside a run."""

from __future__ import annotations

import torch

from .._torch.dispatch import OpOverload
from ..ops import op_name

__all__ = ["kernel_devices", "without_kernel", "missing_kernels"]

# one kernel for every device: composite ops, the default kernels of custom ops and of prims
_EVERY_DEVICE = ("CompositeImplicitAutograd", "CompositeExplicitAutograd", "CompositeExplicitAutogradNonFunctional")
# a device type's dispatch keys: its dense kernels, and those of its quantized, sparse and nested tensors
_DEVICE_KEYS = {
    "cpu": ("CPU", "QuantizedCPU", "SparseCPU", "SparseCsrCPU", "NestedTensorCPU", "MkldnnCPU"),
    "cuda": ("CUDA", "QuantizedCUDA", "SparseCUDA", "SparseCsrCUDA", "NestedTensorCUDA"),
    "mps": ("MPS", "SparseMPS"),
    "xpu": ("XPU", "SparseXPU", "NestedTensorXPU"),
}


def kernel_devices(op) -> list[str] | None:
    """The device types the running torch has a kernel of ``op`` (an OpOverload) for; None where one
    kernel serves every device."""
    name, has = op.name(), torch._C._dispatch_has_kernel_for_dispatch_key
    if any(has(name, key) for key in _EVERY_DEVICE):
        return None
    return [device for device, keys in _DEVICE_KEYS.items() if any(has(name, key) for key in keys)]


def without_kernel(ops, device_type: str) -> dict[str, list[str]]:
    """op name -> the device types it has kernels for, for each OpOverload of ``ops`` that the running
    torch has no kernel of for ``device_type`` (a device type it does not know is left alone)."""
    if device_type not in _DEVICE_KEYS:
        return {}
    out = {}
    for op in ops:
        if not isinstance(op, OpOverload):
            continue
        devices = kernel_devices(op)
        if devices is not None and device_type not in devices:
            out[op_name(op)] = devices
    return out


def missing_kernels(gm: torch.fx.GraphModule, device: torch.device, runner: str) -> str | None:
    """The message naming every op of ``gm`` (its subgraphs too) that the running torch has no kernel of
    for ``device`` (an op captured where torch chose a device's own kernel, as MPS's attention), with the
    devices that have one and what to do; None where every op has one. ``runner``: what cannot run them."""
    from ..graph_walk import walk_graphs

    targets = {node.target for _, g in walk_graphs(gm) for node in g.graph.nodes if node.op == "call_function"}
    missing = without_kernel(targets, device.type)
    if not missing:
        return None
    lines = [f"program calls {len(missing)} operator(s) this torch has no {device.type} kernel for, so {runner} "
             f"cannot run them on {device}:"]
    lines += [f"  {name}: " + (f"kernels for {', '.join(devices)} only" if devices else
                                "no kernel on any device of this torch build (its name says which device it is for)")
              for name, devices in sorted(missing.items())]
    lines.append("Run it where torch has a kernel for them (load(path)(...) on that device), or lower it with a "
                 "decomposition of your own for each (load_for_backend(..., decompositions={op: fn})).")
    return "\n".join(lines)
