"""pt2b: export a PyTorch model once at its highest level, lower it per backend after load.

Public API: export_model, load, load_for_backend, eager_decompositions, plus errors and backends
(the backends pt2b lowers for: exporter/backends/).

The API is imported on first use (PEP 562): `import exporter` and `pt2b --version` cost little more
than `import torch`; torch.export's serializer (which imports torch._dynamo) and the lowering engine
load when a call needs them.
"""

from __future__ import annotations

import importlib

from . import errors
from .version import __version__

# public name -> the module that defines it
_LAZY = {"export_model": "api", "load": "api", "load_for_backend": "api", "eager_decompositions": "lowering.eager",
         "Pt2bProgram": "program"}

__all__ = ["__version__", "errors", "backends", "export_model", "load", "load_for_backend", "eager_decompositions",
           "Pt2bProgram"]


def __getattr__(name: str):
    module = _LAZY.get(name)
    if module is None:
        try:  # a submodule not imported yet (exporter.cli, exporter.names, ...)
            return importlib.import_module(f".{name}", __name__)
        except ModuleNotFoundError as e:
            if e.name != f"{__name__}.{name}":
                raise
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_LAZY))
