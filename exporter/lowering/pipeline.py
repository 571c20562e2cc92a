"""The lowering request path, one way: read -> (cache lookup) -> lower -> validate -> (cache store)
-> LoweredProgram. Each stage takes the previous stage's complete object and returns a new one."""

from __future__ import annotations

import dataclasses
import functools
import time

from .. import dims
from ..lazy import Lazy
from ..loading import exported_program_of, program_of, same_content
from ..serialize import reader
from ..util.gc_pause import gc_paused
from .._torch.deferred_codegen import deferred
from . import cache as _cache
from .cache import stored_or_lowered
from .lower import lower
from .lowered import LoweredProgram
from .plan import LoweringPlan
from .repair import validated

__all__ = ["lower_artifact", "lower_exported"]


def lower_artifact(path, plan: LoweringPlan, *, device: str = "cpu", verify: bool = False, cache: bool | None = None,
                   validate: bool = True, method: str | None = None) -> LoweredProgram:
    """The artifact at ``path`` lowered with ``plan`` (load_for_backend's arguments, documented there):
    served from the cache where it holds this request, else lowered, validated and stored."""
    use_cache = _cache.enabled(cache) and plan.fingerprint is not None and device == "cpu"
    with gc_paused():  # the trace allocates fx nodes and fake tensors by the 10^4 as well
        art = reader.open_artifact(path)  # looked up, and on a miss lowered and stored, from this one reading
        # the custom ops it inlines are known from the operator table: the cache slot is the lowering's own
        if plan.inlines is not None:  # (a preset inlines none: its requests read no more than before)
            plan = plan.with_kernels_for(_cache.op_qualnames(art, art.method_names if method is None else [method]))
        # one slot for all methods, one per method asked for by name; None: the cache is not usable (warned)
        entry = _cache.Entry.of(art, plan, method=method, device=device) if use_cache else None
        served = _served(entry, art, path, verify=verify, validate=validate) if entry is not None else None
        if served is not None:
            return served
        names = list(art.method_names) if method is None else [reader.method(art, method).method]
        if verify:
            reader.verify_weights(art)
        lowerings, sources = {}, {}
        for name in names:  # one file mapping: the methods' shared weights stay one set of bytes
            prog = program_of(reader.method(art, name))
            with deferred():  # lowered below: its own code is generated only if it is run
                ep = prog.exported_program()
            if device != "cpu":
                from torch.export.passes import move_to_device_pass

                ep = move_to_device_pass(ep, device)
            t0 = time.perf_counter()
            low = lower(ep, plan)
            if validate and device == "cpu":  # (at most the lowering's own time in runs of the programs)
                low = validated(low, ep, budget=time.perf_counter() - t0)
            lowerings[name], sources[name] = low, (ep, prog, prog.dim_names)
        if entry is not None:
            entry.store(lowerings, source=art)  # refuses a source whose weights are not the ones it records
    return _result(lowerings, sources)


def lower_exported(source_ep, plan: LoweringPlan, *, validate: bool = False, source=None) -> LoweredProgram:
    """An ExportedProgram in memory lowered with ``plan`` (validated against it where ``validate``)."""
    t0 = time.perf_counter()
    low = lower(source_ep, plan)
    if validate:
        low = validated(low, source_ep, budget=time.perf_counter() - t0)
    return LoweredProgram(low, source_ep=source_ep, source=source)


def _served(entry, art, path, *, verify: bool, validate: bool) -> LoweredProgram | None:
    """The cache's lowering of every method the slot holds, or None on a miss (or an entry stored
    without the validation this request asks for)."""
    hits = entry.open(verify=verify)  # each method's Lowering; graphs checked and built on first use
    if hits is None or (validate and any(h.validation is None for h in hits.values())):
        return None
    if verify:
        reader.verify_weights(art)  # the source's own, against its digests (a damaged file is an error)
    provenance = reader.read_provenance(art)
    lowerings, sources = {}, {}
    for name, hit in hits.items():
        source = Lazy(functools.partial(same_content, path, art.digest, name))
        source_ep = Lazy(functools.partial(exported_program_of, source))
        lowerings[name] = dataclasses.replace(hit, program=Lazy(functools.partial(stored_or_lowered, hit, source_ep)))
        sources[name] = (source_ep, source, dims.from_provenance(provenance, name))
    return _result(lowerings, sources)


def _result(lowerings: dict, sources: dict) -> LoweredProgram:
    """The default method's LoweredProgram, each method's built complete and knowing all of them."""
    methods: dict[str, LoweredProgram] = {}
    for name, low in lowerings.items():
        source_ep, source, dim_names = sources[name]
        methods[name] = LoweredProgram(low, source_ep=source_ep, source=source, method=name, methods=methods,
                                       dim_names=dim_names)
    return next(iter(methods.values()))
