"""The names a preset may take, and what is said of one that is none of them (with the closest names):
importable without torch, so that the command line answers a typo before its heavy imports."""

from __future__ import annotations

from ..util.closest import did_you_mean

PRESETS = ("none", "core", "core-tag", "max")


def unknown_preset(spec) -> str | None:
    """Why ``spec`` names no preset (neither one of PRESETS, optionally @<torch version>, nor an installed
    or known backend's name), or None when it names one."""
    from ..backends import names as backend_names

    if not isinstance(spec, str):
        return f"preset must be a string such as 'core', got {type(spec).__name__}."
    name, _, version = spec.partition("@")
    if name in PRESETS or (name in backend_names() and not version):
        return None
    return (f"unknown preset {spec!r};{did_you_mean(name, (*PRESETS, *backend_names()))} Choose one of "
            f"{', '.join(PRESETS)} (optionally @<torch version>), or a backend's own op list: "
            f"{', '.join(backend_names())}.")
