"""A lowering request in the user's words (a preset, a backend's name, an op list, keep, decompose,
lossless, fallback) resolved into a LoweringPlan, the installed backend's own op list looked up by name."""

from __future__ import annotations

import warnings

from .errors import DeprecatedSpellingWarning, LoweringError

__all__ = ["plan_request"]


def plan_request(preset: str | None = "core", *, backend: str | None = None, supported_ops=None,
                 decompositions=None, keep=None, decompose=None, lossless: bool = False, strict: bool | None = None,
                 fallback: str | None = None, stacklevel: int = 2):
    """The LoweringPlan of load_for_backend's request words (documented there). Spellings of an
    earlier release are turned into today's with a DeprecatedSpellingWarning: ``preset=<backend>``
    for ``backend=``, ``strict=`` for ``lossless=``. ``stacklevel``: the user's frame, for warnings."""
    from . import backends
    from .lowering.plan import plan_lowering
    from .lowering.preset_names import unknown_preset

    if strict is not None:
        warnings.warn("strict= is spelt lossless= now (strict= goes in the next release).",
                      DeprecatedSpellingWarning, stacklevel=stacklevel + 1)
        lossless = lossless or bool(strict)
    if isinstance(preset, str) and preset in backends.names():
        if backend is not None:
            raise LoweringError(f"preset={preset!r} names a backend, and backend={backend!r} is given too: "
                                f"pass backend= alone.")
        warnings.warn(f"preset={preset!r} names a backend: write backend={preset!r} (preset= for a backend "
                      f"goes in the next release).", DeprecatedSpellingWarning, stacklevel=stacklevel + 1)
        preset, backend = None, preset
    if backend is None and supported_ops is None and preset is not None and (
            why := unknown_preset(preset, backends.names())):
        raise LoweringError(why)
    if backend is not None and preset not in (None, "core"):
        raise LoweringError(f"backend={backend!r} brings its own op list: do not pass preset={preset!r} with it.")
    installed = backends.get(backend) if backend is not None else None
    return plan_lowering(None if installed is not None else preset, backend=installed, supported_ops=supported_ops,
                         decompositions=decompositions, keep=keep, decompose=decompose, lossless=lossless,
                         fallback=fallback)
