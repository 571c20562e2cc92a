"""Text shown as visible escapes, never as control sequences: what pt2b prints or puts in an error
message may come from a file, and a terminal acts on some characters instead of showing them."""

from __future__ import annotations

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
