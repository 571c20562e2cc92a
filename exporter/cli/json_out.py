"""`--json` on the command line: a command's data, or its typed error, as the one JSON document on
stdout; while the command works, whatever it or a library prints goes to stderr instead."""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import math
import os
import sys
from collections.abc import Iterator

_pending: list = []  # the document the running command handed to emit(), written once stdout is back


def wanted(ns) -> bool:
    """Whether the command was given --json."""
    return bool(getattr(ns, "json", False))


def emit(doc: dict) -> None:
    """The command's document (plain data: dicts, lists, numbers, strings, dataclasses, paths), written
    to stdout when the command returns."""
    _pending[:] = [doc]


def plain(value):
    """``value`` as JSON's types: a dataclass as its fields, a path as its text, a tuple or set as a list,
    a key as a string; a float that is not finite (JSON has none) as null."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        value = {f.name: getattr(value, f.name) for f in dataclasses.fields(value)}
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [plain(v) for v in (sorted(value) if isinstance(value, (set, frozenset)) else value)]
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    return str(value)


def dumps(doc) -> str:
    """The document's text: ASCII only (every other character, and every control character, a JSON
    escape), so nothing a file holds reaches a terminal as a control sequence."""
    return json.dumps(plain(doc), indent=2, ensure_ascii=True, allow_nan=False)


def error_document(e: BaseException) -> dict:
    return {"error": {"type": type(e).__name__, "message": str(e)}}


def write(doc) -> None:
    """Print ``doc`` as the command's one JSON document."""
    sys.stdout.write(dumps(doc) + "\n")
    sys.stdout.flush()


@contextlib.contextmanager
def stdout_aside(on: bool) -> Iterator[None]:
    """With ``on``: stdout is stderr while the command runs (Python's print and, where stdout is a file
    descriptor, what native code writes to it), and the document emit() was given is written to the
    real stdout after; without ``on``, nothing changes."""
    if not on:
        yield
        return
    _pending.clear()
    saved, fd, saved_fd = sys.stdout, None, None
    try:
        fd = saved.fileno()
        saved.flush()
        saved_fd = os.dup(fd)
        os.dup2(sys.stderr.fileno(), fd)
    except (AttributeError, OSError, ValueError, io.UnsupportedOperation):  # an in-process stream: Python's level alone
        fd = saved_fd = None
    sys.stdout = sys.stderr
    try:
        yield
    finally:
        sys.stdout.flush()
        sys.stdout = saved
        if saved_fd is not None:
            os.dup2(saved_fd, fd)
            os.close(saved_fd)
    if _pending:
        write(_pending.pop())
