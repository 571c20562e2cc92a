"""Write the running torch's operator registry (every aten and prims schema, and the dtypes
torch.export's serializer names) to schemas/ops/registry@<major.minor>.json, which pt2b ships as
package data (exporter/versioning/registries.py reads it). Run it in each release's venv:

    ~/.cache/pt2b-matrix/torch-2.11.0/bin/python -m tools.op_registry
    python -m tools.op_registry --check   # the stored one of the running release is current (exit 1 if not)
"""

from __future__ import annotations

import json
import pathlib
import sys

REPO = pathlib.Path(__file__).resolve().parents[1]


def write(path=None) -> pathlib.Path:
    from exporter.util.atomic import atomic_write
    from exporter.versioning import registries

    doc = registries.running_registry()
    path = pathlib.Path(path) if path else REPO / "schemas" / "ops" / registries.path_for(doc["torch"]).name
    text = '{\n"torch": %s,\n"scalar_types": %s,\n"ops": {\n%s\n}\n}\n' % (
        json.dumps(doc["torch"]), json.dumps(doc["scalar_types"]),
        ",\n".join(f"{json.dumps(k)}: {json.dumps(v)}" for k, v in doc["ops"].items()))
    with atomic_write(path) as f:
        f.write(text.encode())
    return path


def main(argv=None) -> int:
    from exporter.versioning import registries

    argv = sys.argv[1:] if argv is None else argv
    if argv == ["--check"]:
        differ = registries.differences()
        print("\n".join(differ) or "the stored registry is the running torch's")
        return 1 if differ else 0
    print(f"wrote {write()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
