"""The names closest to one a user mistyped, as the sentence that offers them ("Did you mean ...?")."""

from __future__ import annotations

import difflib


def did_you_mean(word: str, choices) -> str:
    """" Did you mean 'x'?" for the choice closest to ``word`` (difflib's ratio of 0.6 or more), or ""."""
    close = difflib.get_close_matches(word, list(choices), n=1)
    return f" Did you mean {close[0]!r}?" if close else ""
