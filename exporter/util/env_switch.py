"""pt2b's on/off environment variables (PT2B_CACHE, PT2B_QUIET, PT2B_DIRECT_WRITES): one reading of them."""

from __future__ import annotations

import os

OFF = ("0", "off", "false", "no")


def env_switch(name: str, default: bool) -> bool:
    """$``name`` as a switch: ``default`` where it is unset or empty, off for 0/off/false/no (any case),
    on for any other value."""
    value = os.environ.get(name, "").strip().lower()
    if not value:
        return default
    return value not in OFF
