"""How deep text and values read from a file nest, measured before a parser or a recursive walk sees
them: a bracket-depth scan in time linear in the text's length, and a depth walk of decoded values."""

from __future__ import annotations

import functools
import itertools
import re

from ..errors import CorruptArtifactError

_STEP = {"(": 1, "[": 1, "{": 1, ")": -1, "]": -1, "}": -1}
_NOT_BRACKET = re.compile(r"[^()\[\]{}]+")


@functools.cache
def _literal(quotes: str) -> re.Pattern:
    """A string literal opened by one of ``quotes``: up to the same quote, a backslash escaping the
    character after it (JSON's rule and torch's schema lexer's). One left open runs to the end: a
    parser refuses it there, so nothing after it is read. Each character is matched by exactly one
    branch, so the match never backtracks: linear in the text."""
    branches = [rf"{re.escape(q)}(?:[^{re.escape(q)}\\]|\\.)*(?:{re.escape(q)}|\\?\Z)" for q in quotes]
    return re.compile("|".join(branches), re.S)


def outside_literals(text: str, quotes: str) -> str:
    """``text`` without its string literals (see _literal): what a parser reads as structure."""
    return _literal(quotes).sub("", text) if quotes else text


def bracket_depth(text: str, quotes: str = "") -> int:
    """The deepest nesting of ``(``, ``[`` and ``{`` in ``text`` outside string literals opened by a
    character of ``quotes``, in linear time. A closer with nothing open ends what a parser reads (it
    refuses it there), so what follows it cannot nest deeper than the count shows."""
    brackets = _NOT_BRACKET.sub("", outside_literals(text, quotes))
    return max(itertools.accumulate(map(_STEP.__getitem__, brackets)), default=0)


def check_text(text: str, limit: int, where: str, what: str, quotes: str = "") -> None:
    """CorruptArtifactError unless ``text`` nests brackets at most ``limit`` deep (bracket_depth)."""
    depth = bracket_depth(text, quotes)
    if depth > limit:
        raise CorruptArtifactError(
            f"{where}: {what} nests brackets {depth} levels deep, more than the {limit} pt2b reads; a parser "
            f"or walk that deep could exhaust the stack, so it is refused before any parsing (the file is "
            f"damaged or crafted).")


def deeper_than(value, limit: int) -> bool:
    """Whether lists, tuples, sets and dicts (keys and values) nest more than ``limit`` deep in
    ``value``: a walk with its own stack, stopping at the first level past ``limit``."""
    stack = [(value, 0)]
    while stack:
        v, depth = stack.pop()
        if isinstance(v, dict):
            children = itertools.chain(v.keys(), v.values())
        elif isinstance(v, (list, tuple, set, frozenset)):
            children = v
        else:
            continue
        if depth == limit:
            return True
        stack.extend((c, depth + 1) for c in children if isinstance(c, (dict, list, tuple, set, frozenset)))
    return False


def check_value(value, limit: int, where: str, what: str) -> None:
    """CorruptArtifactError if containers nest more than ``limit`` deep in ``value`` (deeper_than)."""
    if deeper_than(value, limit):
        raise CorruptArtifactError(
            f"{where}: {what} nests more than {limit} levels deep, deeper than pt2b reads (printing or walking "
            f"it could exhaust the stack); the file is damaged or crafted.")
