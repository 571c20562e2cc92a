"""Write the schema-drift goldens of the RUNNING torch release into tests/golden/drift/torch-<release>/:
each program of tests/support/drift_cases.py (ops whose schemas differ between releases) as <name>.pt2b with
<name>.io.npz (inputs and the outputs torch.export's ``ep.module()`` gives on that release), and
manifest.json (the outputs of a case whose kernel does not run on CPU are None).
tests/releases/test_target_torch.py loads every release's on the running one: the op schemas
that differ are upgraded or downgraded, and the outputs match.

Refuses a folder that exists (goldens are never regenerated). Run it in each release's venv:
  ~/.cache/pt2b-matrix/torch-2.11.0/bin/python -m tools.make_drift_goldens
"""

from __future__ import annotations

import copy
import json
import shutil
import warnings

import torch

import exporter
from exporter import export_model
from tests.support.drift_cases import NOT_ON_CPU, cases
from tools.make_goldens import GOLDEN, save_io


def main() -> int:
    release = torch.__version__.split("+")[0]
    folder = GOLDEN / "drift" / f"torch-{release}"
    if folder.exists():
        print(f"{folder} exists: goldens are never regenerated")
        return 1
    folder.mkdir(parents=True)
    try:
        names = []
        for name, (model, args) in cases().items():
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # torch.qr's deprecation
                ep = export_model(model, args, folder / f"{name}.pt2b", metadata={"golden": name, "torch": release})
                out = None if name in NOT_ON_CPU else ep.module()(*copy.deepcopy(args))
                save_io(folder / f"{name}.io.npz", (args, {}), out)
            names.append(name)
            print(f"wrote {folder.name}/{name}")
        manifest = {"torch": torch.__version__, "release": release, "pt2b": exporter.__version__, "cases": names}
        (folder / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    except BaseException:
        shutil.rmtree(folder, ignore_errors=True)
        raise
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
