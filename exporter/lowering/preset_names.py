"""The names a preset may take, and what is said of one that is none of them (with the closest names):
importable without torch, so that the command line answers a typo before its heavy imports."""

from __future__ import annotations

from ..util.closest import did_you_mean

PRESETS = ("none", "core", "core-tag", "max")


def unknown_preset(spec, backends: tuple[str, ...] = ()) -> str | None:
    """Why ``spec`` names no preset (one of PRESETS, optionally @<torch version>), or None when it
    names one. ``backends``: the backends' names, offered where the closest name is one of them."""
    if not isinstance(spec, str):
        return f"preset must be a string such as 'core', got {type(spec).__name__}."
    name, _, version = spec.partition("@")
    if name in PRESETS:
        return None
    hint = did_you_mean(name, (*PRESETS, *backends))
    if hint and any(f"'{b}'" in hint for b in backends):
        hint = hint.replace("mean '", "mean backend='")
    also = f" A backend's own op list is backend=NAME: {', '.join(backends)}." if backends else ""
    return (f"unknown preset {spec!r};{hint} Choose one of {', '.join(PRESETS)} (optionally @<torch version>)."
            + also)
