"""Atomic file replacement: write a temp file in the same folder, fsync, rename.

A failure or a kill at any point leaves either no file or the previous file intact.
"""

from __future__ import annotations

import contextlib
import errno
import os
import tempfile

from ..errors import ExportError


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


@contextlib.contextmanager
def atomic_write(path):
    """Yield a binary file; on clean exit it atomically replaces ``path``."""
    path = check_destination(path)
    folder, base = os.path.split(path)
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{base}.", suffix=".tmp", dir=folder)
    except OSError as e:
        raise _as_export_error(e, path) from e
    try:
        with os.fdopen(fd, "wb") as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as e:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        if isinstance(e, OSError):
            raise _as_export_error(e, path) from e
        raise
    with contextlib.suppress(OSError):
        dfd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)


def _as_export_error(e: OSError, path: str) -> ExportError:
    if e.errno == errno.ENOSPC:
        return ExportError(f"cannot write {path!r}: the disk is full ({e.strerror}); free space and retry.")
    if e.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        return ExportError(f"cannot write {path!r}: permission denied ({e.strerror}); choose a writable folder.")
    return ExportError(f"cannot write {path!r}: {e.strerror or e}.")
