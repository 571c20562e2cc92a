"""Pausing Python's cyclic garbage collector around allocation-heavy steps."""

from __future__ import annotations

import contextlib
import gc


@contextlib.contextmanager
def gc_paused():
    """Run the block without cyclic garbage collection. A load or save allocates many short-lived
    objects (the program table, torch's schema objects, fx nodes) and none of them is garbage until
    it ends, yet each allocation burst triggers collections that scan them all, a sizeable share of a
    load or a save. Nested and concurrent uses are fine: the outermost one that
    disabled collection enables it again (collection timing never affects results)."""
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()
