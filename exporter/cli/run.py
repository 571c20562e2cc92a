"""`pt2b run ART.pt2b`: lower an artifact and run it with the reference runtime (runtime_ref)."""

from __future__ import annotations

from ..errors import ExportError
from . import progress
from .lower import lower_from_args


def _read_inputs(paths, lowered):
    import numpy as np
    import torch

    if not paths:
        example = lowered.exported_program().example_inputs
        if example is None:
            raise ExportError("the artifact stores no example inputs; pass --inputs a.npy b.npy ...")
        return example
    args = []
    for p in paths:
        try:
            args.append(torch.from_numpy(np.load(p, allow_pickle=False)))
        except (OSError, ValueError) as e:
            raise ExportError(f"cannot read input {p!r} (a .npy file is expected): {e}") from None
    return tuple(args), {}


def run(ns) -> int:
    from .._torch.pytree import pytree

    from runtime_ref import Runtime

    lowered = lower_from_args(ns)
    with progress.status(f"running {ns.artifact} on runtime_ref"):
        rt = Runtime(lowered, device=ns.device, extra_ops=ns.extra_ops)
        args, kwargs = _read_inputs(ns.inputs, lowered)
        out = rt(*args, **kwargs)
    for i, leaf in enumerate(pytree.tree_leaves(out)):
        desc = f"{str(leaf.dtype).removeprefix('torch.')}{list(leaf.shape)}" if hasattr(leaf, "dtype") else repr(leaf)
        print(f"output {i}: {desc}")
    return 0
