"""Each weight segment's checksum, computed in parallel: its sha256 where the file records digests
(format 1.3+; the CRC32 is then not computed, the digest being the stronger check of the same bytes),
else its CRC32. The CRC32 (layout.segments.crc32) and hashlib release the GIL on large buffers, so the
threads hash on every core, the segments largest first
(docs/benchmarks.md#big-models-against-the-physical-limits). Imports no torch: ``pt2b verify`` starts
hashing the file (``early``) while it imports torch and checks the program, and uses the result only
for the segments the verified program table then names.

What a result is checked against is the reader's business (integrity.check_segment_hashes); this module
only computes."""

from __future__ import annotations

import concurrent.futures
import dataclasses
import hashlib
import os
import threading

from ..layout.segments import crc32

# the bytes one task hashes at most: a CRC32 of a large segment is the CRC of its pieces chained in
# order, so a segment of several GB is not one core's work alone (its sha256 is: the hash is sequential)
CRC_PIECE = 64 << 20


@dataclasses.dataclass(frozen=True)
class Hashes:
    """The checksum of one segment: ``sha256`` when asked for, else ``crc32``."""

    crc32: int | None
    sha256: bytes | None


def _crc_chain(view, lo: int, hi: int) -> int:
    crc = 0
    for at in range(lo, hi, CRC_PIECE):
        crc = crc32(view[at:min(hi, at + CRC_PIECE)], crc)
    return crc


def _hash(view, start: int, n: int, sha256: bool) -> Hashes:
    """The Hashes of ``view[start:start + n]``: its sha256 when asked for, else its CRC32."""
    if sha256:
        return Hashes(None, hashlib.sha256(view[start:start + n]).digest())
    return Hashes(_crc_chain(view, start, start + n), None)


READ_PIECE = 16 << 20  # bytes one pread brings in for Early's hashing


def _hash_read(fd: int, start: int, n: int, sha256: bool, buf: bytearray) -> Hashes:
    """The Hashes of the ``n`` bytes at ``start`` of the file ``fd``, read in pieces into ``buf``."""
    view, h, crc, at, end = memoryview(buf), hashlib.sha256() if sha256 else None, 0, start, start + n
    try:
        while at < end:
            got = os.preadv(fd, [view[:min(len(buf), end - at)]], at)
            if got <= 0:
                raise OSError(f"the file ends at {at}, inside a segment")
            if h is not None:
                h.update(view[:got])
            else:
                crc = crc32(view[:got], crc)
            at += got
    finally:
        view.release()
    return Hashes(None, h.digest()) if h is not None else Hashes(crc, None)


def compute(buf, extents: list[tuple[int, int]], *, sha256: bool, workers: int | None = None) -> list[Hashes]:
    """The Hashes of each (start, nbytes) extent of ``buf`` (an mmap or bytes), in order."""
    view = memoryview(buf)
    workers = max(1, min(workers or os.cpu_count() or 1, 2 * len(extents) or 1))
    order = sorted(range(len(extents)), key=lambda i: -extents[i][1])  # the largest first: the pool ends together
    with concurrent.futures.ThreadPoolExecutor(max_workers=workers, thread_name_prefix="pt2b-hash") as pool:
        done = {i: pool.submit(_hash, view, *extents[i], sha256) for i in order}
        out = [done[i].result() for i in range(len(extents))]
    view.release()
    return out


class Early:
    """Hashing of a file's weight segments started before anything else is imported or checked (a
    thread reads the header and the program table with flatbuffers alone). One thread hashes, the
    segments largest first, so that the caller's own work (importing torch, checking the program)
    keeps a core; ``result(extents)`` then hashes what is left beside that thread and gives the
    Hashes when the file's extents are the ones hashed, else None: nothing read here is trusted."""

    def __init__(self, path):
        self._extents: list[tuple[int, int]] | None = None
        self._sha256 = False
        self._fd: int | None = None  # (a descriptor of its own: the caller's may close)
        self._todo: list[int] = []  # the segments no thread has taken yet, the largest last
        self._done: dict[int, Hashes] = {}
        self._failed = False
        self._lock = threading.Lock()
        self._ready = threading.Event()  # the extents are read (or cannot be)
        self._thread = threading.Thread(target=self._run, args=(os.fspath(path),), daemon=True,
                                        name="pt2b-early-hash")
        self._thread.start()

    def _run(self, path: str) -> None:
        try:
            self._read_extents(path)
        except Exception:  # noqa: BLE001 -- a file this cannot read is the reader's to refuse, with its error
            self._failed = True
        finally:
            self._ready.set()
        self._hash_until_done()

    def _read_extents(self, path: str) -> None:
        from ..generated import pt2b_generated as G
        from ..layout.container import HEADER_SIZE, unpack_header
        from ..layout.segments import read_segments

        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            header = unpack_header(f.read(HEADER_SIZE), path, size)
            f.seek(header.program_offset)
            program = G.Program.GetRootAs(f.read(header.program_size), 0)
            extents = [(header.data_offset + seg.offset, seg.nbytes) for seg in read_segments(program)]
            if any(s + n > size or s < 0 for s, n in extents) or sum(n for _, n in extents) > header.data_size:
                self._failed = True
                return
            self._fd = os.dup(f.fileno())
        self._extents, self._sha256 = extents, not program.WeightDigestsIsNone()
        self._todo = sorted(range(len(extents)), key=lambda i: extents[i][1])

    def _take(self) -> int | None:
        with self._lock:
            return self._todo.pop() if self._todo and not self._failed else None

    def _hash_until_done(self) -> None:
        """Hash segments until none is left to take (called by the thread, then by result()). Read with
        pread into a buffer, as the raw read-and-hash the benchmark compares with does, not through a
        mapping, whose page faults read a file not in the page cache a little at a time (on a busy
        machine the mapped hashing of a 2.07 GB file took 2.6-3.2 s where the raw one took 1.7 s).
        `pt2b verify` did not get faster for it: the hashing is not its critical path
        (docs/benchmarks.md#big-models-against-the-physical-limits)."""
        if self._fd is None:
            return
        buf = bytearray(READ_PIECE)
        try:
            while (i := self._take()) is not None:
                self._done[i] = _hash_read(self._fd, *self._extents[i], self._sha256, buf)
        except Exception:  # noqa: BLE001 -- as in _run: the reader hashes again and reports
            self._failed = True

    def result(self, extents: list[tuple[int, int]], *, sha256: bool) -> list[Hashes] | None:
        self._ready.wait()
        self._hash_until_done()
        self._thread.join()
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        if self._failed or self._extents != extents or len(self._done) != len(extents):
            return None
        if self._sha256 != sha256:  # the other kind of checksum
            return None
        return [self._done[i] for i in range(len(extents))]
