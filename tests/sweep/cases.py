"""Tiny sweep cases, imported by name in each case's process: one per way a case can end."""

from __future__ import annotations

import os
import time


def square(x: int) -> dict:
    return {"x": x, "square": x * x}


def imported(module: str) -> bool:
    """Whether this process has ``module`` imported: a forked case inherits the runner's modules."""
    import sys

    return module in sys.modules


def fail(message: str) -> None:
    raise ValueError(message)


def abort() -> None:
    print("about to abort", flush=True)
    os.abort()


def segfault() -> None:
    import ctypes

    ctypes.string_at(0)


def hang() -> None:
    from exporter.sweep import report

    report({"stage": "before the hang"})
    while True:
        time.sleep(1)


def allocate(gib: float) -> int:
    block = bytearray(int(gib * (1 << 30)))
    return len(block)


def exit_quietly() -> None:
    os._exit(3)


def marked(x: int, marks: str, seconds: float = 0.0) -> dict:
    """Sleeps ``seconds``, then appends its id to ``marks`` (a case killed before the end leaves none)."""
    fd = os.open(os.path.join(marks, f"start.{x}.{os.getpid()}"), os.O_CREAT | os.O_WRONLY)
    os.close(fd)
    time.sleep(seconds)
    with open(os.path.join(marks, "done"), "a") as f:
        f.write(f"{x}\n")
    return {"x": x}


def freeze_worker(marks: str) -> dict:
    """The first time: stops the process that started it (a Ray worker that hangs, as on a hung node)
    and waits, its pid in ``marks``/frozen; after that: returns."""
    import signal

    mark = os.path.join(marks, "frozen")
    if not os.path.exists(mark):
        with open(mark, "w") as f:
            f.write(str(os.getppid()))
        os.kill(os.getppid(), signal.SIGSTOP)
        while True:
            time.sleep(1)
    return {"again": True}
