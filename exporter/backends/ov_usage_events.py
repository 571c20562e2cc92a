"""OpenVINO's usage events, off for pt2b's own calls into it.

OpenVINO reports its use over the network (``openvino_telemetry``, on unless the user opted out with its
``opt_in_out`` tool): an event when ``openvino`` is first imported, and several for each
``convert_model``, whose first one also writes a client id under the user's home (``~/intel``). A
hand-off is pt2b's call, not the user's: it sends nothing and writes nothing there, and the user's own
imports and conversions go on as their setting says. On a small program the events took about half
of each conversion's time here, and a split with fallback converts once per part (docs/backends.md).

The setting lives in one object of the process (the library's singleton, which OpenVINO re-initializes
from the user's setting whenever another of its tools takes it). While any pt2b call into OpenVINO
runs, that object is a stand-in that sends nothing and cannot be re-initialized; the user's object (or
none, where the user has not used OpenVINO yet) is put back when the last such call ends.
"""

from __future__ import annotations

import contextlib
import threading
import types

__all__ = ["without_usage_events"]

_SLOT = "_SingletonMetaClass__single_instance"  # (where the library's metaclass keeps its one instance)
_LOCK = threading.Lock()
_saved: list = []  # [(the class, the object the slot held)] while pt2b's calls run
_depth = 0


def _telemetry_class():
    try:
        from openvino_telemetry import Telemetry
    except ImportError:  # (OpenVINO without its telemetry package sends nothing)
        return None
    return Telemetry if hasattr(Telemetry, _SLOT) else None


def _stand_in(cls):
    """An object of ``cls`` that has no consent, and whose ``init`` (OpenVINO's tools call it to take the
    object over under their own name) changes nothing."""

    class Quiet(cls):
        def init(self, *args, **kwargs) -> None:
            return None

    quiet = object.__new__(Quiet)
    nothing = lambda *args, **kwargs: None  # noqa: E731
    vars(quiet).update(consent=False, sender=types.SimpleNamespace(send=nothing, force_shutdown=nothing),
                       backend=types.SimpleNamespace(app_name=None))
    return quiet


@contextlib.contextmanager
def without_usage_events():
    """Within: OpenVINO, imported or converting in this process, sends no usage events and writes no
    client id; after the outermost one, its setting is as it was."""
    global _depth
    cls = _telemetry_class()
    if cls is None:
        yield
        return
    with _LOCK:
        if _depth == 0:
            _saved.append((cls, getattr(cls, _SLOT)))
            setattr(cls, _SLOT, _stand_in(cls))
        _depth += 1
    try:
        yield
    finally:
        with _LOCK:
            _depth -= 1
            if _depth == 0:
                held_by, found = _saved.pop()
                setattr(held_by, _SLOT, found)
