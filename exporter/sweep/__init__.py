"""Sweeps of independent cases (models, backends, mutants), each in its own bounded process, on this
machine or a Ray cluster, with a records file that a sweep resumes from (docs/sweeps.md)."""

from __future__ import annotations

from ._child import report
from .case import Case, Limits
from .isolate import FINAL
from .journal import comparable, read
from .runner import executor_for, iterate, log_path, run

__all__ = ["Case", "Limits", "run", "iterate", "log_path", "read", "comparable", "report", "executor_for", "FINAL"]
