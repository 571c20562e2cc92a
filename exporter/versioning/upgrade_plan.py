"""What `pt2b upgrade` changes in a loaded program: the list of changes it makes (format version, op
schemas upgraded on load, the op schemas of the running torch) and the provenance the rewritten
artifact carries. The command itself (load, write, check, replace) is exporter/cli/upgrade.py."""

from __future__ import annotations

import torch

from .formats import version_str

_IN_MEMORY_NOTES = ("upgraded_op:", "upgraded_format")  # load's notes, folded into the upgrade@ entry


def changes(prog, target: tuple[int, int]) -> list[str]:
    """What rewriting loaded method ``prog`` (a Pt2bProgram) at format ``target`` changes."""
    out = []
    if prog.format_version != target:
        out.append(f"format {version_str(prog.format_version)} -> {version_str(target)}")
    out += [f"{k}: {v}" for k, v in prog.provenance.items() if k.startswith("upgraded_op:")]
    if "upgraded_format" in prog.provenance:
        out.append(prog.provenance["upgraded_format"])
    if prog.torch_version != torch.__version__:
        out.append(f"op schemas recorded by torch {prog.torch_version} -> {torch.__version__}")
    return out


def provenance(prog, changes: list[str], target: tuple[int, int]) -> dict[str, str]:
    """The provenance of the upgraded artifact: ``prog``'s, without load's in-memory notes, with an
    upgrade@<target> entry naming ``changes`` (if any)."""
    out = {k: v for k, v in prog.provenance.items() if not k.startswith(_IN_MEMORY_NOTES)}
    if changes:
        out[f"upgrade@{version_str(target)}"] = "; ".join(changes)
    return out
