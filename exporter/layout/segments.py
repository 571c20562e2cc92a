"""What both directions agree on about weight segments: the names of the tensor kinds a record
carries, the checksum (CRC32) and digest (sha256, format 1.3+) recorded of every segment's bytes,
and a segment record as read straight from a program buffer."""

from __future__ import annotations

import dataclasses
import hashlib

from .generated import pt2b_generated as G

KIND_NAMES = {G.TensorKind.PARAMETER: "parameter", G.TensorKind.BUFFER: "buffer",
              G.TensorKind.CONSTANT: "constant", G.TensorKind.EXAMPLE_INPUT: "example input",
              G.TensorKind.SUBCLASS_PART: "tensor-subclass part"}

DIGEST_SIZE = 32  # sha256

try:  # zlib-ng's CRC32 (carry-less multiplication): the same checksum as zlib's, 5x as fast here
    from zlib_ng.zlib_ng import crc32
except ImportError:  # a platform without its wheel: the standard library's
    from zlib import crc32


def digest(data) -> bytes:
    """The digest format 1.3 records of a segment's bytes (sha256)."""
    return hashlib.sha256(data).digest()


@dataclasses.dataclass(frozen=True)
class Segment:
    """A weight segment's record (offset in the data section, size, CRC32) as the program table holds it."""

    offset: int
    nbytes: int
    checksum: int


def read_segments(program) -> list[Segment]:
    """Each segment record of a ``G.Program`` read through flatbuffers' accessors (nothing unpacked)."""
    return [Segment(s.Offset(), s.Nbytes(), s.Checksum())
            for s in (program.Segments(i) for i in range(program.SegmentsLength()))]
