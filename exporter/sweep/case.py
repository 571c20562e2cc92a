"""What a sweep runs: a case (a function named "package.module:function", JSON arguments, where it
runs) and the limits each case runs under."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
from typing import Any, Callable

from ..errors import SweepError


def function_name(fn: str | Callable) -> str:
    """``fn`` as "package.module:function", the name every process of the sweep imports it by."""
    if isinstance(fn, str):
        if ":" not in fn:
            raise SweepError(f"a case's function {fn!r} is not named as 'package.module:function': name the module "
                             f"it is defined in and the function, e.g. 'tools.real_models:sweep_case'.")
        return fn
    qual = getattr(fn, "__qualname__", "")
    module = getattr(fn, "__module__", None)
    if not module or module == "__main__" or "<" in qual:
        raise SweepError(f"a case's function {fn!r} cannot be imported by name in another process (a lambda, a "
                         f"nested function or one of __main__): define it at the top level of an importable module.")
    return f"{module}:{qual}"


@dataclasses.dataclass(frozen=True)
class Case:
    """One case of a sweep: ``fn(*args, **kwargs)`` in a process of its own, its JSON result recorded
    under ``id``. ``backend``: the backend it exercises (its version is recorded); ``interpreter``: a
    python (path or name on PATH) to run it with, for a backend installed in another venv;
    ``resources`` and ``runtime_env``: what a Ray task of it asks for (a custom resource that the
    nodes with that backend offer, or Ray's runtime environment)."""

    id: str
    fn: str | Callable
    args: tuple = ()
    kwargs: dict = dataclasses.field(default_factory=dict)
    backend: str | None = None
    interpreter: str | None = None
    resources: dict | None = None
    runtime_env: dict | None = None

    def __post_init__(self):
        object.__setattr__(self, "fn", function_name(self.fn))
        object.__setattr__(self, "args", tuple(self.args))
        try:
            json.dumps([self.args, self.kwargs])
        except (TypeError, ValueError) as e:
            raise SweepError(f"case {self.id!r}: its arguments are not JSON data ({e}); pass names, paths and "
                             f"numbers, and build the objects inside the case's function.") from None

    def spec(self, memory_bytes: int = 0) -> dict:
        """What the case's process is given (_child.serve): its function, arguments and limit."""
        return {"id": self.id, "fn": self.fn, "args": list(self.args), "kwargs": dict(self.kwargs),
                "backend": self.backend, "interpreter": self.interpreter, "memory_bytes": memory_bytes,
                "path": [os.getcwd()]}


def interpreter_path(name: str) -> str:
    """The python ``name`` (a path, or a name on PATH) a case runs with."""
    path = shutil.which(name)
    if path is None:
        raise SweepError(f"interpreter {name!r} is not there: give the path of the python of the venv the "
                         f"case's backend is installed in (e.g. /opt/venvs/executorch/bin/python).")
    return path


@dataclasses.dataclass(frozen=True)
class Limits:
    """Per case: seconds before it is killed, the address space its process may take (GiB; 0: no
    limit), how many times a case whose worker was lost (not by its own doing) is run again, and the
    seconds past its limit a Ray task may take to return (start an interpreter, read the case's end)
    before it is cancelled and counted lost."""

    timeout: float = 600.0
    memory_gb: float = 0.0
    retries: int = 2
    grace: float = 60.0

    @property
    def memory_bytes(self) -> int:
        """The memory limit in bytes (0: none)."""
        return int(self.memory_gb * (1 << 30)) if self.memory_gb else 0

    def as_dict(self) -> dict[str, Any]:
        """The limits as plain data (what a record and a Ray task carry)."""
        return dataclasses.asdict(self)
