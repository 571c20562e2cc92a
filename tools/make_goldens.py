"""Write the golden artifacts of the CURRENT format version into tests/golden/<major.minor>/.

Goldens are added once per released format version and never regenerated: this script refuses
to touch a folder that already exists. Each case is <name>.pt2b plus <name>.io.npz holding the
inputs and the expected outputs (numpy, no pickle) and their pytree specs. From format 1.2 on, a
multi-method golden <name>.methods.pt2b holds as inputs a list of calls [method, args, kwargs], run
in order over one state, and as outputs their results. From format 1.4 on, <name>.subclass.pt2b holds a
tensor-subclass weight (tools/corpus/subclasses.py registers its class).
Usage: python -m tools.make_goldens
"""

from __future__ import annotations

import copy
import json
import pathlib
import sys

import numpy as np
import torch
import torch.utils._pytree as pytree

from exporter import export_model, load, load_for_backend
from exporter.versioning.formats import FORMAT_VERSION, version_str
from tools.corpus.zoo import make_case

GOLDEN = pathlib.Path(__file__).resolve().parents[1] / "tests" / "golden"

CASES = ["mlp", "cnn_bn", "cnn_bn_train", "lstm", "transformer_encoder", "transformer_decoder",
         "buffer_mutation", "pytree_io", "kwargs_only", "dynamic_shapes", "cond", "map", "while_loop",
         "custom_op", "tied_weights", "inplace_ops"]
LOWERED = [("mlp", "core"), ("cnn_bn", "core"), ("dynamic_shapes", "core")]


def save_io(path: pathlib.Path, inputs, outputs) -> None:
    """Tensor leaves as arrays; every leaf listed in JSON ({"t": key} or {"v": scalar})."""
    arrays = {}
    for prefix, tree in (("in", inputs), ("out", outputs)):
        leaves, spec = pytree.tree_flatten(tree)
        listing = []
        for i, leaf in enumerate(leaves):
            if isinstance(leaf, torch.Tensor):
                arrays[f"{prefix}_{i}"] = leaf.detach().numpy()
                listing.append({"t": f"{prefix}_{i}"})
            elif leaf is None or isinstance(leaf, (bool, int, float, str)):
                listing.append({"v": leaf})
            else:
                raise TypeError(f"{path.name}: leaf {i} is {type(leaf).__name__}; goldens hold tensors and scalars")
        arrays[f"{prefix}_spec"] = np.array(pytree.treespec_dumps(spec))
        arrays[f"{prefix}_leaves"] = np.array(json.dumps(listing))
    np.savez(path, **arrays)


def main() -> int:
    folder = GOLDEN / version_str(FORMAT_VERSION)
    if folder.exists():
        print(f"{folder} exists: goldens are never regenerated (add a new format version instead)")
        return 1
    folder.mkdir(parents=True)
    for name in CASES:
        case = make_case(name)
        kwargs = case.kwargs or {}
        ep = export_model(copy.deepcopy(case.model), case.args, folder / f"{name}.pt2b", kwargs=case.kwargs,
                          dynamic_shapes=case.dynamic_shapes, strict=case.strict,
                          metadata={"golden": name, "format": version_str(FORMAT_VERSION)})
        expected = ep.module()(*copy.deepcopy(case.args), **copy.deepcopy(kwargs))
        save_io(folder / f"{name}.io.npz", (case.args, kwargs), expected)
        print(f"wrote {name}")
    # lowered programs with their lowering record (format 1.1+): <case>.lowered-<preset>
    for name, preset in LOWERED:
        case = make_case(name)
        stem = f"{name}.lowered-{preset}"
        lowered = load_for_backend(folder / f"{name}.pt2b", preset, cache=False)
        export_model(lowered, path=folder / f"{stem}.pt2b",
                     metadata={"golden": stem, "format": version_str(FORMAT_VERSION)})
        kwargs = case.kwargs or {}
        expected = load(folder / f"{name}.pt2b")(*copy.deepcopy(case.args), **copy.deepcopy(kwargs))
        save_io(folder / f"{stem}.io.npz", (case.args, kwargs), expected)
        print(f"wrote {stem}")
    if FORMAT_VERSION >= (1, 2):  # several methods over one set of weights: <name>.methods
        write_methods_golden(folder)
    if FORMAT_VERSION >= (1, 4):  # a tensor-subclass weight: <name>.subclass
        write_subclass_golden(folder)
    return 0


def write_subclass_golden(folder: pathlib.Path) -> None:
    """scaled_linear.subclass: a linear layer whose weight is tools/corpus/subclasses.py's ScaledTensor,
    exported with torch.export.export (export_model(module) would unwrap it), so the file holds it as a
    tensor subclass (format 1.4); reading it needs that class registered."""
    from tools.corpus.subclasses import ScaledLinear

    stem = "scaled_linear.subclass"
    m, x = ScaledLinear(), torch.randn(3, 5, generator=torch.Generator().manual_seed(0))
    export_model(torch.export.export(m, (x,)), folder / f"{stem}.pt2b",
                 metadata={"golden": stem, "format": version_str(FORMAT_VERSION)})
    save_io(folder / f"{stem}.io.npz", ((x,), {}), m(x))
    print(f"wrote {stem}")


def write_methods_golden(folder: pathlib.Path) -> None:
    """tiny_kv.methods: a KV-cache decoder's prefill and decode (tools/corpus/methods.py TinyKV); its
    io holds a sequence of calls [method, args, kwargs] run in order over one state, and their outputs."""
    from tools.corpus.methods import TinyKV

    stem = "tiny_kv.methods"
    m = TinyKV().eval()
    prompt = torch.tensor([3, 14, 15, 9])
    export_model({"prefill": (m, (prompt, torch.arange(4))), "decode": (m, (torch.tensor([7]), torch.tensor([4])))},
                 folder / f"{stem}.pt2b", metadata={"golden": stem, "format": version_str(FORMAT_VERSION)})
    eager = copy.deepcopy(m)
    calls, outputs = [["prefill", (prompt, torch.arange(4)), {}]], []
    outputs.append(eager(*calls[0][1]))
    for pos in range(4, 8):
        calls.append(["decode", (outputs[-1][-1:].argmax(-1), torch.tensor([pos])), {}])
        outputs.append(eager(*calls[-1][1]))
    save_io(folder / f"{stem}.io.npz", calls, outputs)
    print(f"wrote {stem}")


if __name__ == "__main__":
    sys.exit(main())
