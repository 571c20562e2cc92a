"""Higher-order ops called eagerly run their Python rule at once inside ``eager()``, not through torch.compile.

torch runs an eager torch.cond, map or while_loop by compiling a wrapper with dynamo
(torch._higher_order_ops.utils._hop_compile_and_call). Under pt2b's eager decomposition mode, a dispatch
mode dynamo does not know, that compile either fails (dynamo traces into the mode's rule) or skips the
frame and compiles the frames below it, leaving dynamo's caches so that every later export of a model
with control flow in the process fails inside dynamo. Inside ``eager()`` the wrapper is called directly:
the op dispatches to the mode's rule, as an eager call did before torch compiled it."""

from __future__ import annotations

import contextlib

from . import patches

__all__ = ["eager"]

_SWITCH = patches.ThreadSwitch()
_CALL = "torch._higher_order_ops.utils:_hop_compile_and_call"


def _calling_directly(call):
    """torch's _hop_compile_and_call, which calls ``fn`` itself in a thread inside ``eager()``."""

    def hop_compile_and_call(fn, args, kwargs=None, *rest, _torch_call=call, **more):
        if _SWITCH.active:
            return fn(*args, **(kwargs or {}))
        return _torch_call(fn, args, kwargs, *rest, **more)

    return hop_compile_and_call


@contextlib.contextmanager
def eager():
    """Inside, this thread's eager higher-order ops call their wrapper directly (where this torch compiles
    them through _hop_compile_and_call; elsewhere nothing changes). The wrapper is installed once, for the
    process, and calls torch's own outside ``eager()`` and in every other thread."""
    patches.wrap_once(_CALL, _calling_directly)
    with _SWITCH.on():
        yield
