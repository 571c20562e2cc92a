"""The Ray executor (`pip install pt2b[ray]`): one Ray task per case, the case in a fresh interpreter
inside it; a task lost with its worker or node is the outcome "lost", run again by the runner."""

from __future__ import annotations

from ..errors import SweepError
from .case import Case, Limits

_TASK = None


def _case_task(spec: dict, timeout: float, log_path: str) -> dict:
    import socket

    from .isolate import run_one

    return dict(run_one(spec, timeout, log_path), host=socket.gethostname())


class RayPool:
    """Cases as Ray tasks on the cluster at ``address`` ("auto": the one this machine is part of), or
    on the cluster this process is already connected to."""

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
        self.refs: dict = {}

    def submit(self, case: Case, limits: Limits, log_path: str) -> None:
        resources = dict(case.resources or {})
        options = {"num_cpus": resources.pop("CPU", 1), "max_retries": 0}
        if resources:
            options["resources"] = resources
        if case.runtime_env:
            options["runtime_env"] = case.runtime_env
        ref = _TASK.options(**options).remote(case.spec(limits.memory_bytes), limits.timeout, log_path)
        self.refs[ref] = case

    def wait(self, timeout: float = 1.0) -> list[tuple[Case, dict]]:
        if not self.refs:
            return []
        ray = self.ray
        ready, _ = ray.wait(list(self.refs), num_returns=1, timeout=timeout)
        if ready:
            ready, _ = ray.wait(list(self.refs), num_returns=len(self.refs), timeout=0)
        out = []
        for ref in ready:
            case = self.refs.pop(ref)
            try:
                outcome = ray.get(ref)
            except ray.exceptions.RayTaskError as e:
                if isinstance(e.cause, SweepError):
                    raise e.cause from None
                outcome = {"outcome": "lost", "error": f"the Ray task failed: {str(e).splitlines()[0]}"}
            except ray.exceptions.RayError as e:  # its worker or node lost
                outcome = {"outcome": "lost", "error": f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"}
            out.append((case, outcome))
        return out

    def close(self) -> None:
        for ref in self.refs:
            self.ray.cancel(ref, force=True)
        self.refs.clear()
