"""The process a sweep case runs in: its limits set, its function called, what it returns sent back.
Standard library only, so that any interpreter (another venv's) can run it as a script."""

from __future__ import annotations

import importlib
import json
import os
import sys
import traceback
from typing import Any

FD_VARIABLE = "PT2B_SWEEP_FD"  # the descriptor a case's process writes its messages to
MSG_CHARS = 2000


def send(fd: int, message: dict) -> None:
    """One JSON line to the runner (a payload that is not JSON data is an error of the case's)."""
    data = (json.dumps(message, allow_nan=True) + "\n").encode()
    while data:
        data = data[os.write(fd, data):]


def _die_with_parent(parent: int) -> None:
    # a case outlives neither the runner nor the Ray worker that started it (a lost node takes it along)
    try:
        import ctypes
        import signal

        ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGKILL))  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return
    if os.getppid() != parent:
        os._exit(1)


def _limit_memory(limit: int) -> None:
    try:
        import resource
    except ImportError:  # (no address-space limit on this platform: the time limit still holds)
        return
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))


def _is_out_of_memory(e: BaseException) -> bool:
    text = str(e)
    return isinstance(e, MemoryError) or "can't allocate memory" in text or "out of memory" in text.lower()


def resolve(name: str):
    """The function "package.module:function" names."""
    module, _, qual = name.partition(":")
    obj = importlib.import_module(module)
    for part in qual.split("."):
        obj = getattr(obj, part)
    return obj


def _torch_version() -> str | None:
    """The torch of the interpreter the case ran in (without importing it)."""
    torch = sys.modules.get("torch")
    if torch is not None:
        return torch.__version__
    try:
        from importlib.metadata import PackageNotFoundError, version

        return version("torch")
    except (ImportError, PackageNotFoundError):
        return None


def _backend_version(backend: str | None) -> str | None:
    if not backend:
        return None
    try:
        from exporter.backends import get

        return get(backend).version
    except Exception:  # noqa: BLE001 -- the backend is not installed where the case ran
        return None


def serve(spec: dict, fd: int, parent: int) -> None:
    """Run the case ``spec`` describes in this process, messages to ``fd``; returns when it is done
    (a crash or a kill ends the process before)."""
    _die_with_parent(parent)
    import faulthandler

    faulthandler.enable(sys.stderr)  # a crash's Python stack goes to the case's log
    os.environ[FD_VARIABLE] = str(fd)
    for entry in reversed(spec.get("path") or []):
        if entry not in sys.path:
            sys.path.insert(0, entry)
    if spec.get("memory_bytes"):
        _limit_memory(int(spec["memory_bytes"]))
    send(fd, {"started": os.getpid()})
    try:
        result = resolve(spec["fn"])(*spec.get("args", ()), **spec.get("kwargs", {}))
        json.dumps(result, allow_nan=True)
        done = {"outcome": "ok", "result": result}
    except BaseException as e:  # noqa: BLE001 -- every failure of the case is its result
        done = {"outcome": "memory" if _is_out_of_memory(e) else "error", "error_type": type(e).__name__,
                "error": str(e)[:MSG_CHARS], "traceback": traceback.format_exc()[-MSG_CHARS:]}
        if isinstance(e, TypeError) and "JSON serializable" in str(e):
            done["error"] = f"the case returned data that is not JSON: {e}"[:MSG_CHARS]
    done["torch"] = _torch_version()
    done["python"] = sys.executable  # (where it ran: a backend's own venv, for a case routed there)
    done["backend_version"] = _backend_version(spec.get("backend"))
    sys.stdout.flush()
    sys.stderr.flush()
    send(fd, {"done": done})


def report(payload: Any, seconds: float | None = None, step: Any = None) -> None:
    """Send how far a case got: a case that crashes or runs out of time is recorded with the last
    ``payload`` as its ``partial``. ``seconds``: the case's time limit from now on (a batch bounds each
    of its steps so), never past the case's own limit. ``step``: one finished step's result, kept in
    order with the others (the record's ``steps`` when the case does not return). Does nothing
    outside a sweep."""
    fd = os.environ.get(FD_VARIABLE)
    if fd is None:
        return
    message = {"partial": payload}
    if seconds is not None:
        message["seconds"] = float(seconds)
    if step is not None:
        message["step"] = step
    send(int(fd), message)


if __name__ == "__main__":  # a fresh interpreter: the spec on stdin, messages to descriptor 3
    if sys.path and os.path.abspath(sys.path[0]) == os.path.dirname(os.path.abspath(__file__)):
        del sys.path[0]  # (this folder's modules are not the case's)
    spec = json.loads(sys.stdin.buffer.read())
    sys.stdin = open(os.devnull)
    serve(spec, 3, int(sys.argv[1]))
    sys.exit(0)
