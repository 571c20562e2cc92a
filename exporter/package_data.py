"""pt2b's own data files, inside the package: the FlatBuffers schema (pt2b.fbs), the frozen presets and
audits (opsets/), the op registries of each torch release (ops/), the opset explorer's default corpus
routes (explorer/), read from ``exporter/_data`` (a link to ``schemas/`` in a checkout, a copy in a
wheel). A missing or corrupt one is an InstallationError naming it: docs/architecture.md#errors."""

from __future__ import annotations

import json
import pathlib

from .errors import InstallationError

DATA = pathlib.Path(__file__).parent / "_data"


def path(*parts: str) -> pathlib.Path:
    return DATA.joinpath(*parts)


def _broken(p: pathlib.Path, what: str) -> InstallationError:
    return InstallationError(f"pt2b's own data file {p} {what}: the pt2b installation is broken; "
                             "reinstall it (pip install --force-reinstall pt2b).")


def read_text(*parts: str) -> str:
    p = path(*parts)
    try:
        return p.read_text(encoding="utf-8")
    except OSError as e:
        raise _broken(p, f"cannot be read ({e.strerror or type(e).__name__})") from e
    except UnicodeDecodeError as e:
        raise _broken(p, "is not UTF-8 text") from e


def read_json(*parts: str):
    text = read_text(*parts)
    try:
        return json.loads(text)
    except ValueError as e:
        raise _broken(path(*parts), f"is corrupt (not JSON: {e})") from e
