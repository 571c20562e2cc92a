"""The local executor: a pool of worker processes on this machine, one process per case, forked
from the warm runner (a case naming an interpreter, or a runner connected to Ray, starts a fresh python
instead)."""

from __future__ import annotations

import os
import select
import socket
import sys
import time

from .case import Case, Limits
from .isolate import Running, code_version, launch


def _holds_ray_driver() -> bool:
    """Whether this process is connected to a Ray cluster: its gRPC threads and their locks are not
    fork-safe (a forked child can die of SIGSEGV far from any Ray call), so its cases start a fresh python."""
    ray = sys.modules.get("ray")
    try:
        return bool(ray is not None and ray.is_initialized())
    except Exception:  # noqa: BLE001 -- (a partly imported or broken ray holds no driver)
        return False


class LocalPool:
    """Up to ``workers`` cases at a time on this machine."""

    name = "local"

    def __init__(self, workers: int = 2, fork: bool | None = None):
        self.capacity = max(1, int(workers))
        self.fork = hasattr(os, "fork") if fork is None else fork
        self.running: dict[str, tuple[Case, Running]] = {}
        self.ready: list[tuple[Case, dict]] = []
        self.versions: dict[str, dict] = {}  # case id -> the code_version it runs

    def submit(self, case: Case, limits: Limits, log_path: str) -> None:
        # a forked case runs the code this process imported; where the checkout changed since, the case
        # starts a fresh python instead (a fork would run old and new modules mixed), and says so
        started, now = code_version(), code_version(now=True)
        fork = self.fork and not case.interpreter and now == started and not _holds_ray_driver()
        got = launch(case.spec(limits.memory_bytes), limits.timeout, log_path, fork)
        self.versions[case.id] = started if fork else now
        if isinstance(got, dict):
            self.ready.append((case, self._stamp(case, got)))
        else:
            self.running[case.id] = (case, got)

    def _stamp(self, case: Case, outcome: dict) -> dict:
        return dict(outcome, **self.versions.pop(case.id, code_version()), host=socket.gethostname())

    def wait(self, timeout: float = 1.0) -> list[tuple[Case, dict]]:
        """The cases that finished, waiting up to ``timeout`` seconds for one."""
        if not self.ready and self.running:
            soonest = min(r.deadline for _, r in self.running.values()) - time.monotonic()
            select.select([r for _, r in self.running.values()], [], [], max(0.0, min(timeout, soonest)))
        for cid, (case, running) in list(self.running.items()):
            out = running.poll()
            if out is not None:
                del self.running[cid]
                self.ready.append((case, self._stamp(case, out)))
        ready, self.ready = self.ready, []
        return ready

    def close(self) -> None:
        for _, running in self.running.values():
            running.kill()
            os.waitpid(running.pid, 0)
            os.close(running.fd)
        self.running.clear()
