"""Which devices the running torch has a kernel of an op for: an op with device-specific kernels only (an
MPS attention) runs nowhere else, and pt2b names it before torch's dispatcher fails deep inside a run."""

from __future__ import annotations

import torch

from .._torch.dispatch import OpOverload
from ..ops import op_name

__all__ = ["kernel_devices", "without_kernel"]

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
