"""Atomic file replacement: write a temp file in the same folder, fsync, rename.

A failure or a kill at any point leaves either no file or the previous file intact. A kill
may leave a stale temp file behind: it is hidden, named ``.<name>.<random>.tmp`` (never
``*.pt2b``, so no glob and no `pt2b upgrade folder/` takes it for an artifact) and never
at the destination name.
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import stat

from ..errors import ExportError

# NAME_MAX is 255 bytes on the usual filesystems: a destination name that fits must leave room
# for the temp file's dot, tag, random part and suffix.
_MAX_STEM_BYTES = 200


def check_destination(path) -> str:
    """The absolute destination path, or a clear ExportError if it cannot be written."""
    try:
        path = os.fspath(path)
    except TypeError:
        raise ExportError(f"destination must be a path (str or os.PathLike), got {type(path).__name__}.") from None
    if not path:
        raise ExportError("destination path is empty; give a file name such as 'model.pt2b'.")
    if os.path.isdir(path):
        raise ExportError(f"destination {path!r} is a directory; give a file name such as {os.path.join(path, 'model.pt2b')!r}.")
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise ExportError(f"destination folder {folder!r} does not exist; create it first.")
    return os.path.abspath(path)


def _create_temp(path: str, tag: str = "") -> tuple[int, str]:
    """(fd, name) of a new empty file next to ``path``, created like open(path, "wb") would
    create ``path`` (0o666 less the umask, not mkstemp's 0o600), or with ``path``'s permissions
    when it exists (replacing a file keeps its mode, as rewriting it in place would)."""
    folder, base = os.path.split(path)
    stem = base
    while len(os.fsencode(stem)) > _MAX_STEM_BYTES:
        stem = stem[:-1]
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_BINARY", 0)
    for _ in range(100):
        tmp = os.path.join(folder, f".{stem}.{tag}{secrets.token_hex(6)}.tmp")
        try:
            fd = os.open(tmp, flags, 0o666)
        except FileExistsError:
            continue
        break
    else:
        raise FileExistsError(errno.EEXIST, f"no free temp file name next to {path!r}")
    try:
        mode = stat.S_IMODE(os.stat(path).st_mode)
    except OSError:
        mode = None  # no previous file: the umask decided
    if mode is not None:
        with contextlib.suppress(OSError):  # e.g. not the owner: keep the default
            os.fchmod(fd, mode)
    return fd, tmp


def _sync_folder(folder: str) -> None:
    """Make a rename in ``folder`` durable (best effort: not every platform can open a folder)."""
    with contextlib.suppress(OSError):
        dfd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)


@contextlib.contextmanager
def atomic_write(path):
    """Yield a binary file; on clean exit it atomically replaces ``path``."""
    with atomic_path(path) as tmp, open(tmp, "wb") as f:
        yield f
        f.flush()
        os.fsync(f.fileno())


@contextlib.contextmanager
def atomic_path(path, tag: str = ""):
    """Yield the name of a new empty temp file next to ``path`` for the caller to write, sync
    and check by name (e.g. write an artifact there and load it back); on clean exit it
    atomically replaces ``path``, on any failure it is removed and ``path`` is left as it was."""
    path = check_destination(path)
    try:
        fd, tmp = _create_temp(path, tag)
        os.close(fd)
    except OSError as e:
        raise _as_export_error(e, path) from e
    try:
        yield tmp
        os.replace(tmp, path)
    except BaseException as e:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        if isinstance(e, OSError):
            raise _as_export_error(e, path) from e
        raise
    _sync_folder(os.path.dirname(path))


def _as_export_error(e: OSError, path: str) -> ExportError:
    if e.errno == errno.ENOSPC:
        return ExportError(f"cannot write {path!r}: the disk is full ({e.strerror}); free space and retry.")
    if e.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        return ExportError(f"cannot write {path!r}: permission denied ({e.strerror}); choose a writable folder.")
    if e.errno == errno.EISDIR:
        return ExportError(f"cannot write {path!r}: it is a directory; give a file name such as 'model.pt2b'.")
    return ExportError(f"cannot write {path!r}: {e.strerror or e}.")
