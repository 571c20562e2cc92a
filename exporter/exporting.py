"""What export_model was given (a module or a bound method with its example inputs, an
ExportedProgram, a LoweredProgram, or a dict of methods) turned into what the writer writes."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import torch

from . import capture as _capture
from . import dims
from .errors import ExportError
from .serialize import writer

__all__ = ["method_given", "methods_given"]


def method_given(m, args, kwargs, dynamic_shapes, strict, path, method: str | None = None, *,
                keep_unused_weights: bool = False):
    """(ep, ir level, lowering record, provenance, what the written program leaves out) of what
    export_model writes for one method: without the weights it never reads unless ``keep_unused_weights``
    (capture.unused_weights; the writer leaves them out, ``ep`` stays as given)."""
    ep, ir_level, lowering, provenance = _given(m, args, kwargs, dynamic_shapes, strict, path, method)
    unused = _capture.Unused() if keep_unused_weights else _capture.unused_weights(ep)
    if unused.targets:
        key = f"unused_weights_dropped:{method}" if method else "unused_weights_dropped"
        provenance[key] = ", ".join(unused.targets)
    return ep, ir_level, lowering, provenance, unused


def _given(m, args, kwargs, dynamic_shapes, strict, path, method: str | None):
    """(ep, ir level, lowering record, provenance) of what export_model was given for one method."""
    from .lowering.lowered import LoweredProgram

    if isinstance(m, (torch.export.ExportedProgram, LoweredProgram)):
        if path is None and isinstance(args, (str, os.PathLike)):
            args = None
        if args is not None or kwargs is not None or dynamic_shapes is not None:
            what = "a lowered program is written as lowered" if isinstance(m, LoweredProgram) else \
                "an ExportedProgram is written as captured"
            raise ExportError(f"{what}: do not pass args, kwargs or dynamic_shapes.")
        if isinstance(m, LoweredProgram):  # written with the record of how it was lowered (format 1.1+)
            return (m.exported_program(), f"lowered:{m.lowered_for}", m.lowering_record(),
                    {"lowered_by": f"pt2b load_for_backend ({m.lowered_for})",
                     **dims.provenance_entries(m.dim_names, method)})
        return m, _capture.ir_level_of(m), None, {"captured_by": "user (ExportedProgram given to export_model)",
                                                  **dims.provenance_entries(dims.names_at_capture(m), method)}
    if path is None:
        raise ExportError("export_model needs a destination path, e.g. export_model(model, (x,), 'model.pt2b').")
    unwrapped = _capture.subclass_weights(m) if isinstance(m, torch.nn.Module) else {}
    ep = _capture.capture(m, args, kwargs, dynamic_shapes=dynamic_shapes, strict=strict)
    provenance = {"captured_by": f"pt2b torch.export.export(strict={strict})",
                  **dims.provenance_entries(dims.names_at_capture(ep), method)}
    if unwrapped:
        provenance["subclass_weights_unwrapped"] = _capture.describe_subclass_weights(unwrapped)
    return ep, _capture.ir_level_of(ep), None, provenance


def methods_given(spec: Mapping[str, Any], dynamic_shapes, strict: bool,
             keep_unused_weights: bool) -> tuple[list, dict[str, str]]:
    """The MethodSources of a dict of methods, captured in order, and their provenance."""
    from .lowering.lowered import LoweredProgram

    writer.check_method_names(list(spec))
    if dynamic_shapes is not None and (not isinstance(dynamic_shapes, Mapping) or set(dynamic_shapes) - set(spec)):
        raise ExportError(f"with a dict of methods, dynamic_shapes is a dict by method name ({', '.join(spec)}); "
                          f"got {dynamic_shapes!r:.200}.")
    methods, provenance = [], {}
    for name, entry in spec.items():
        if isinstance(entry, (torch.export.ExportedProgram, LoweredProgram)):
            if dynamic_shapes and name in dynamic_shapes:
                raise ExportError(f"method {name!r} is given as a program: do not pass dynamic_shapes for it.")
            ep, ir_level, lowering, prov, unused = method_given(entry, None, None, None, strict, "", name,
                                                               keep_unused_weights=keep_unused_weights)
        elif isinstance(entry, tuple) and len(entry) in (2, 3):
            fn, margs, mkwargs = (*entry, None)[:3]
            module = _capture.as_module(fn, f"method {name!r}")
            ep, ir_level, lowering, prov, unused = method_given(module, margs, mkwargs,
                                                               (dynamic_shapes or {}).get(name), strict, "", name,
                                                               keep_unused_weights=keep_unused_weights)
        else:
            raise ExportError(f"method {name!r} must be (module_or_bound_method, args[, kwargs]), an "
                              f"ExportedProgram or a LoweredProgram; got {type(entry).__name__}.")
        methods.append(writer.MethodSource(name, ep, ir_level, lowering, unused))
        for k, v in prov.items():
            provenance.setdefault(k, v)
    return methods, provenance
