"""The .pt2b format version: the major written here, the minor and the fields each minor added
read from the schema (the `since`/`holds` attributes of schemas/pt2b.fbs), so that a field appended
to the schema is the whole of a compatible version bump. What each version changed and why:
schemas/FORMAT.md.

Same major: readable (unknown newer fields ignored). Older major: upgraded. Newer: refused.
"""

from __future__ import annotations

from ..layout import fbs

FORMAT_MAJOR = 1  # bumped by hand for an incompatible change (majors.py holds the steps from older ones)


def _fields_added() -> dict[tuple[int, int], dict[str, str]]:
    layout = fbs.layout()
    out: dict[tuple[int, int], dict[str, str]] = {}
    for field in layout.tables[layout.root]:
        if field.since is not None:
            out.setdefault(field.since, {})[field.name] = field.holds
    return dict(sorted(out.items()))


# Program-table fields each minor version added: writing an older minor leaves them out, and
# refuses (naming them) when the program uses them. Field -> what it holds, for that message.
FIELDS_ADDED: dict[tuple[int, int], dict[str, str]] = _fields_added()
FORMAT_MINOR = max((v[1] for v in FIELDS_ADDED if v[0] == FORMAT_MAJOR), default=0)
FORMAT_VERSION = (FORMAT_MAJOR, FORMAT_MINOR)

# Every released format version (goldens in tests/golden/<v>/, schema in schemas/history/<v>/).
KNOWN_VERSIONS: dict[tuple[int, int], str] = {
    (FORMAT_MAJOR, 0): "first release",
    **{v: "; ".join(f"{fbs.layout().root}.{name}: {holds}" for name, holds in fields.items())
       for v, fields in FIELDS_ADDED.items()},
}


def version_str(version: tuple[int, int]) -> str:
    return f"{version[0]}.{version[1]}"


def parse_version(text) -> tuple[int, int]:
    """(major, minor) of a released version named "X.Y"; ValueError naming the known ones otherwise."""
    try:
        major, minor = (int(x) for x in str(text).split("."))
    except ValueError:
        raise ValueError(f"format_version must look like 'MAJOR.MINOR' (e.g. '1.0'), got {text!r}") from None
    if (major, minor) not in KNOWN_VERSIONS:
        known = ", ".join(version_str(v) for v in sorted(KNOWN_VERSIONS))
        raise ValueError(f"format version {major}.{minor} does not exist; known versions: {known}")
    return major, minor
