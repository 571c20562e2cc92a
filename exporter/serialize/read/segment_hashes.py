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
import select
import signal
import struct
import sys
import threading

from ...layout.segments import crc32

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
    """Hashing of a file's weight segments started before anything else is imported or checked (the
    header and the program table are read with flatbuffers alone). Nothing read here is trusted:
    ``result(extents)`` gives the Hashes only when the file's extents are the ones the caller's
    verified table names, else None (the caller then hashes them itself).

    Where the process can fork (Linux, no other thread running yet), a child process hashes, on every
    core but one (the caller's own work, importing torch and checking the program, keeps that one;
    two threads at least, so that the disk and a core work at once), and on that one too once the
    caller asks for the result.
    A thread of this process would hash the same bytes, but between its pieces it has to take the GIL
    back from an import of torch that holds it through long C calls, which slows the hashing enough
    that `pt2b verify` would wait for it.
    Elsewhere (``process=False``) one thread hashes, the segments in the file's order, and ``result()``
    hashes what is left beside it. ``close()`` (or leaving a ``with`` block) stops a child the caller no
    longer needs."""

    def __init__(self, path, *, process: bool | None = None):
        self._extents: list[tuple[int, int]] | None = None
        self._sha256 = False
        self._fd: int | None = None  # (a descriptor of its own: the caller's may close)
        self._todo: list[int] = []  # the segments no thread has taken yet, the next one to take last
        self._done: dict[int, Hashes] = {}
        self._failed = False
        self._lock = threading.Lock()
        self._ready = threading.Event()  # the extents are read (or cannot be)
        self._pid: int | None = None
        self._pipe: int | None = None  # the child's results, read by result()
        self._help: int | None = None  # to the child: the caller's core is free (result() was called)
        self._thread: threading.Thread | None = None
        self._closed = False  # close() was called: the thread takes no more segments
        self._thread_done = False  # the thread has returned (it no longer reads _fd)
        if _can_fork() if process is None else process:
            self._fork(os.fspath(path))
        else:
            self._thread = threading.Thread(target=self._run, args=(os.fspath(path),), daemon=True,
                                            name="pt2b-early-hash")
            self._thread.start()

    def __enter__(self) -> "Early":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _run(self, path: str) -> None:
        try:
            self._read_extents(path)
        except Exception:  # noqa: BLE001 -- a file this cannot read is the reader's to refuse, with its error
            self._failed = True
        finally:
            self._ready.set()
        try:
            self._hash_until_done()
        finally:
            with self._lock:
                self._thread_done = True
                if self._closed:  # close() left the descriptor to this thread, which was still reading
                    self._release_fd()

    def _fork(self, path: str) -> None:
        r, w = os.pipe()
        help_r, help_w = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: hash, send the results, exit without running anything of the caller's
            code = 1
            try:
                os.close(r)
                os.close(help_w)
                self._child(path, w, help_r)
                code = 0
            except BaseException:  # noqa: BLE001 -- any failure: the parent finds no results and hashes itself
                pass
            finally:
                os._exit(code)
        os.close(w)
        os.close(help_r)
        self._pid, self._pipe, self._help = pid, r, help_w

    def _child(self, path: str, out: int, help_fd: int) -> None:
        """Hash on every core but the caller's; once the caller asks for the result (a byte on
        ``help_fd``), on its core too: this thread joins the hashing."""
        self._read_extents(path)
        if self._failed or self._extents is None:
            return
        # at least two threads, so that one reads while the other hashes: one alone alternates between the
        # disk and the CPU, and leaves each idle half the time
        workers = max(1, min(max(2, (os.cpu_count() or 1) - 1), len(self._extents)))
        with concurrent.futures.ThreadPoolExecutor(max_workers=workers) as pool:
            running = [pool.submit(self._hash_until_done) for _ in range(workers)]
            waiting = True
            while waiting and not all(f.done() for f in running):
                if select.select([help_fd], [], [], 0.02)[0]:
                    waiting = False
                    if os.read(help_fd, 1):  # (nothing: the caller closed it, having failed)
                        self._hash_until_done()
        if self._failed:
            return
        data = bytearray(_COUNT.pack(len(self._extents), self._sha256))
        for i, (start, n) in enumerate(self._extents):
            h = self._done[i]
            data += _RECORD.pack(start, n, h.crc32 or 0, h.sha256 or bytes(32))
        view = memoryview(data)
        while view:
            view = view[os.write(out, view):]

    def _read_extents(self, path: str) -> None:
        from ...layout.generated import pt2b_generated as G
        from ...layout.container import HEADER_SIZE, unpack_header
        from ...layout.segments import read_segments
        from .section import read_program

        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            header = unpack_header(f.read(HEADER_SIZE), path, size)
            program = G.Program.GetRootAs(read_program(f, header, path), 0)  # its CRC32 first, in pieces
            extents = [(header.data_offset + seg.offset, seg.nbytes) for seg in read_segments(program)]
            if any(s + n > size or s < 0 for s, n in extents) or sum(n for _, n in extents) > header.data_size:
                self._failed = True
                return
            self._fd = os.dup(f.fileno())
        self._extents, self._sha256 = extents, not program.WeightDigestsIsNone()
        # in the file's order (the first taken last in the list), so the disk reads ahead sequentially:
        # taking the largest segments first makes a cold read seek
        self._todo = sorted(range(len(extents)), key=lambda i: -extents[i][0])

    def _take(self) -> int | None:
        with self._lock:
            return self._todo.pop() if self._todo and not (self._failed or self._closed) else None

    def _hash_until_done(self) -> None:
        """Hash segments until none is left to take (called by the hashing threads; then by result(),
        in process, or by the child's main thread once the caller's core is free). Read with pread
        into a buffer, as the raw read-and-hash the benchmark compares with does, not through a
        mapping, whose page faults read a file not in the page cache a little at a time."""
        if self._fd is None:
            return
        buf = bytearray(READ_PIECE)
        try:
            while (i := self._take()) is not None:
                self._done[i] = _hash_read(self._fd, *self._extents[i], self._sha256, buf)
        except Exception:  # noqa: BLE001 -- as in _run: the reader hashes again and reports
            self._failed = True

    def _child_results(self) -> None:
        """Read the child's results (until it closes the pipe, exiting) into _extents/_sha256/_done, or
        mark them failed; result() then reaps it (close)."""
        chunks = []
        while chunk := os.read(self._pipe, 1 << 16):
            chunks.append(chunk)
        data = b"".join(chunks)
        self._failed = True
        if len(data) < _COUNT.size:
            return
        n, sha256 = _COUNT.unpack_from(data)
        if len(data) != _COUNT.size + n * _RECORD.size:
            return
        extents, done = [], {}
        for i in range(n):
            start, nbytes, crc, digest = _RECORD.unpack_from(data, _COUNT.size + i * _RECORD.size)
            extents.append((start, nbytes))
            done[i] = Hashes(None, digest) if sha256 else Hashes(crc, None)
        self._extents, self._sha256, self._done, self._failed = extents, bool(sha256), done, False

    def result(self, extents: list[tuple[int, int]], *, sha256: bool) -> list[Hashes] | None:
        if self._pipe is not None:
            try:
                os.write(self._help, b"\1")  # this core is free: the child hashes on it too
            except OSError:  # (the child is done and gone)
                pass
            self._child_results()
        elif self._thread is not None:
            self._ready.wait()
            self._hash_until_done()
            self._thread.join()
        self.close()
        if self._failed or self._extents != extents or len(self._done) != len(extents):
            return None
        if self._sha256 != sha256:  # the other kind of checksum
            return None
        return [self._done[i] for i in range(len(extents))]

    def close(self) -> None:
        """Stop the child if it still runs (the caller failed before it asked for the result) and
        release what this holds. A thread still hashing takes no further segment and closes the file
        itself once it returns (it is a daemon, and finishes the segment it holds)."""
        if self._pid is not None:
            try:
                if os.waitpid(self._pid, os.WNOHANG) == (0, 0):
                    os.kill(self._pid, signal.SIGKILL)
                    os.waitpid(self._pid, 0)
            except ChildProcessError:
                pass
            self._pid = None
        for fd in (self._pipe, self._help):
            if fd is not None:
                os.close(fd)
        self._pipe = self._help = None
        with self._lock:
            self._closed = True
            if self._thread is None or self._thread_done:
                self._release_fd()

    def _release_fd(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def _can_fork() -> bool:
    """Whether Early may hash in a forked child: on Linux, before torch is imported and while no other
    thread runs (a fork copies only the calling thread; a lock another thread held, torch's thread
    pools' included, would stay held in the child)."""
    return (sys.platform.startswith("linux") and hasattr(os, "fork") and threading.active_count() == 1
            and "torch" not in sys.modules)


# the child's results: (segment count, sha256?), then per segment (start, nbytes, CRC32, sha256 digest)
_COUNT = struct.Struct("<Q?")
_RECORD = struct.Struct("<QQI32s")
