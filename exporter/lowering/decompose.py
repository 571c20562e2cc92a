"""Apply a decomposition table to an ExportedProgram (with functionalization), serialized
behind one lock because torch's run_decompositions swaps operator kernels while it runs."""

from __future__ import annotations

import threading

from ..errors import LoweringError

_LOCK = threading.RLock()


def run_decompositions(ep, table: dict):
    """torch's ExportedProgram.run_decompositions with exactly ``table`` (ops not in it stay)."""
    with _LOCK:
        try:
            return ep.run_decompositions(dict(table))
        except Exception as e:
            raise LoweringError(f"decomposition failed: {type(e).__name__}: {e}") from e
