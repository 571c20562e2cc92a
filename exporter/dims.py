"""The names of a program's dynamic dims: the ``torch.export.Dim("batch")`` names a user exported with,
which torch keeps only in the capturing process (its ShapeEnv's debug names) and writes nowhere. pt2b
records them in the artifact's provenance (``dim:<symbol>``, ``dim:<method>:<symbol>`` for a method of
several), and load(), lowered programs, runtime_ref and ``pt2b inspect`` name a dim by them:
"batch (s17)" where torch says "s17"."""

from __future__ import annotations

import torch

PREFIX = "dim:"


def names_at_capture(ep: torch.export.ExportedProgram) -> dict[str, str]:
    """symbol -> the Dim name it was exported with, from the capturing process's ShapeEnv ({} for a
    program read from a file, or dims without names)."""
    out: dict[str, str] = {}
    for node in ep.graph.nodes:
        if node.op != "placeholder" or not isinstance(node.meta.get("val"), torch.Tensor):
            continue
        for size in node.meta["val"].shape:
            if not isinstance(size, torch.SymInt):
                continue
            expr = size.node.expr
            env = size.node.shape_env
            debug = getattr(env, "source_name_to_debug_name", None) or {}
            for source in getattr(env, "var_to_sources", {}).get(expr, ()):
                name = debug.get(source.name)
                if name and str(expr) not in out:
                    out[str(expr)] = name
    return out


def provenance_entries(names: dict[str, str], method: str | None = None) -> dict[str, str]:
    """The provenance entries that record ``names`` (symbol -> Dim name; ``method``: for a method of
    several, whose symbols another method may reuse for other dims)."""
    where = f"{method}:" if method else ""
    return {f"{PREFIX}{where}{sym}": name for sym, name in names.items()}


def names_of(program) -> dict[str, str]:
    """symbol -> Dim name of a loaded or lowered program (what its artifact recorded; read when the
    artifact was opened), else {} (an ExportedProgram)."""
    return dict(getattr(program, "dim_names", None) or {})


def from_provenance(prov: dict, method: str | None) -> dict[str, str]:
    """symbol -> Dim name from an artifact's provenance entries, for ``method`` (None: the only one)."""
    own = f"{PREFIX}{method}:" if method else None
    out = {k[len(PREFIX):]: v for k, v in prov.items() if k.startswith(PREFIX) and k.count(":") == 1}
    out.update({k[len(own):]: v for k, v in prov.items() if own and k.startswith(own)})
    return out


def label(sym, names: dict[str, str]) -> str:
    """'batch (s17)' where the dim has a name, else 's17'."""
    name = names.get(str(sym))
    return f"{name} ({sym})" if name else str(sym)
