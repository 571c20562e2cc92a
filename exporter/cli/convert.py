"""`pt2b convert SRC DEST`: conversion between torch.export.save's .pt2 archives and .pt2b artifacts,
both ways (the direction from the source file)."""

from __future__ import annotations

import os

import torch

from ..errors import ArtifactError, ExportError, NotAnArtifactError
from ..serialize.layout.container import MAGIC
from . import progress


def _kind(path) -> str:
    from ..serialize.read.integrity import open_regular

    with open_regular(os.fspath(path), os.fspath(path)) as f:  # never blocks on a FIFO
        head = f.read(4)
    if head == MAGIC:
        return "pt2b"
    if head[:2] == b"PK":
        return "pt2"
    raise NotAnArtifactError(f"{path}: neither a .pt2b artifact nor a torch.export .pt2 archive.")


def convert(source, dest) -> str:
    """Convert ``source`` to the other format at ``dest``; returns "pt2->pt2b" or "pt2b->pt2".

    Reading a .pt2 uses torch.export.load, which unpickles: convert only files you trust.
    """
    from ..api import export_model, load
    from ..util.atomic import atomic_write

    kind = _kind(os.fspath(source))
    if kind == "pt2":
        try:
            ep = torch.export.load(source)
        except Exception as e:
            raise ArtifactError(f"{source}: torch.export.load failed: {type(e).__name__}: {e}") from e
        export_model(ep, path=dest, keep_unused_weights=True)  # a conversion keeps every name
        return "pt2->pt2b"
    ep = load(source).exported_program()
    with atomic_write(dest) as f:
        try:
            torch.export.save(ep, f)
        except Exception as e:
            raise ExportError(f"torch.export.save failed: {type(e).__name__}: {e}") from e
    return "pt2b->pt2"


def run(ns) -> int:
    with progress.status(f"converting {ns.source}"):
        direction = convert(ns.source, ns.dest)
    print(f"converted {ns.source} -> {ns.dest} ({direction})")
    return 0
