"""`pt2b export MODULE:CALLABLE OUT.pt2b`: capture the model a factory builds and write it; `pt2b export --hf
SOURCE --task TASK -o OUT.pt2b`: a transformers model exported for a task (exporter/hf.py)."""

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


def _output(ns) -> str:
    """The file to write: the second positional argument or -o, one of them."""
    if ns.output and ns.output_option:
        raise ExportError(f"two files to write ({ns.output!r} and -o {ns.output_option!r}); name one.")
    out = ns.output_option or ns.output
    if not out:
        raise ExportError("name the .pt2b to write: pt2b export MODULE:CALLABLE OUT.pt2b, or pt2b export --hf SOURCE "
                          "--task TASK -o OUT.pt2b.")
    return out


def _run_hf(ns) -> int:
    from .. import hf

    if ns.factory and not ns.output and not ns.output_option:
        ns.output_option, ns.factory = ns.factory, None  # `--hf SOURCE --task TASK OUT.pt2b`
    if ns.factory:
        raise ExportError(f"--hf and {ns.factory!r}: export either a transformers model (--hf SOURCE --task TASK) or "
                          "what MODULE:CALLABLE builds, not both.")
    if not ns.task:
        raise ExportError(f"--hf needs --task, one of {', '.join(hf.TASKS)}.")
    if ns.strict:
        raise ExportError("--strict is for MODULE:CALLABLE; with --hf the task chooses how torch.export captures it.")
    if ns.max_cache_len is not None and ns.task != hf.CACHED:
        raise ExportError(f"--max-cache-len is the KV cache's length of --task {hf.CACHED}; {ns.task} has no cache.")
    out = _output(ns)
    hf.check_request(ns.hf, ns.task)  # before torch and transformers are imported
    import torch

    dtype = getattr(torch, ns.dtype) if ns.dtype else None
    with progress.status(f"building {ns.hf} for {ns.task} and writing {out}"):
        prog = hf.export_hf(ns.hf, ns.task, out, max_cache_len=ns.max_cache_len, dtype=dtype, batch=ns.batch, seq=ns.seq)
    methods = list(prog.methods)
    print(f"wrote {out}" + (f" (methods {', '.join(methods)})" if len(methods) > 1 else ""))
    return 0


def run(ns) -> int:
    if ns.hf is not None:
        return _run_hf(ns)
    if ns.task or any(v is not None for v in (ns.max_cache_len, ns.dtype, ns.batch, ns.seq)):
        raise ExportError("--task, --max-cache-len, --dtype, --batch and --seq go with --hf SOURCE (a transformers "
                          "model).")
    if not ns.factory:
        raise ExportError("pt2b export needs MODULE:CALLABLE OUT.pt2b, or --hf SOURCE --task TASK -o OUT.pt2b.")
    out = _output(ns)
    from ..api import export_model

    with progress.status(f"building {ns.factory}"):
        model, args, kwargs, dyn, strict = _unpack_factory_result(_load_factory(ns.factory)())
    with progress.status(f"capturing and writing {out}"):
        export_model(model, args, out, kwargs=kwargs, dynamic_shapes=dyn, strict=strict or ns.strict)
    print(f"wrote {out}")
    return 0
