"""`pt2b export MODULE:CALLABLE OUT.pt2b`: capture the model a factory builds and write it."""

from __future__ import annotations

from ..errors import ExportError
from . import progress


def _load_factory(spec: str):
    mod_name, sep, attr = spec.partition(":")
    if not sep or not mod_name or not attr:
        raise ExportError(f"expected MODULE:CALLABLE (e.g. mypkg.models:make_model), got {spec!r}.")
    from . import import_user_module

    try:
        mod = import_user_module(mod_name)
    except ImportError as e:
        raise ExportError(f"cannot import {mod_name!r} (searched the installed packages and the current "
                          f"folder): {e}") from e
    try:
        return getattr(mod, attr)
    except AttributeError:
        raise ExportError(f"module {mod_name!r} has no attribute {attr!r}.") from None


def _unpack_factory_result(res):
    """(model, args, kwargs, dynamic_shapes, strict) from what a factory returned."""
    if hasattr(res, "model") and hasattr(res, "args"):
        return (res.model, res.args, getattr(res, "kwargs", None), getattr(res, "dynamic_shapes", None),
                getattr(res, "strict", False))
    if isinstance(res, tuple) and 2 <= len(res) <= 4:
        model, args, *rest = res
        kwargs = rest[0] if rest else None
        dyn = rest[1] if len(rest) > 1 else None
        return model, args, kwargs, dyn, False
    raise ExportError(
        "the factory must return (model, args[, kwargs[, dynamic_shapes]]) or an object with "
        f".model and .args; got {type(res).__name__}."
    )


def run(ns) -> int:
    from ..api import export_model

    with progress.status(f"building {ns.factory}"):
        model, args, kwargs, dyn, strict = _unpack_factory_result(_load_factory(ns.factory)())
    with progress.status(f"capturing and writing {ns.output}"):
        export_model(model, args, ns.output, kwargs=kwargs, dynamic_shapes=dyn, strict=strict or ns.strict)
    print(f"wrote {ns.output}")
    return 0
