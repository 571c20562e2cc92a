"""The .pt2b header as the mutators see it: its fields, the header CRC repaired after an edit, a
seed's file rebuilt around a changed program (program CRC and header CRC repaired)."""

from __future__ import annotations

import struct
import zlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .seeds import Seed

HEADER_FMT = struct.Struct("<4sHHIIQQQQIIQ")
HEADER_FIELDS = {  # name -> (offset, struct format)
    "major": (4, "<H"), "minor": (6, "<H"), "header_size": (8, "<I"), "flags": (12, "<I"),
    "data_offset": (16, "<Q"), "data_size": (24, "<Q"), "program_offset": (32, "<Q"),
    "program_size": (40, "<Q"), "program_crc": (48, "<I"), "alignment": (56, "<Q"),
}


def region(s: Seed, p: int) -> str:
    """Where offset ``p`` of seed ``s`` lies, for descriptions."""
    if p < 8:
        return "preamble"
    if p < 64:
        field = max((f for f in HEADER_FIELDS.items() if f[1][0] <= p), key=lambda f: f[1][0], default=None)
        return f"header {field[0] if field else ''}".strip() if p not in range(52, 56) else "header crc"
    for i, (off, n) in enumerate(s.segments):
        if off <= p < off + n:
            return f"segment {i}"
    if s.d_off <= p < s.d_off + s.d_size:
        return "data padding"
    if s.p_off <= p < s.p_off + s.p_size:
        return f"program+{p - s.p_off}"
    return "outside sections"


def fix_header_crc(buf: bytearray) -> None:
    struct.pack_into("<I", buf, 52, zlib.crc32(bytes(buf[:52])))


def with_program(s: Seed, program: bytes) -> bytearray:
    buf = bytearray(s.data[:s.p_off]) + program
    struct.pack_into("<Q", buf, 40, len(program))
    struct.pack_into("<I", buf, 48, zlib.crc32(program))
    fix_header_crc(buf)
    return buf
