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


def version_str(version: tuple[int, int]) -> str:
    return f"{version[0]}.{version[1]}"
