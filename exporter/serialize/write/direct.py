"""Big weight sections written around the page cache (O_DIRECT, Linux).

A buffered write of gigabytes is mostly the kernel's own work: each page is allocated in the page
cache, copied into and, once the cache is full, reclaimed from under some other file, which on a
shared machine costs seconds of kernel time per GB. The same bytes written with O_DIRECT go from the
process's memory to the disk by DMA, in a fraction of the time and of the CPU time (the timings:
docs/journal/code-notes.md).

O_DIRECT wants the memory, the file offset and the length aligned to the disk's block. Tensor
memory is not page-aligned (torch's allocator aligns to 64 bytes), so the bytes pass through two
page-aligned buffers: one is filled (a memcpy, without the GIL) while the other is written. The stream
covers the file from offset 0 to the data section's end, its last block padded with zeros and the file
then cut back to that end; the header and the program table are written through the ordinary file.

Where O_DIRECT is missing (macOS, Windows) or refused (tmpfs before Linux 6.6, some network or FUSE
filesystems), or the data section is small enough for the page cache to be the cheaper road, the
writer keeps its buffered write (``open_direct`` returns None). So it does on a filesystem that takes
direct writes but serves them slower than the page cache (a disk that wants many requests in flight,
some network filesystems): ``faster_here`` times one small write each way, once per filesystem and
process. ``PT2B_DIRECT_WRITES=0`` (or off/false/no) in the environment keeps the buffered write always.
"""

from __future__ import annotations

import concurrent.futures
import errno
import mmap
import os
import secrets
import time

import numpy as np

from ...util.env_switch import env_switch

DIRECT_FROM = 256 << 20  # data sections at least this big are written with O_DIRECT
BLOCK = 4096  # the alignment asked of memory, offsets and lengths (a page: every common disk's block divides it)
BUFFER = 16 << 20  # bytes per write: each of the two buffers
DATASYNC = getattr(os, "fdatasync", os.fsync)  # the data alone (macOS and Windows have fsync only)


def open_direct(path: str, nbytes: int) -> int | None:
    """A file descriptor of ``path`` (created already) opened for direct writes, or None where the writer
    should write ``nbytes`` of weights through the page cache instead (see the module's docstring)."""
    if not getattr(os, "O_DIRECT", 0) or nbytes < DIRECT_FROM or not env_switch("PT2B_DIRECT_WRITES", True):
        return None
    if not faster_here(os.path.dirname(os.path.abspath(path))):
        return None
    return _open_proved(path)


def _open_proved(path: str) -> int | None:
    """``path`` (created already) opened with O_DIRECT, the descriptor proved by writing one block of zeros
    at offset 0 (filesystems that accept the flag at open but not the write exist); None where refused."""
    flag = getattr(os, "O_DIRECT", 0)
    if not flag:
        return None
    try:
        fd = os.open(path, os.O_WRONLY | flag | getattr(os, "O_CLOEXEC", 0))
    except OSError:
        return None
    probe = mmap.mmap(-1, BLOCK)
    try:
        os.pwrite(fd, probe, 0)
    except OSError:
        os.close(fd)
        return None
    finally:
        probe.close()
    return fd


def folder_takes_direct_writes(folder) -> bool:
    """Whether the filesystem of ``folder`` takes direct writes (a probe file made, proved as open_direct
    proves a descriptor, and removed), however fast: what the tests and the benchmark ask before they
    count on it."""
    probe = os.path.join(os.fspath(folder), ".pt2b-direct-probe")
    open(probe, "wb").close()
    try:
        fd = _open_proved(probe)
    finally:
        os.remove(probe)
    if fd is None:
        return False
    os.close(fd)
    return True


# The probe: PROBE_ROUNDS writes each way of one BUFFER (what one direct write call sends), in turns,
# each synced. A write this small finds free pages in the page cache, its best case; at gigabytes the
# page cache also reclaims pages from other files, which direct writes never pay. So direct writes are
# kept unless they measure clearly slower than that best case (SLOWER_BY): a tie is noise.
PROBE_ROUNDS = 2
SLOWER_BY = 1.25
_faster: dict[int, bool] = {}  # st_dev of a filesystem -> whether direct writes are the faster road there


def faster_here(folder) -> bool:
    """Whether direct writes are the faster road into ``folder``'s filesystem: measured (``measure``) the
    first time this process writes big weights there, then remembered for the filesystem."""
    key = os.stat(folder).st_dev
    if key not in _faster:
        _faster[key] = measure(folder)
    return _faster[key]


def measure(folder) -> bool:
    """Time PROBE_ROUNDS writes of BUFFER bytes each way into ``folder`` (a hidden temp file each, removed):
    whether the direct ones took at most SLOWER_BY times the buffered ones. False where the filesystem
    refuses a direct write, or the folder refuses the probe (the writer's own write then reports why)."""
    data = mmap.mmap(-1, BUFFER)
    try:
        data.write(os.urandom(1 << 20) * (BUFFER >> 20) + bytes(BUFFER % (1 << 20)))  # not zeros: no filesystem skips them
        took = {False: 0.0, True: 0.0}
        for r in range(PROBE_ROUNDS):
            for use_direct in ((False, True) if r % 2 == 0 else (True, False)):  # in turns: drift hits both alike
                took[use_direct] += _timed_write(folder, data, use_direct)
    except OSError:
        return False
    finally:
        data.close()
    return took[True] <= SLOWER_BY * took[False]


def _timed_write(folder, data: mmap.mmap, use_direct: bool) -> float:
    """Seconds to create a file in ``folder``, write ``data`` (page-aligned) to it and sync it; removed after."""
    path = os.path.join(os.fspath(folder), f".pt2b-probe.{secrets.token_hex(6)}.tmp")  # hidden, never *.pt2b
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0)
    start = time.perf_counter()
    fd = os.open(path, flags | (os.O_DIRECT if use_direct else 0), 0o600)
    try:
        view = memoryview(data)
        try:
            _pwrite_all(fd, view, 0)
        finally:
            view.release()
        DATASYNC(fd)
        return time.perf_counter() - start
    finally:
        os.close(fd)
        os.remove(path)


class DirectSink:
    """A file-like ``write`` for the bytes from the file's offset 0 on, sent to ``fd`` (from open_direct)
    in aligned blocks of BUFFER bytes. ``close()`` writes what is left, padded with zeros to the block,
    and cuts the file back to the bytes given; the caller writes what follows through its buffered file."""

    def __init__(self, fd: int):
        self.fd = fd
        self.pos = 0  # the file offset of the current buffer's first byte
        self.fill = 0  # bytes in the current buffer
        self._maps = [mmap.mmap(-1, BUFFER) for _ in range(2)]
        self._views = [np.frombuffer(m, dtype=np.uint8) for m in self._maps]
        self._turn = 0
        self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="pt2b-direct")
        self._pending: concurrent.futures.Future | None = None

    def write(self, data) -> int:
        """Copy ``data`` (bytes or a memoryview of tensor memory) into the buffers, writing each as it fills."""
        src = memoryview(data).cast("B")
        n, done = len(src), 0
        while done < n:
            take = min(n - done, BUFFER - self.fill)
            # numpy's copy: one thread, the GIL released (torch's copy_ on its thread pool spins threads
            # that take the cores the hashes need)
            self._views[self._turn][self.fill:self.fill + take] = np.frombuffer(src[done:done + take], dtype=np.uint8)
            self.fill += take
            done += take
            if self.fill == BUFFER:
                self._send(BUFFER)
        return n

    def _send(self, length: int) -> None:
        """Write the current buffer's first ``length`` bytes (a multiple of BLOCK) on the I/O thread, after
        the write before it; the next bytes go to the other buffer."""
        self._wait()
        view = memoryview(self._maps[self._turn])[:length]
        self._pending = self._pool.submit(_pwrite_all, self.fd, view, self.pos)
        self.pos += length
        self.fill = 0
        self._turn ^= 1

    def _wait(self) -> None:
        if self._pending is not None:
            pending, self._pending = self._pending, None
            pending.result()

    def close(self) -> int:
        """Write the rest (its last block padded with zeros, which the file is then cut back from); the file
        offset where the bytes given end."""
        fill = self.fill
        end = self.pos + fill
        try:
            padded = -(-fill // BLOCK) * BLOCK
            if padded:
                self._views[self._turn][fill:padded] = 0
                self._send(padded)
            self._wait()
            if padded != fill:
                os.ftruncate(self.fd, end)
        finally:
            self.abandon()
        return end

    def abandon(self) -> None:
        """Stop: no more writes (the one under way finishes), the buffers and the descriptor released."""
        self._pool.shutdown(wait=True, cancel_futures=True)
        self._pending = None
        self._views, self._maps = [], []  # unmapped once nothing views them
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def _pwrite_all(fd: int, view: memoryview, offset: int) -> None:
    while len(view):
        n = os.pwrite(fd, view, offset)
        if n <= 0:  # a disk that takes nothing raises ENOSPC at the next call; never loop on 0
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        view, offset = view[n:], offset + n
