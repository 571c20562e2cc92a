"""Inductor and AOTInductor, inside torch: the ops Inductor lowers itself or falls back to ATen for
(torch._inductor.lowering's ``lowerings`` and ``fallbacks``), the decompositions Inductor applies
itself (torch._inductor.decomposition.select_decomp_table), and the hand-off to AOTInductor
(``aoti_compile_and_package``; ``aoti_load_package`` runs the package)."""

from __future__ import annotations

import functools
import os
import tempfile

import torch

from . import Backend


def _supported_ops() -> tuple[str, ...]:
    from torch._inductor.lowering import fallbacks, lowerings

    ops = (op for op in (*lowerings, *fallbacks) if isinstance(op, torch._ops.OpOverload))
    return tuple(sorted({f"{op.namespace}::{op._opname}.{op._overloadname}" for op in ops}))


def _exported(lowered) -> torch.export.ExportedProgram:
    return lowered.exported_program() if hasattr(lowered, "exported_program") else lowered


def hand_off(lowered, *, package_path: str | None = None) -> str:
    """Compile ``lowered`` with AOTInductor into a package (a .pt2 zip) and return its path."""
    path = package_path or os.path.join(tempfile.mkdtemp(prefix="pt2b_aoti_"), "model.pt2")
    return torch._inductor.aoti_compile_and_package(_exported(lowered), package_path=path)


def run(package: str, *args):
    return torch._inductor.aoti_load_package(package)(*args)


@functools.cache  # read once a process: every load_for_backend(path, "inductor") plans with it
def _decompositions() -> dict:
    from torch._inductor.decomposition import select_decomp_table

    return {op: fn for op, fn in select_decomp_table().items() if isinstance(op, torch._ops.OpOverload)}


def backend() -> Backend:
    return Backend("inductor", torch.__version__.split("+")[0], _supported_ops(),
                   "torch._inductor.lowering.lowerings + fallbacks", _decompositions, hand_off, run)
