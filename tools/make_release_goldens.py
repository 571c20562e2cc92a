"""Write the zoo goldens of the RUNNING torch release into tests/golden/torch-<release>/.

The cases and the lowered programs are make_goldens.py's (CASES, LOWERED), written by pt2b on the
torch this script runs on: <name>.pt2b plus <name>.io.npz (inputs and the outputs torch.export's
``ep.module()`` gives on that release), <case>.lowered-<preset>.pt2b (``load_for_backend`` on that
release, written back) with its .io.npz, and manifest.json (torch, pt2b and format versions, the
files). tests/releases/test_release_goldens.py reads every such folder on every release of the matrix.

Like make_goldens.py it refuses a folder that already exists: goldens are never regenerated.
Run it once per release, in that release's venv (tools/release_matrix.py makes them):
  ~/.cache/pt2b-matrix/torch-2.11.0/bin/python -m tools.make_release_goldens
"""

from __future__ import annotations

import copy
import json
import pathlib
import shutil
import sys

import torch

import exporter
from exporter import export_model, load, load_for_backend
from tools.corpus.zoo import make_case
from exporter.versioning.formats import FORMAT_VERSION, version_str
from tools.make_goldens import CASES, GOLDEN, LOWERED, save_io


def release() -> str:
    """The running torch's version without its local suffix ('2.11.0+cu130' -> '2.11.0')."""
    return torch.__version__.split("+")[0]


def write(folder: pathlib.Path) -> dict:
    """Write every case into ``folder`` (which must not exist); return the manifest written."""
    folder.mkdir(parents=True)
    meta = {"format": version_str(FORMAT_VERSION), "torch": release()}
    cases = []
    for name in CASES:
        case = make_case(name)
        kwargs = case.kwargs or {}
        ep = export_model(copy.deepcopy(case.model), case.args, folder / f"{name}.pt2b", kwargs=case.kwargs,
                          dynamic_shapes=case.dynamic_shapes, strict=case.strict, metadata={"golden": name, **meta})
        expected = ep.module()(*copy.deepcopy(case.args), **copy.deepcopy(kwargs))
        save_io(folder / f"{name}.io.npz", (case.args, kwargs), expected)
        cases.append(name)
        print(f"wrote {folder.name}/{name}")
    for name, preset in LOWERED:
        case = make_case(name)
        kwargs = case.kwargs or {}
        stem = f"{name}.lowered-{preset}"
        lowered = load_for_backend(folder / f"{name}.pt2b", preset, cache=False)
        export_model(lowered, path=folder / f"{stem}.pt2b", metadata={"golden": stem, **meta})
        expected = load(folder / f"{name}.pt2b")(*copy.deepcopy(case.args), **copy.deepcopy(kwargs))
        save_io(folder / f"{stem}.io.npz", (case.args, kwargs), expected)
        cases.append(stem)
        print(f"wrote {folder.name}/{stem}")
    manifest = {"torch": torch.__version__, "release": release(), "pt2b": exporter.__version__,
                "format": version_str(FORMAT_VERSION), "cases": cases}
    (folder / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    return manifest


def main() -> int:
    folder = GOLDEN / f"torch-{release()}"
    if folder.exists():
        print(f"{folder} exists: goldens are never regenerated")
        return 1
    try:
        write(folder)
    except BaseException:
        shutil.rmtree(folder, ignore_errors=True)  # a folder this run began is no golden yet
        raise
    return 0


if __name__ == "__main__":
    sys.exit(main())
