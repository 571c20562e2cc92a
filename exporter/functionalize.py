"""Remove mutation and aliasing after load, the way torch.export does: in-place ops become
functional ones, buffer and user-input mutations become extra outputs for the caller to apply."""

from __future__ import annotations

from .lowering.decompose import run_decompositions
from .lowering.graph_ops import may_mutate


def functionalize(ep):
    """``ep`` functionalized and otherwise unchanged; ``ep`` itself when it has no mutation."""
    if not may_mutate(ep):
        return ep
    return run_decompositions(ep, {})
