"""Write docs/api.md, the reference of pt2b's public Python API, from the signatures and docstrings
in the code (the one place they are written): `python -m tools.api_reference > docs/api.md`.
tests/repo/test_api_reference.py checks the page is what this prints and that every public signature is
annotated."""

from __future__ import annotations

import inspect
import sys
import typing


def public_api() -> list[tuple[str, object]]:
    """(qualified name, object) of everything a user of pt2b calls, in the order the page shows."""
    import exporter
    import runtime_ref
    from exporter.lowering.eager import EagerContext, EagerDecompositions
    from exporter.lowering.lowered import LoweredProgram
    from exporter.program import OperatorInfo

    return [
        ("exporter.export_model", exporter.export_model),
        ("exporter.load", exporter.load),
        ("exporter.load_for_backend", exporter.load_for_backend),
        ("exporter.eager_decompositions", exporter.eager_decompositions),
        ("exporter.Pt2bProgram", exporter.Pt2bProgram),
        ("exporter.program.OperatorInfo", OperatorInfo),
        ("exporter.lowering.lowered.LoweredProgram", LoweredProgram),
        ("exporter.lowering.eager.EagerContext", EagerContext),
        ("exporter.lowering.eager.EagerDecompositions", EagerDecompositions),
        ("runtime_ref.Runtime", runtime_ref.Runtime),
        ("runtime_ref.default_opset_accepts", runtime_ref.default_opset_accepts),
        ("runtime_ref.op_name", runtime_ref.op_name),
    ]


def type_namespace() -> dict:
    """The names the public annotations use (some are imported only for type checkers)."""
    import os
    from collections.abc import Callable, Iterable, Mapping

    import torch

    from exporter.api import StrPath
    from exporter.lowering.eager import EagerContext, EagerDecompositions
    from exporter.lowering.lowered import LoweredProgram
    from exporter.ops import OpSpec
    from exporter.program import Pt2bProgram

    return {"os": os, "torch": torch, "Any": typing.Any, "Callable": Callable, "Iterable": Iterable,
            "Mapping": Mapping, "StrPath": StrPath, "OpSpec": OpSpec, "LoweredProgram": LoweredProgram,
            "Pt2bProgram": Pt2bProgram, "EagerContext": EagerContext, "EagerDecompositions": EagerDecompositions}


CONSTRUCTED = ("Runtime",)  # classes users construct (the others are returned by pt2b's functions)


def members(cls) -> list[tuple[str, object]]:
    """The public methods and properties a class defines itself or inherits from pt2b's own bases
    (``__init__`` of the classes users construct, ``__call__`` and ``__enter__`` of any)."""
    dunder = ("__call__", "__enter__") + (("__init__",) if cls.__name__ in CONSTRUCTED else ())
    out = []
    for base in reversed([c for c in cls.__mro__ if c.__module__.split(".")[0] in ("exporter", "runtime_ref")]):
        for name, value in vars(base).items():
            if (not name.startswith("_") or name in dunder) and \
                    (inspect.isfunction(value) or isinstance(value, property)):
                out = [(n, v) for n, v in out if n != name] + [(name, value)]
    return out


class _Text(str):
    """An annotation as written in the source (the modules use postponed evaluation)."""

    def __repr__(self) -> str:
        return str(self)


def _signature(fn) -> str:
    sig = inspect.signature(fn)

    def plain(a):
        return _Text(a) if isinstance(a, str) else a

    params = [p.replace(annotation=plain(p.annotation)) for p in sig.parameters.values()]
    return str(sig.replace(parameters=params, return_annotation=plain(sig.return_annotation)))


def _doc(obj) -> str:
    return inspect.cleandoc(obj.__doc__ or "").strip()


def render() -> str:
    lines = ["# Python API reference", "",
             "Generated from the signatures and docstrings in the code by `python -m tools.api_reference > "
             "docs/api.md`; a test fails when this page and the code disagree. The package ships `py.typed`: "
             "type checkers read these annotations.", ""]
    for qualname, obj in public_api():
        if inspect.isclass(obj):
            lines += [f"## class `{qualname}`", "", _doc(obj), ""]
            for name, member in members(obj):
                fn = member.fget if isinstance(member, property) else member
                label = f"`{name}` (property)" if isinstance(member, property) else f"`{name}{_signature(fn)}`"
                lines += [f"### {label}", ""]
                if _doc(fn):
                    lines += [_doc(fn), ""]
        else:
            lines += [f"## `{qualname}{_signature(obj)}`", "", _doc(obj), ""]
    return "\n".join(lines).rstrip() + "\n"


if __name__ == "__main__":
    sys.stdout.write(render())
