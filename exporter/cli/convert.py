"""`pt2b convert SRC DEST`: conversion between torch.export.save's .pt2 archives and .pt2b artifacts,
both ways (the direction from the source file)."""

from __future__ import annotations

import os
import sys

import torch

from ..errors import ArtifactError, ExportError, NotAnArtifactError, PickledContentError
from ..layout.container import MAGIC
from . import progress, pt2_program


def _kind(path) -> str:
    from ..serialize.read.integrity import open_regular

    with open_regular(os.fspath(path), os.fspath(path)) as f:  # never blocks on a FIFO
        head = f.read(4)
    if head == MAGIC:
        return "pt2b"
    if head[:2] == b"PK":
        return "pt2"
    raise NotAnArtifactError(f"{path}: neither a .pt2b artifact nor a torch.export .pt2 archive.")


def convert(source, dest, *, trust_pickle: bool = False) -> str:
    """Convert ``source`` to the other format at ``dest``; returns "pt2->pt2b" or "pt2b->pt2".

    A .pt2 is read by torch.export.load, which unpickles what the archive marks as pickled (weights,
    constants, custom objects: any code can run). Without ``trust_pickle`` such an archive is a
    PickledContentError naming each pickled entry and the globals it imports, before torch reads any
    of it; the example inputs (always a torch.save pickle) are read only where torch's weights-only
    unpickler takes them. Each program is then checked as pt2b checks its own (pt2_program.py):
    torch's deserializer evaluates symbolic expressions and resolves targets by name, so a .pt2 with
    no pickle at all can still run code. ``trust_pickle=True`` reads everything with torch alone: for
    files you trust.
    """
    from ..api import export_model, load
    from ..serialize.read.integrity import open_regular
    from ..util.atomic import atomic_write

    kind = _kind(os.fspath(source))
    if kind == "pt2":
        # one open file for the checks and torch's read: what is checked is what torch reads
        with open_regular(os.fspath(source), os.fspath(source)) as f:
            if not trust_pickle:
                _refuse_pickles(f, source)
                f.seek(0)
                pt2_program.check_programs(f, source)  # torch's deserializer evaluates and resolves them
                f.seek(0)
            try:
                ep = torch.export.load(f)
            except Exception as e:
                raise ArtifactError(f"{source}: torch.export.load failed: {type(e).__name__}: {e}") from e
        _check_state(ep, source)
        export_model(ep, path=dest, keep_unused_weights=True)  # a conversion keeps every name
        return "pt2->pt2b"
    ep = load(source).exported_program()
    with atomic_write(dest) as f:
        try:
            torch.export.save(ep, f)
        except Exception as e:
            raise ExportError(f"torch.export.save failed: {type(e).__name__}: {e}") from e
    return "pt2b->pt2"


def _check_state(ep, source) -> None:
    """What an unpickled weight or constant became must be a tensor (or a torchbind object, which the
    writer refuses by name), and the example inputs ``(args, kwargs)`` as the program takes them:
    anything else is the archive's error, not the writer's."""
    example = ep.example_inputs
    if example is not None and not (isinstance(example, tuple) and len(example) == 2
                                    and isinstance(example[0], tuple) and isinstance(example[1], dict)):
        raise ArtifactError(f"{source}: the example inputs were read as a {type(example).__name__} of "
                            f"{len(example) if isinstance(example, tuple) else 'no'} item(s), not the (args, "
                            "kwargs) pair the program takes; the archive is damaged or was not written by "
                            "torch.export.save.")
    for kind, values in (("weight", ep.state_dict), ("constant", ep.constants)):
        for name, value in values.items():
            if not isinstance(value, (torch.Tensor, torch.ScriptObject)):
                raise ArtifactError(f"{source}: {kind} {name!r} was read as a {type(value).__name__}, not a tensor; "
                                    "the archive is damaged or was not written by torch.export.save.")


def _refuse_pickles(f, source) -> None:
    """PickledContentError if torch.export.load would unpickle anything of the open archive ``f``
    without restriction (exporter/cli/pt2_pickles.py finds it without unpickling)."""
    from . import pt2_pickles

    try:
        found = pt2_pickles.refused(f)
    except ArtifactError as e:
        raise ArtifactError(f"{source}: {e}") from None
    if found:
        listed = "; ".join(p.describe() for p in found[:_LISTED])
        more = f"; and {len(found) - _LISTED} more" if len(found) > _LISTED else ""
        raise PickledContentError(
            f"{source}: reading this .pt2 would unpickle {len(found)} entr{'y' if len(found) == 1 else 'ies'}, "
            f"and unpickling can run any code: {listed}{more}. Nothing of it was unpickled. If you trust the file "
            "and whoever made it, convert it with `pt2b convert --trust-pickle` (Python: "
            "convert(..., trust_pickle=True)).")


_LISTED = 8  # pickled entries named in the message; the rest are counted


def run(ns) -> int:
    if ns.trust_pickle and _kind(ns.source) == "pt2":
        print(f"pt2b: --trust-pickle: unpickling what {ns.source} holds pickled; it can run any code", file=sys.stderr)
    with progress.status(f"converting {ns.source}"):
        direction = convert(ns.source, ns.dest, trust_pickle=ns.trust_pickle)
    print(f"converted {ns.source} -> {ns.dest} ({direction})")
    return 0
