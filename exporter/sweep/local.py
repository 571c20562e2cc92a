"""The local executor: a pool of worker processes on this machine, one process per case, forked
from the warm runner (a case naming an interpreter starts that python instead)."""

from __future__ import annotations

import os
import select
import socket
import time

from .case import Case, Limits
from .isolate import Running, code_version, launch


class LocalPool:
    """Up to ``workers`` cases at a time on this machine."""

    name = "local"

    def __init__(self, workers: int = 2, fork: bool | None = None):
        self.capacity = max(1, int(workers))
        self.fork = hasattr(os, "fork") if fork is None else fork
        self.running: dict[str, tuple[Case, Running]] = {}
        self.ready: list[tuple[Case, dict]] = []

    def submit(self, case: Case, limits: Limits, log_path: str) -> None:
        got = launch(case.spec(limits.memory_bytes), limits.timeout, log_path, self.fork and not case.interpreter)
        if isinstance(got, dict):
            self.ready.append((case, self._stamp(got)))
        else:
            self.running[case.id] = (case, got)

    @staticmethod
    def _stamp(outcome: dict) -> dict:
        return dict(outcome, **code_version(), host=socket.gethostname())

    def wait(self, timeout: float = 1.0) -> list[tuple[Case, dict]]:
        """The cases that finished, waiting up to ``timeout`` seconds for one."""
        if not self.ready and self.running:
            soonest = min(r.deadline for _, r in self.running.values()) - time.monotonic()
            select.select([r for _, r in self.running.values()], [], [], max(0.0, min(timeout, soonest)))
        for cid, (case, running) in list(self.running.items()):
            out = running.poll()
            if out is not None:
                del self.running[cid]
                self.ready.append((case, self._stamp(out)))
        ready, self.ready = self.ready, []
        return ready

    def close(self) -> None:
        for _, running in self.running.values():
            running.kill()
            os.waitpid(running.pid, 0)
            os.close(running.fd)
        self.running.clear()
