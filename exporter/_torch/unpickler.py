"""torch.load's weights-only unpickler (torch._weights_only_unpickler): the globals it allows. It
imports torch on call: the archive checks that ask it start before torch is loaded."""

from __future__ import annotations

__all__ = ["weights_only_allowed_globals"]


def weights_only_allowed_globals() -> dict:
    """The globals (``"module.name"`` -> object) torch.load(weights_only=True) unpickles."""
    from torch import _weights_only_unpickler

    return _weights_only_unpickler._get_allowed_globals()
