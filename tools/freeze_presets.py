"""Freeze the running torch's lowering presets into schemas/opsets/<preset>@<major.minor>.json (package
data: exporter/lowering/presets.py reads them), or print what changed across the frozen releases.

    python -m tools.freeze_presets [none core core-tag max]   # run in that release's venv
    python -m tools.freeze_presets --changes                  # docs/results.md's and docs/releases.md's section
"""

from __future__ import annotations

import pathlib
import sys

REPO = pathlib.Path(__file__).resolve().parents[1]


def freeze(names=None) -> list[pathlib.Path]:
    """Write the running torch's presets (all, or ``names``) to schemas/opsets/."""
    from exporter.lowering import presets

    folder = REPO / "schemas" / "opsets"
    folder.mkdir(parents=True, exist_ok=True)
    out = []
    for name in names or presets.PRESETS:
        p = presets.compute(name)
        path = folder / presets.frozen_path(name, p.torch_version).name
        path.write_text(p.to_json())
        out.append(path)
    return out


def main(argv=None) -> int:
    from exporter.lowering import presets

    argv = sys.argv[1:] if argv is None else argv
    if "--changes" in argv:
        print(presets.release_summary() + "\n\n" + presets.release_changes())
        return 0
    for written in freeze(argv or None):
        print(f"wrote {written}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
