"""IREE through iree-turbine: ``iree.turbine.aot.export`` imports a torch.export program into MLIR
(torch-mlir's torch dialect) as it is, and the IREE compiler lowers it for the CPU (llvm-cpu). When
turbine exports a module itself it first decomposes with its own AOT table
(``iree.turbine.aot.decompositions.current_aot_decompositions()``: eval batch norm to arithmetic, ...)
and hands the compiler what that leaves; IREE publishes no op list. The preset does the same: that
table, read from the installed turbine, and every op it leaves accepted. The hand-off is the compiled
module (``.vmfb`` bytes); ``iree.runtime`` runs it on its local-task driver.

pip install iree-turbine iree-base-compiler iree-base-runtime
"""

from __future__ import annotations

import functools

import torch

from . import Backend, calling

TARGET = "llvm-cpu"
DRIVER = "local-task"


def _table() -> dict:
    from iree.turbine.aot.decompositions import current_aot_decompositions

    return {op: fn for op, fn in current_aot_decompositions().items() if isinstance(op, torch._ops.OpOverload)}


def hand_off(ep, *, target_backends: tuple[str, ...] = (TARGET,)):
    """``aot.export(ep)`` compiled for ``target_backends``: the module's bytes (a .vmfb file's contents)."""
    import iree.turbine.aot as aot

    output = aot.export(ep).compile(save_to=None, target_backends=target_backends)
    return bytes(output.map_memory()), ep


@functools.lru_cache(maxsize=8)
def _loaded(vmfb: bytes):
    import iree.runtime as rt

    config = rt.Config(DRIVER)
    return rt.load_vm_module(rt.VmModule.copy_buffer(config.vm_instance, vmfb), config)


def run(vmfb: bytes, ep, args, kwargs):
    leaves = calling.flat_inputs(ep, args, kwargs)
    result = _loaded(vmfb).main(*[leaf.numpy(force=True) if isinstance(leaf, torch.Tensor) else leaf
                                  for leaf in leaves])
    values = list(result) if isinstance(result, (tuple, list)) else [result]
    tensors = [torch.from_numpy(v.to_host().copy()) if hasattr(v, "to_host") else v for v in values]
    return calling.from_tensor_outputs(ep, tensors, leaves, "IREE")


def backend() -> Backend:
    from importlib.metadata import version

    return Backend("iree", f"{version('iree-base-compiler')}+turbine{version('iree-turbine')}", (),
                   "iree-turbine's current_aot_decompositions() (IREE publishes no op list)", _table, hand_off, run,
                   f"target {TARGET}, runtime driver {DRIVER}", takes_what_its_table_leaves=True)
