"""The backends pt2b lowers for, each derived from the installed backend, never from a typed list: the
ops it accepts, its version, and its hand-off (docs/backends.md). ``load_for_backend(path, preset=NAME)``
lowers to a backend's own op list; ``to_backend(NAME, lowered)`` hands the result over.

  inductor.py   torch's Inductor / AOTInductor (inside torch)
"""

from __future__ import annotations

import dataclasses
import importlib
from typing import Any, Callable

from ..errors import BackendUnavailableError

# backend name -> (module of this package, what to pip install when it is missing)
ADAPTERS: dict[str, tuple[str, str]] = {
    "inductor": ("inductor", "torch"),
}


@dataclasses.dataclass(frozen=True)
class Backend:
    name: str
    version: str                      # the installed backend's version
    supported_ops: tuple[str, ...]    # from the installed backend's own registry
    source: str                       # where in the backend the list comes from
    decompositions: Callable[[], dict]  # the backend's own decompositions (op -> fn), used before torch's
    hand_off: Callable[..., Any]      # (lowered, **options) -> the backend's own object
    run: Callable[..., Any]           # (the backend's object, *args) -> outputs

    @property
    def key(self) -> str:
        return f"{self.name}@{self.version}"


def names() -> tuple[str, ...]:
    return tuple(ADAPTERS)


def get(name: str) -> Backend:
    """The installed backend ``name`` (BackendUnavailableError naming the pip package when it is not)."""
    if name not in ADAPTERS:
        raise BackendUnavailableError(f"unknown backend {name!r}; pt2b knows {', '.join(ADAPTERS)}.")
    module, package = ADAPTERS[name]
    return _get(name, module, package)


_CACHE: dict[str, Backend] = {}


def _get(name: str, module: str, package: str) -> Backend:
    if name not in _CACHE:
        adapter = importlib.import_module(f"{__name__}.{module}")
        try:
            _CACHE[name] = adapter.backend()
        except ImportError as e:
            raise BackendUnavailableError(f"backend {name!r} is not installed here ({e}): pip install {package}") from None
    return _CACHE[name]


def to_backend(name: str, lowered, **options):
    """Hand ``lowered`` (load_for_backend's result, or any ExportedProgram) to backend ``name``: its own
    object (an AOTInductor package path, ...), which ``get(name).run(obj, *args)`` runs."""
    return get(name).hand_off(lowered, **options)
