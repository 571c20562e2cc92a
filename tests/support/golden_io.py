"""Reading the inputs and expected outputs stored beside golden artifacts (numpy, no pickle)."""

from __future__ import annotations

import json

import numpy as np
import torch
import torch.utils._pytree as pytree


def load_io(path) -> tuple[object, object]:
    """(inputs, expected outputs) pytrees from a <name>.io.npz written by tools/make_goldens.py."""
    with np.load(path, allow_pickle=False) as data:
        trees = []
        for prefix in ("in", "out"):
            leaves = [torch.from_numpy(data[x["t"]].copy()) if "t" in x else x["v"]
                      for x in json.loads(str(data[f"{prefix}_leaves"]))]
            trees.append(pytree.tree_unflatten(leaves, pytree.treespec_loads(str(data[f"{prefix}_spec"]))))
    return trees[0], trees[1]


# Stored outputs were computed on the machine that wrote the golden: another CPU (AVX-512/AMX against
# AVX2, another oneDNN path) changes the last bits of a float result, not its value. They are compared
# within a tolerance that follows the dtype; bits are compared with torch's own result on this machine.
STORED_TOLERANCE = {torch.float64: (1e-7, 1e-7), torch.float32: (1e-5, 1e-5), torch.float16: (1e-3, 1e-3),
                    torch.bfloat16: (1.6e-2, 1e-2), torch.complex64: (1e-5, 1e-5), torch.complex128: (1e-7, 1e-7)}


def assert_close_to_stored(out, expected) -> None:
    """``out`` equals outputs stored by another machine within STORED_TOLERANCE for each leaf's dtype
    (integers and bools exactly)."""
    lo, so = pytree.tree_flatten(out)
    le, se = pytree.tree_flatten(expected)
    assert so == se, f"output structure differs from the stored one: {so} != {se}"
    for x, y in zip(lo, le):
        if isinstance(y, torch.Tensor):
            rtol, atol = STORED_TOLERANCE.get(y.dtype, (0.0, 0.0))
            torch.testing.assert_close(x, y, rtol=rtol, atol=atol, equal_nan=True)
        else:
            assert x == y


def torchs_own_result(program, args, kwargs):
    """The program run through torch's own serializer and loader on this machine
    (torch.export.save, torch.export.load, .module()): what pt2b's load must give bitwise."""
    import copy
    import io

    buf = io.BytesIO()
    torch.export.save(program.exported_program(), buf)
    buf.seek(0)  # (run in the caller's grad mode, as pt2b's program is: no_grad picks another LSTM kernel)
    return torch.export.load(buf).module()(*copy.deepcopy(args), **copy.deepcopy(kwargs))
