"""Reading the inputs and expected outputs stored beside golden artifacts (numpy, no pickle)."""

from __future__ import annotations

import json

import numpy as np
import torch
import torch.utils._pytree as pytree


def load_io(path) -> tuple[object, object]:
    """(inputs, expected outputs) pytrees from a <name>.io.npz written by tests/golden/make_goldens.py."""
    with np.load(path, allow_pickle=False) as data:
        trees = []
        for prefix in ("in", "out"):
            leaves = [torch.from_numpy(data[x["t"]].copy()) if "t" in x else x["v"]
                      for x in json.loads(str(data[f"{prefix}_leaves"]))]
            trees.append(pytree.tree_unflatten(leaves, pytree.treespec_loads(str(data[f"{prefix}_spec"]))))
    return trees[0], trees[1]
