"""The .pt2b format version constants, with the history of every bump.

Same major: readable (unknown newer fields ignored). Older major: upgraded. Newer: refused.
"""

from __future__ import annotations

# History (newest last). Each bump says what changed and why.
#   1.0  first release: preamble + 64-byte header, data section of 64-byte aligned
#        segments, FlatBuffers `Program` (schemas/pt2b.fbs) mirroring torch.export's
#        serialization schema 8.20, CRC32 checksums, operator schema table.
FORMAT_MAJOR = 1
FORMAT_MINOR = 0

FORMAT_VERSION = (FORMAT_MAJOR, FORMAT_MINOR)

# Every released format version (goldens in tests/golden/<v>/, schema in schemas/history/<v>/).
KNOWN_VERSIONS: dict[tuple[int, int], str] = {
    (1, 0): "first release",
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
