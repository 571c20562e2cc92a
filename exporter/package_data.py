"""pt2b's own data files, inside the package: the FlatBuffers schema (pt2b.fbs), the frozen presets
and audits (opsets/), the op registries of each torch release (ops/), the opset explorer's default
corpus routes (explorer/).

In a checkout ``exporter/_data`` is a link to ``schemas/``, the one source of truth; a wheel holds a
copy of the files the package reads (pyproject's package-data). Nothing at run time reads a path
outside the package. A file of pt2b's own that is missing or corrupt is an InstallationError naming
it, never an error about the user's path."""

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
