"""pt2b: export a PyTorch model once at its highest level, lower it per backend after load.

Public API: the names in ``__all__`` (docs/api.md is generated from it): export_model, load,
load_for_backend, eager_decompositions, the classes they return, and the modules errors and backends
(the backends pt2b lowers for: exporter/backends/). Anything else is internal: reach a submodule with
an import (``import exporter.cli``), never as an attribute of the package.

The API is imported on first use (PEP 562): `import exporter` and `pt2b --version` cost little more
than `import torch`; torch.export's serializer (which imports torch._dynamo) and the lowering engine
load when a call needs them.
"""

from __future__ import annotations

import importlib

from . import errors
from .version import __version__

# public name -> the module that defines it (None: the name is that submodule of the package)
_LAZY = {
    "backends": None,
    "sweep": None,
    "export_model": "api",
    "load": "api",
    "load_for_backend": "api",
    "register_tensor_subclass": "tensor_subclasses",
    "export_hf": "hf",
    "eager_decompositions": "api",
    "Pt2bProgram": "program",
    "OperatorInfo": "program",
    "LoweredProgram": "lowering.lowered",
    "EagerContext": "lowering.eager",
    "EagerDecompositions": "lowering.eager",
}

__all__ = ["__version__", "errors", "backends", "sweep", "export_model", "load", "load_for_backend", "eager_decompositions",
           "register_tensor_subclass", "export_hf", "Pt2bProgram", "OperatorInfo", "LoweredProgram", "EagerContext", "EagerDecompositions"]


def __getattr__(name: str):
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}; its public names are "
                             f"{', '.join(__all__)} (a submodule is reached with `import {__name__}.<module>`)")
    module = _LAZY[name]
    value = importlib.import_module(f".{module or name}", __name__)
    if module is not None:
        value = getattr(value, name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_LAZY))
