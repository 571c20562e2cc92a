"""The lowering engines, side by side, and the one way in (``lower_program``): the whole-program
retrace (whole_program.py), node by node (local.py), repeated layers traced once (reuse.py), functorch
regions flattened before a retrace (functorch_regions.py). Each applies a trace table
(lowering/decompose.py) through functionalization (exporter/functionalize.py); each gives what the
whole retrace gives, or declines and the next one is tried (docs/lowering.md)."""

from __future__ import annotations

from ...functionalize import forced_decompositions
from ..decompose import shared_trace_table
from .whole_program import needs_functionalization, retrace
from .reuse import Reused, expand, lower_with_reuse, valid_recipe
from .module_stacks import place_markers
from .view_sizes import size_views

__all__ = ["Reused", "expand", "functionalized", "lower_program", "run_decompositions", "valid_recipe"]


def lower_program(ep, table: dict) -> tuple:
    """(``ep`` lowered with ``table``, the Reused it was made from or None). No table: functionalized
    only; else a chain of equal layers traced once (reuse.py), else the whole program
    (run_decompositions)."""
    if not table:
        return functionalized(ep), None
    decompose = lambda ep: run_decompositions(ep, table)  # noqa: E731
    reused = lower_with_reuse(ep, decompose)
    lowered = reused.expand() if reused is not None else None
    if lowered is None:
        reused, lowered = None, decompose(ep)
    return lowered, reused


def run_decompositions(ep, table: dict, *, local: bool = True):
    """``ep`` with exactly ``table`` applied (ops not in it stay) and functionalized, as a new
    ATen-dialect ExportedProgram; the op set equals torch's ``ep.run_decompositions(table)``.
    ``local``: node by node where that applies (local.py), else (or with False) in one retrace."""
    from .local import lower_locally

    full = shared_trace_table(table)
    lowered = (local and lower_locally(ep, full)) or retrace(ep, full)
    size_views(lowered.graph_module)
    place_markers(lowered.graph_module)
    return lowered


def functionalized(ep):
    """``ep`` functionalized with no table (whole_program.retrace: only the decompositions every retrace
    applies), node by node where that applies (local.py: writes into fresh values made functional
    without a retrace of the whole program), else in one retrace."""
    from .local import lower_locally

    lowered = lower_locally(ep, forced_decompositions()) if needs_functionalization(ep) else None
    lowered = lowered if lowered is not None else retrace(ep)
    size_views(lowered.graph_module)
    place_markers(lowered.graph_module)
    return lowered
