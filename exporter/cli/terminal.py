"""What the command line writes to a terminal: text from a file shown as visible escapes, never as
control sequences (``escape``), and the streams that apply it to every line a command prints."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator

# Characters a terminal acts on instead of showing: C0 controls, DEL, C1 controls (an 8-bit CSI or
# OSC needs no ESC), and the bidirectional overrides, embeddings, isolates and marks that reorder
# what is shown around them. A file's strings may hold any of them (an OSC 52 sequence writes the
# clipboard, OSC 0 retitles the window, CSI 2K erases a line); each is written as its Python escape.
_ACTIVE = [*range(0x00, 0x20), 0x7F, *range(0x80, 0xA0), 0x061C, 0x200E, 0x200F, *range(0x202A, 0x202F),
           *range(0x2066, 0x206A), 0x2028, 0x2029]
_SHOWN = {c: (f"\\x{c:02x}" if c < 0x100 else f"\\u{c:04x}") for c in _ACTIVE}
_LINE = str.maketrans(_SHOWN)
# Newline and tab lay out what a command prints (its lines, its columns): kept where a stream is written.
_LAYOUT = str.maketrans({c: s for c, s in _SHOWN.items() if chr(c) not in "\n\t"})


def escape(text: str, *, layout: bool = False) -> str:
    """``text`` with every character a terminal would act on written as a visible escape (``\\x1b``,
    ``\\u202e``); with ``layout``, newlines and tabs are kept (the text is lines of output)."""
    return str(text).translate(_LAYOUT if layout else _LINE)


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
