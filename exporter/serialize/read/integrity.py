"""The file-level checks of a .pt2b, which import no torch: the file opened as a regular file, its
preamble, version and header, the program section's CRC32 and identifier, the bounds of every table of
the program section (buffer_bounds), each weight segment within the data section and its checksum
against the program table's record (its sha256 digest, format 1.3+; its CRC32 before).

The reader (reader.py) runs these on every load before it decodes anything; ``pt2b verify --checksums``
runs them alone (verify_checksums): the copy of a file checked on a machine without torch, at the speed of
reading and hashing it. What they do not check is the program against the running torch (its ops, their
schemas, the state against the signature, the guards), which ``pt2b verify`` without the flag adds."""

from __future__ import annotations

import dataclasses
import mmap
import os
import stat

from ...errors import ArtifactError, CorruptArtifactError, NotAnArtifactError
from ...versioning import formats, majors
from ...layout.generated import pt2b_generated as G
from ...layout.container import FILE_IDENTIFIER, HEADER_SIZE, Header, read_preamble, unpack_header
from ...layout.segments import DIGEST_SIZE, read_segments
from . import buffer_bounds, section, segment_hashes


def open_regular(path: str, where: str):
    """``path`` opened for binary reading if it is a regular file. The open never blocks (O_NONBLOCK:
    a FIFO named like an artifact would wait forever for a writer); a directory, FIFO, device or
    socket is a NotAnArtifactError."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_BINARY", 0))
    except FileNotFoundError:
        raise ArtifactError(f"{where}: no such file.") from None
    except IsADirectoryError:
        raise NotAnArtifactError(f"{where} is a directory, not a .pt2b file.") from None
    except OSError as e:
        raise ArtifactError(f"{where}: cannot open ({e.strerror or e}).") from None
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        kind = ("a directory" if stat.S_ISDIR(mode) else "a FIFO (named pipe)" if stat.S_ISFIFO(mode)
                else "a socket" if stat.S_ISSOCK(mode) else "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode)
                else "not a regular file")
        raise NotAnArtifactError(f"{where} is {kind}, not a .pt2b file; pt2b reads regular files only.")
    if hasattr(os, "set_blocking"):
        os.set_blocking(fd, True)
    return os.fdopen(fd, "rb")


def open_checked(path, *, mapped: bool):
    """(path, header, file mapping or None, program bytes) after the preamble, version, header
    and program checksum checks (section.read_program: memory and reads set by the bytes on disk);
    the mapping (copy-on-write) is made only when ``mapped``."""
    try:
        path = os.fspath(path)
    except TypeError:
        raise ArtifactError(f"path must be str or os.PathLike, got {type(path).__name__}.") from None
    where = path
    f = open_regular(path, where)
    with f:
        size = os.fstat(f.fileno()).st_size
        head = f.read(HEADER_SIZE)
        major, minor = read_preamble(head, where)
        majors.check_readable((major, minor), where)  # older majors only when steps reach today's
        header = (majors.header_reader(major) or unpack_header)(head, where, size)  # today's unless a step says
        program_bytes = section.read_program(f, header, where)
        mm = section.map_file(f, where, mmap.ACCESS_COPY) if mapped else None
    return path, header, mm, program_bytes


def current_program(header: Header, program_bytes: bytes, where: str) -> tuple[bytes, list[str]]:
    """The program section brought to the current format major (majors' steps, one note each), with
    the file identifier checked."""
    notes = []
    if header.major < formats.FORMAT_MAJOR:  # an older major: its steps bring the program to today's
        raw, notes = majors.upgrade(majors.RawProgram((header.major, header.minor), header, program_bytes), where)
        program_bytes = raw.program
    if len(program_bytes) < 8 or not G.Program.ProgramBufferHasIdentifier(program_bytes, 0):
        raise CorruptArtifactError(f"{where}: program section lacks the file identifier {FILE_IDENTIFIER!r}.")
    return program_bytes, notes


def digests(raw: bytes | None, n_segments: int, where: str) -> list[bytes] | None:
    """The program's weight-digest bytes (format 1.3+; None: the file records none) as one sha256
    digest per segment."""
    if raw is None:
        return None
    raw = bytes(raw)
    if len(raw) != n_segments * DIGEST_SIZE:
        raise CorruptArtifactError(f"{where}: the program records {len(raw)} bytes of weight digests for "
                                   f"{n_segments} segments ({DIGEST_SIZE} bytes each); the file is damaged.")
    return [raw[i:i + DIGEST_SIZE] for i in range(0, len(raw), DIGEST_SIZE)]


def check_segment_bounds(offset: int, nbytes: int, data_size: int, index: int, where: str) -> None:
    """A weight segment lies within the data section."""
    if offset + nbytes > data_size:
        raise CorruptArtifactError(
            f"{where}: segment {index} [{offset}, {offset + nbytes}) lies outside the data section "
            f"({data_size} bytes); the file is truncated or damaged."
        )


def check_segment_hashes(hashes, segments, digests: list[bytes] | None, where: str) -> None:
    """Each segment's computed Hashes (segment_hashes) against the file's record: its sha256 digest
    where the file records digests (format 1.3+), else its CRC32. The CRC32 of a 1.3 file is left to
    readers of older formats: bytes its digest accepts are the bytes the writer hashed. The first
    damaged segment is named."""
    for index, (got, seg) in enumerate(zip(hashes, segments)):
        if digests is not None:
            failed = "sha256" if got.sha256 != digests[index] else None
        else:
            failed = "CRC32" if int(seg.nbytes) and got.crc32 != int(seg.checksum) else None
        if failed:
            raise CorruptArtifactError(
                f"{where}: checksum mismatch in weight segment {index} ({failed}); "
                f"the weights are damaged or are not the ones the program section records "
                f"(re-export or re-copy the file)."
            )


def segment_extents(header: Header, segments, where: str) -> list[tuple[int, int]]:
    """(file offset, nbytes) of each segment, each checked to lie within the data section, and all of
    them together no larger than it: the writer never overlaps segments, and hashing segments that
    claim the same bytes over and over would make a small file cost hashing many times its size."""
    out = []
    for i, seg in enumerate(segments):
        off, n = int(seg.offset), int(seg.nbytes)
        check_segment_bounds(off, n, header.data_size, i, where)
        out.append((header.data_offset + off, n))
    claimed = sum(n for _, n in out)
    if claimed > header.data_size:
        raise CorruptArtifactError(
            f"{where}: the weight segments claim {claimed} bytes in all, more than the data section's "
            f"{header.data_size}; segments never overlap, so the file is damaged or crafted.")
    return out


def hash_segments(buf, extents, digests_, early: segment_hashes.Early | None) -> list[segment_hashes.Hashes]:
    """Each extent's Hashes (sha256 where the file records digests, else CRC32), taken from ``early``
    where it hashed these very extents, else computed in parallel."""
    hashes = early.result(extents, sha256=digests_ is not None) if early is not None else None
    if hashes is None:
        hashes = segment_hashes.compute(buf, extents, sha256=digests_ is not None)
    return hashes


@dataclasses.dataclass(frozen=True)
class Checksums:
    """What verify_checksums checked: the format version, the methods and the weight bytes."""

    version: tuple[int, int]
    methods: int
    nbytes: int


def verify_checksums(path, early: segment_hashes.Early | None = None) -> Checksums:
    """Every file-level check of the artifact at ``path``, without torch: header, program checksum,
    every table's bounds (each method's graph included), each weight segment's bounds and checksum.
    A damaged file is a CorruptArtifactError naming the first damage found."""
    path, header, _, program_bytes = open_checked(path, mapped=False)
    where = path
    program_bytes, _ = current_program(header, program_bytes, where)
    buffer_bounds.check_buffer(program_bytes, where)  # every table, every graph: nothing left for later
    root = G.Program.GetRootAs(program_bytes, 0)
    segments = read_segments(root)
    recorded = digests(None if root.WeightDigestsIsNone() else root.WeightDigestsAsNumpy().tobytes(),
                       len(segments), where)
    extents = segment_extents(header, segments, where)
    with open_regular(path, where) as f:  # the header put the data section within the file
        mm = section.map_file(f, where, mmap.ACCESS_READ)
    try:
        check_segment_hashes(hash_segments(mm, extents, recorded, early), segments, recorded, where)
    finally:
        mm.close()
    return Checksums((header.major, header.minor), 1 + root.MethodsLength(), sum(s.nbytes for s in segments))
