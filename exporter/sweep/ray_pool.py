"""The Ray executor (`pip install pt2b[ray]`): one Ray task per case, the case in a fresh interpreter
inside it; a task lost with its worker or node, or hung past its limit, is "lost", run again by the runner."""

from __future__ import annotations

import time

from ..errors import SweepError
from .case import Case, Limits

_TASK = None


def _case_task(spec: dict, timeout: float, log_path: str):
    """A Ray task's body: that it started (its time runs from then), then the case's record."""
    import socket

    import ray

    from .isolate import run_one

    yield {"started": socket.gethostname()}
    yield dict(run_one(spec, timeout, log_path), host=socket.gethostname(), node=ray.get_runtime_context().get_node_id())


class RayPool:
    """Cases as Ray tasks on the cluster at ``address`` ("auto": the one this machine is part of), or
    on the cluster this process is already connected to. A task that has not returned ``limits.grace``
    seconds past its case's limit (counted from its start: a task waiting for a free node is not late)
    is cancelled and its case is lost: its node hung, or the worker that ran it."""

    name = "ray"

    def __init__(self, address: str | None = "auto"):
        try:
            import ray
        except ImportError:
            raise SweepError("Ray is not installed: pip install 'pt2b[ray]', or leave --ray out to run the sweep "
                             "on this machine.") from None
        self.ray = ray
        if not ray.is_initialized():
            try:
                ray.init(address=address, log_to_driver=False)
            except ConnectionError as e:
                raise SweepError(f"no Ray cluster at {address!r} ({e}): start one (`ray start --head`) or give the "
                                 f"address of its head node (--ray HOST:6379).") from None
        global _TASK
        if _TASK is None:
            _TASK = ray.remote(_case_task)
        self.capacity = max(1, 2 * int(ray.cluster_resources().get("CPU", 1)))
        self.tasks: dict = {}  # the task's generator -> [case, when it started (None: not yet), its seconds]

    def submit(self, case: Case, limits: Limits, log_path: str) -> None:
        resources = dict(case.resources or {})
        options = {"num_cpus": resources.pop("CPU", 1), "max_retries": 0, "num_returns": "streaming"}
        if resources:
            options["resources"] = resources
        if case.runtime_env:
            options["runtime_env"] = case.runtime_env
        task = _TASK.options(**options).remote(case.spec(limits.memory_bytes), limits.timeout, log_path)
        self.tasks[task] = [case, None, limits.timeout + limits.grace]

    def _late(self) -> list[tuple[Case, dict]]:
        now, out = time.monotonic(), []
        for task, (case, started, seconds) in list(self.tasks.items()):
            if started is not None and now > started + seconds:
                del self.tasks[task]
                self.ray.cancel(task, force=True)
                out.append((case, {"outcome": "lost", "error": f"the Ray task did not return within {seconds:g} s of "
                                   f"its start (its node or worker hung): cancelled"}))
        return out

    def wait(self, timeout: float = 1.0) -> list[tuple[Case, dict]]:
        out = self._late()
        if out or not self.tasks:
            return out
        ray = self.ray
        due = [started + seconds for _, started, seconds in self.tasks.values() if started is not None]
        timeout = max(0.0, min([timeout, *(d - time.monotonic() for d in due)]))
        ready, _ = ray.wait(list(self.tasks), num_returns=1, timeout=timeout)
        if ready:
            ready, _ = ray.wait(list(self.tasks), num_returns=len(self.tasks), timeout=0)
        for task in ready:
            entry = self.tasks[task]
            try:
                outcome = ray.get(next(task))
            except StopIteration:
                outcome = {"outcome": "lost", "error": "the Ray task ended without the case's record"}
            except ray.exceptions.RayTaskError as e:
                if isinstance(e.cause, SweepError):
                    raise e.cause from None
                outcome = {"outcome": "lost", "error": f"the Ray task failed: {str(e).splitlines()[0]}"}
            except ray.exceptions.RayError as e:  # its worker or node lost
                outcome = {"outcome": "lost", "error": f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"}
            if "started" in outcome and "outcome" not in outcome:
                entry[1] = time.monotonic()
                continue
            del self.tasks[task]
            out.append((entry[0], outcome))
        return out

    def close(self) -> None:
        for task in self.tasks:
            self.ray.cancel(task, force=True)
        self.tasks.clear()
