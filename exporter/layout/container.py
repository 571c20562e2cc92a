"""The fixed-size start of every .pt2b file: the 8-byte preamble and the 64-byte header.

Layout (all little-endian), documented in schemas/FORMAT.md:
  0  4s  magic b"PT2B"          4  H  format major     6  H  format minor
  8  I   header size (64)       12 I  flags (0)
  16 Q   data offset            24 Q  data size        (weight segments live here)
  32 Q   program offset         40 Q  program size     (the FlatBuffers Program)
  48 I   program crc32          52 I  header crc32 (of bytes 0..52)
  56 Q   alignment of segments
"""

from __future__ import annotations

import dataclasses
import struct
import zlib

from ..errors import CorruptArtifactError, NotAnArtifactError

MAGIC = b"PT2B"
PREAMBLE = struct.Struct("<4sHH")
HEADER = struct.Struct("<4sHHIIQQQQIIQ")
HEADER_SIZE = HEADER.size  # 64
ALIGNMENT = 64
FILE_IDENTIFIER = b"P2BF"
assert HEADER_SIZE == 64
# FlatBuffers offsets are signed 32-bit, so no buffer, the program section included, reaches 2 GiB; a
# header that claims more is refused before the section is read
MAX_PROGRAM_SIZE = (1 << 31) - 1


@dataclasses.dataclass(frozen=True)
class Header:
    major: int
    minor: int
    data_offset: int
    data_size: int
    program_offset: int
    program_size: int
    program_crc32: int
    alignment: int = ALIGNMENT
    header_size: int = HEADER_SIZE
    flags: int = 0

    def pack(self) -> bytes:
        head = HEADER.pack(
            MAGIC, self.major, self.minor, self.header_size, self.flags,
            self.data_offset, self.data_size, self.program_offset, self.program_size,
            self.program_crc32, 0, self.alignment,
        )
        crc = zlib.crc32(head[:52])
        return head[:52] + struct.pack("<I", crc) + head[56:]


def align(n: int, a: int = ALIGNMENT) -> int:
    return (n + a - 1) // a * a


def read_preamble(buf, where: str) -> tuple[int, int]:
    """Format (major, minor) from the first 8 bytes; NotAnArtifactError if they are not ours."""
    if len(buf) < PREAMBLE.size:
        raise NotAnArtifactError(
            f"{where}: {len(buf)} bytes is too short to be a .pt2b artifact "
            f"(it must start with the 8-byte preamble b'PT2B'+major+minor)."
        )
    magic, major, minor = PREAMBLE.unpack_from(buf, 0)
    if magic != MAGIC:
        raise NotAnArtifactError(
            f"{where}: not a .pt2b artifact (first bytes {bytes(buf[:4])!r}, expected b'PT2B'). "
            f"Files written by torch.export.save (.pt2) can be converted with `pt2b convert`, which refuses a "
            f".pt2 holding pickled content (unpickling can run any code) unless given --trust-pickle."
        )
    return major, minor


def check_program_size(size: int, where: str) -> None:
    """A program section of ``size`` bytes is one the format can hold (a FlatBuffer under 2 GiB)."""
    if size > MAX_PROGRAM_SIZE:
        raise CorruptArtifactError(
            f"{where}: the header claims a program section of {size} bytes, more than a FlatBuffer can hold "
            f"({MAX_PROGRAM_SIZE} bytes: its offsets are 32-bit); the file is damaged or crafted.")


def unpack_header(buf, where: str, file_size: int) -> Header:
    """Parse and bounds-check the 64-byte header of a file of ``file_size`` bytes."""
    if len(buf) < HEADER_SIZE:
        raise CorruptArtifactError(
            f"{where}: truncated header ({len(buf)} of {HEADER_SIZE} bytes); the file is damaged."
        )
    (_, major, minor, header_size, flags, d_off, d_size, p_off, p_size, p_crc, h_crc,
     alignment) = HEADER.unpack_from(buf, 0)
    if zlib.crc32(bytes(buf[:52])) != h_crc:
        raise CorruptArtifactError(
            f"{where}: header checksum mismatch; the file is damaged (re-export or re-copy it)."
        )
    if header_size < HEADER_SIZE or header_size > file_size:
        raise CorruptArtifactError(f"{where}: header size {header_size} is invalid.")
    for name, off, size in (("data", d_off, d_size), ("program", p_off, p_size)):
        if off < header_size or off + size > file_size:
            raise CorruptArtifactError(
                f"{where}: {name} section [{off}, {off + size}) lies outside the file "
                f"({file_size} bytes); the file is truncated or damaged."
            )
    if alignment < 8 or alignment & (alignment - 1) or d_off % alignment:
        raise CorruptArtifactError(f"{where}: invalid segment alignment {alignment}.")
    check_program_size(p_size, where)
    return Header(major, minor, d_off, d_size, p_off, p_size, p_crc, alignment, header_size, flags)
