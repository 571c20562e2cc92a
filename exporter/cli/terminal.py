"""What the command line writes to a terminal: the streams that apply ``escape`` (exporter/util/visible.py)
to every line a command prints."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator

from ..util.visible import escape

__all__ = ["escape", "EscapedStream", "escaped_output", "raw"]


class EscapedStream:
    """A text stream that escapes (``escape(..., layout=True)``) everything written to it before
    handing it to ``raw``; everything else (isatty, fileno, encoding, flush) is the raw stream's."""

    def __init__(self, raw):
        self.raw = raw

    def write(self, text: str) -> int:
        self.raw.write(escape(text, layout=True))
        return len(text)

    def writelines(self, lines) -> None:
        for line in lines:
            self.write(line)

    def __getattr__(self, name):
        return getattr(self.raw, name)

    def __eq__(self, other):  # the same stream as the raw one (tqdm matches its bars' streams by ==)
        return self.raw == raw(other)

    def __hash__(self):
        return hash(self.raw)


def raw(stream):
    """The stream under an EscapedStream (what draws progress bars, whose control sequences are
    pt2b's own), or ``stream`` itself."""
    return stream.raw if isinstance(stream, EscapedStream) else stream


@contextlib.contextmanager
def escaped_output() -> Iterator[None]:
    """Around a command: sys.stdout and sys.stderr escape everything written to them (its output, its
    error line, the warnings and log lines of what it calls), then are put back."""
    saved = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = (s if s is None or isinstance(s, EscapedStream) else EscapedStream(s) for s in saved)
    try:
        yield
    finally:
        sys.stdout, sys.stderr = saved
