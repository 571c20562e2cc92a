"""The program section read from a file with memory and work set by the bytes on disk: its CRC32
computed in bounded pieces (holes not read) before any of it is copied, then its bytes. Imports no torch."""

from __future__ import annotations

import dataclasses
import errno
import mmap
import os

from ...errors import ArtifactError, CorruptArtifactError
from ...layout.container import Header, check_program_size
from ...layout.segments import crc32

PIECE = 1 << 20  # the most bytes one read of the checksum pass brings into memory


@dataclasses.dataclass
class Reads:
    """What the section reads of this process took, counted for tests that bound memory without a
    clock: ``pieces`` read by the checksum pass, ``largest`` buffer any read or copy took (bytes)."""

    pieces: int = 0
    largest: int = 0

    def took(self, nbytes: int) -> None:
        self.largest = max(self.largest, nbytes)


READS = Reads()


def read_program(f, header: Header, where: str) -> bytes:
    """The program section of the open file ``f``, after its CRC32 matched the header's. Its size
    is checked first (a FlatBuffer under 2 GiB), its CRC32 computed in pieces of PIECE bytes; a section more than half made of holes
    (regions never written, which read as zeros but take no disk) is refused before it is copied:
    pt2b writes every byte of it, so only a crafted file, or a sparse copy of one, claims its memory
    without holding the bytes. The copy's own CRC32 is checked again: the bytes parsed are the bytes
    checked, even where the file changed in between."""
    off, size = header.program_offset, header.program_size
    check_program_size(size, where)
    crc, holes = _crc_in_pieces(f, off, size, where)
    if crc != header.program_crc32:
        raise CorruptArtifactError(f"{where}: program section checksum mismatch; the file is damaged "
                                   f"(re-export or re-copy it).")
    if 2 * holes > size:
        raise CorruptArtifactError(
            f"{where}: the program section claims {size} bytes but {holes} of them are holes the file does not "
            f"hold on disk; pt2b writes every byte of it, so the file is crafted or a sparse copy (re-copy it "
            f"without holes, e.g. cp --sparse=never).")
    READS.took(size)
    try:
        data = _read(getattr(f, "raw", f), off, size)
    except MemoryError:
        raise ArtifactError(f"{where}: not enough memory to read its {size}-byte program section.") from None
    if len(data) != size or crc32(data) != header.program_crc32:
        raise CorruptArtifactError(f"{where}: the program section changed or ended while it was read; "
                                   f"read it again once nothing writes the file.")
    return data


def _read(raw, off: int, size: int) -> bytes:
    """``size`` bytes at ``off`` of the unbuffered file ``raw`` (fewer where it ends first)."""
    raw.seek(off)
    data = raw.read(size) or b""
    while len(data) < size:  # (one read returns at most about 2 GiB)
        more = raw.read(size - len(data))
        if not more:
            break
        data += more
    return data


def map_file(f, where: str, access: int) -> mmap.mmap:
    """The whole open file ``f`` mapped; a mapping the system refuses (address space or memory
    limits) is an ArtifactError naming the file and its size."""
    try:
        return mmap.mmap(f.fileno(), 0, access=access)
    except (OSError, MemoryError, OverflowError, ValueError) as e:
        size = os.fstat(f.fileno()).st_size
        why = getattr(e, "strerror", None) or str(e) or type(e).__name__
        raise ArtifactError(f"{where}: cannot map the file ({size} bytes) into memory ({why}); the process's "
                            f"address-space or memory limit (ulimit -v) is below the file's size: raise it.") from None


def _crc_in_pieces(f, off: int, size: int, where: str) -> tuple[int, int]:
    """(CRC32 of the ``size`` bytes at ``off``, how many of them are holes): data read in pieces of
    at most PIECE bytes into one buffer; the CRC of a hole's zeros computed, not read."""
    raw = getattr(f, "raw", f)  # (unbuffered: the runs' seeks move the descriptor's position)
    buf = bytearray(min(PIECE, size))
    view = memoryview(buf)
    crc, holes = 0, 0
    READS.took(len(buf))
    try:
        for at, n, data in _runs(raw.fileno(), off, off + size):
            if not data:
                crc, holes = crc32_zeros(crc, n), holes + n
                continue
            raw.seek(at)
            while n:
                got = raw.readinto(view[:min(n, len(buf))])
                if not got:
                    raise CorruptArtifactError(f"{where}: the file ends at byte {at}, inside its program section; "
                                               f"the file is truncated or changed while it was read.")
                READS.pieces += 1
                crc = crc32(view[:got], crc)
                at, n = at + got, n - got
    finally:
        view.release()
    return crc, holes


def _runs(fd: int, start: int, end: int):
    """(offset, nbytes, holds data) runs covering [start, end) of the file: data and holes, as the
    filesystem tells them (SEEK_DATA/SEEK_HOLE); all data where it cannot."""
    seek_data, seek_hole = getattr(os, "SEEK_DATA", None), getattr(os, "SEEK_HOLE", None)
    pos = start
    while pos < end:
        try:
            if seek_data is None:
                raise OSError(errno.EINVAL, "no SEEK_DATA")
            data = os.lseek(fd, pos, seek_data)
            hole = os.lseek(fd, data, seek_hole) if data < end else end
        except OSError as e:
            # ENXIO: no data from pos to the end of the file, one hole; else the filesystem cannot tell
            yield pos, end - pos, e.errno != errno.ENXIO
            return
        if min(data, end) > pos:
            yield pos, min(data, end) - pos, False
        if data >= end:
            return
        hole = min(max(hole, data + 1), end)
        yield data, hole - data, True
        pos = hole


# CRC-32 arithmetic over GF(2), polynomials bit-reversed as zlib stores them (zlib's crc32_combine):
# the CRC of n zero bytes appended is a product, computed without reading or holding them
_POLY = 0xEDB88320


def _mulmod(a: int, b: int) -> int:
    """a * b modulo CRC-32's polynomial."""
    m, p = 1 << 31, 0
    while m:
        if a & m:
            p ^= b
        b = (b >> 1) ^ _POLY if b & 1 else b >> 1
        m >>= 1
    return p


def _x_to_8n(n: int) -> int:
    """x^(8n) modulo CRC-32's polynomial, by squaring."""
    p, square = 1 << 31, 1 << 23  # x^0, and x^8 (one byte)
    while n:
        if n & 1:
            p = _mulmod(square, p)
        square = _mulmod(square, square)
        n >>= 1
    return p


def crc32_zeros(crc: int, n: int) -> int:
    """zlib.crc32(bytes(n), crc), in work logarithmic in ``n``."""
    return _mulmod(_x_to_8n(n), crc ^ 0xFFFFFFFF) ^ 0xFFFFFFFF
