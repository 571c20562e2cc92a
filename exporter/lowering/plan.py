"""plan_lowering(): a lowering request (a preset or a backend's op list, keep, decompose, your own
decompositions, lossless) resolved into a LoweringPlan, before any graph is touched."""

from __future__ import annotations

import dataclasses
import functools
import json
import warnings
from typing import Any, Callable

import torch

from ..errors import LoweringError, UnknownOpsWarning
from ..functionalize import forced_ops
from ..mutation import functional_variant
from ..ops import OpMatcher, op_name, resolve_op
from .._torch.custom_kernels import composite_kernel
from . import presets as _presets
from . import rewrites, tables

ATEN_LIKE = {"aten", "prims"}


@dataclasses.dataclass(frozen=True)
class LoweringPlan:
    """What a lowering request resolves to: the decomposition table, which ops the result may hold
    (``accepts``), and everything that determines the result (``fingerprint``)."""

    table: dict
    accepts: Callable
    label: str  # what the lowering is for, as messages and reports name it ("core@2.13", "onnx@1.20")
    description: str
    closed_opset: bool  # an op the result holds outside ``accepts`` is an OpsetError (else only reported)
    keep: OpMatcher | None
    supported: OpMatcher | None
    fingerprint: str | None  # everything that determines the result; None when it cannot be keyed
    withheld: dict = dataclasses.field(default_factory=dict)  # lossless=True: op name -> measured error
    unknown: list = dataclasses.field(default_factory=list)  # supported_ops names this torch lacks (left out)
    preset: str | None = None  # the preset asked for ("core", "core@2.13"); None for a backend or an op list
    backend: str | None = None  # the backend whose own op list this is ("onnx"); None otherwise
    # op -> whether a custom op the backend does not list is lowered through its own kernel (None: never)
    inlines: Callable | None = None
    inlined: tuple = ()  # the custom ops whose kernels the table holds (with_kernels_for), by name
    # "reference": an op no decomposition brings into ``accepts`` stays in the result, reported, for the
    # reference to run beside the backend (to_backend's fallback); None: it is an OpsetError (closed opset)
    fallback: str | None = None

    def with_kernels_for(self, ops) -> "LoweringPlan":
        """This plan with, in its table, the kernel of each custom op of ``ops`` (op overloads or their
        names) that its backend does not list and keep= does not name, where the op's author registered
        one kernel for every device (torch.library.custom_op's default): the ops that kernel calls are
        what the backend gets. A kernel that does not trace on a call's values (it reads data to decide
        its control flow) is declined there by the engine, and the op stays, as without a kernel."""
        if self.inlines is None:
            return self
        kernels = {}
        for op in ops:
            op = resolve_op(op) if isinstance(op, str) else op
            if isinstance(op, torch._ops.OpOverload) and op not in self.table and self.inlines(op):
                kernel = composite_kernel(op)
                if kernel is not None:
                    kernels[op] = kernel
        if not kernels:
            return self
        return dataclasses.replace(self, table={**self.table, **kernels},
                                   inlined=tuple(sorted({*self.inlined, *map(op_name, kernels)})))

    def without(self, ops) -> "LoweringPlan":
        """This plan with ``ops`` left out of its table (what accepts them is unchanged), custom ops among
        them no longer given their kernels. An in-place op goes with its functional variant: the lowering
        decomposes an in-place call as that variant (``silu_`` as ``silu``), so that is what keeps it."""
        ops = set(ops)
        ops |= {f for op in ops if isinstance(op, torch._ops.OpOverload) and (f := functional_variant(op)) is not None}
        inlines = self.inlines if self.inlines is None else (lambda op, was=self.inlines: was(op) and op not in ops)
        names = {op_name(op) for op in ops}
        return dataclasses.replace(self, table={op: fn for op, fn in self.table.items() if op not in ops},
                                   inlines=inlines, inlined=tuple(n for n in self.inlined if n not in names))

    def reporting(self) -> "LoweringPlan":
        """This plan with what falls outside its opset reported, not refused, and nothing withheld
        (coverage measures what a request leaves; it does not stop at the first model)."""
        return dataclasses.replace(self, closed_opset=False, withheld={})


FALLBACKS = ("reference",)  # where what a backend cannot take may run: runtime_ref's way, the ATen kernels


def fallback_refusal(fallback) -> str | None:
    """Why ``fallback`` is not a fallback pt2b knows, or None (None itself: no fallback)."""
    if fallback is None or fallback in FALLBACKS:
        return None
    return (f"fallback={fallback!r}: pt2b falls back on 'reference' (runtime_ref's way: the program's own ATen "
            f"kernels), or None for no fallback.")


def is_custom(op) -> bool:
    return isinstance(op, torch._ops.OpOverload) and op.namespace not in ATEN_LIKE


def _entries(entries) -> list:
    if entries is None:
        return []
    return [entries] if isinstance(entries, (str, torch._ops.OpOverload, torch._ops.OpOverloadPacket)) else list(entries)


def _entry_text(e) -> str:
    return op_name(e) if isinstance(e, torch._ops.OpOverload) else str(e)


def _matcher(entries, what: str, unknown_out: list | None = None) -> OpMatcher | None:
    """The matcher of an op list. A name the running torch lacks is a LoweringError, unless
    ``unknown_out`` collects such names (a backend's own list, taken as it comes)."""
    if entries is None:
        return None
    try:
        m = OpMatcher(_entries(entries))
    except TypeError as e:
        raise LoweringError(f"{what}: {e}") from None
    unknown = m.unknown_entries()
    if unknown and unknown_out is None:
        named = [f"{n} (did you mean {close}?)" if (close := OpMatcher.closest(n)) else n for n in unknown]
        raise LoweringError(f"{what} names ops this torch does not have: {', '.join(named)} "
                            f"(write them as 'aten::add.Tensor', 'aten.add', 'aten.add.*' or 'mylib::*').")
    if unknown_out is not None:
        unknown_out.extend(unknown)
    return m


def _foreign_supported_ops(supported_ops, warn: bool = True) -> tuple[OpMatcher, list[str]]:
    """A backend's supported_ops as it comes: names this torch lacks (TorchScript-only overloads such as
    aten::add.int, ops of another release, typos) are left out with an UnknownOpsWarning naming them
    (``warnings.simplefilter("error", UnknownOpsWarning)`` makes them an error)."""
    unknown: list[str] = []
    m = _matcher(supported_ops, "supported_ops", unknown)
    if unknown and warn:
        hint = lambda n: f"{n} (did you mean {c}?)" if (c := OpMatcher.closest(n)) else n  # noqa: E731
        shown = ", ".join(map(hint, unknown[:8])) + (f" and {len(unknown) - 8} more" if len(unknown) > 8 else "")
        warnings.warn(f"supported_ops names {len(unknown)} op(s) this torch ({torch.__version__}) does not have, "
                      f"left out: {shown} (LoweredProgram.unknown_supported_ops lists them all).",
                      UnknownOpsWarning, stacklevel=4)
    return m, unknown


def _user_table(decompositions) -> dict:
    out = {}
    for key, fn in (decompositions or {}).items():
        op = resolve_op(key) if isinstance(key, str) else key
        if not isinstance(op, torch._ops.OpOverload) or not callable(fn):
            raise LoweringError(f"decompositions must map op overloads to callables; got {key!r}: {fn!r}.")
        out[op] = fn
    return out


def _withhold_lossy(table: dict, user: dict) -> dict[str, str]:
    """lossless=True: drop from ``table`` every decomposition the audit classes lossy or wrong (a
    decomposition the caller passed in ``decompositions`` is theirs to trust); op name -> why."""
    from . import verdicts

    stored = verdicts.read()
    if stored is None:
        minor = _presets.torch_minor()
        raise LoweringError(f"lossless=True needs the decomposition audit of torch {minor} "
                            f"(schemas/opsets/audit@{minor}.json): run `pt2b opset audit`.")
    withheld = {}
    for op in list(table):
        rec = stored["ops"].get(op_name(op))
        if op not in user and rec is not None and rec["verdict"] in ("lossy", "wrong"):
            del table[op]
            withheld[op_name(op)] = f"its decomposition is {rec['verdict']}: {verdicts.describe(rec)}"
    return withheld


def _check_keepable(keep_m: OpMatcher | None) -> None:
    """keep= naming an op every lowering decomposes whatever its table says (functionalize.forced_ops:
    ops that write their inputs, such as batch_norm's running stats, or have no functional form) is a
    LoweringError: it cannot be kept, and keeping it silently would not happen."""
    if keep_m is None or not keep_m.exact:
        return
    forced = sorted(keep_m.exact & {op_name(op) for op in forced_ops()})
    if forced:
        raise LoweringError(f"keep names ops that every lowering decomposes, whatever its table says: {', '.join(forced)} "
                            f"(torch decomposes them before any table applies: they write their inputs or have no "
                            f"functional form). Keep the ops they decompose to instead (LoweredProgram.explain shows "
                            f"them).")


def _keeps(keep_m: OpMatcher | None) -> Callable:
    """Whether keep= protects an op: it names the op, or an in-place op whose functional variant the op
    is (the lowering decomposes an in-place call as that variant: keeping ``silu_`` keeps ``silu``)."""
    if keep_m is None:
        return lambda op: False

    @functools.cache
    def kept(op) -> bool:
        if op in keep_m:
            return True
        if not isinstance(op, torch._ops.OpOverload) or op.namespace != "aten":
            return False
        inplace = getattr(torch.ops.aten, op._overloadpacket.__name__ + "_", None)
        return inplace is not None and any(functional_variant(o) is op and o in keep_m
                                           for o in (getattr(inplace, name) for name in inplace.overloads()))

    return kept


def _extra_decompositions(decompose, kept) -> dict:
    """The registered decompositions of the ops ``decompose`` names (kept ops excluded)."""
    m = _matcher(decompose, "decompose")
    if m is None:
        return {}
    available = tables.available_decompositions()
    chosen = {op: fn for op, fn in available.items() if op in m and not kept(op)}
    names = {op_name(op) for op in available}
    missing = sorted(n for n in m.exact if n not in names)
    if missing:
        raise LoweringError(f"decompose names ops that have no registered decomposition: {', '.join(missing)} "
                            f"(pass your own with decompositions={{op: fn}}).")
    return chosen


@functools.cache
def _preset_base(p: _presets.Preset) -> tuple[dict, dict, str]:
    """(op -> decomposition, op -> name, the preset as JSON) for preset ``p``, computed once: torch's
    tables are fixed for the process (tables.py caches them), and a cache hit would otherwise
    rebuild this on every request."""
    source_table = tables.torch_default_table() if p.name == "core" else tables.available_decompositions()
    by_name = {op_name(op): op for op in source_table}
    table = {by_name[n]: source_table[by_name[n]] for n in p.decompose if n in by_name}
    return table, {op: n for n, op in by_name.items() if op in table}, p.to_json()


@dataclasses.dataclass(frozen=True)
class _Resolved:
    """What a preset, a backend or an op list contributes to a plan."""

    table: dict
    accepts: Callable
    label: str
    description: str
    closed_opset: bool
    what: dict  # the fingerprint's part for it
    names: dict = dataclasses.field(default_factory=dict)  # op -> its name in the source table
    supported: OpMatcher | None = None
    unknown: list = dataclasses.field(default_factory=list)
    inlines: Callable | None = None


def _lacks(sup_m: OpMatcher, kept) -> Callable:
    """Whether a custom op is one a backend with list ``sup_m`` lacks and keep= does not protect."""
    return lambda op: is_custom(op) and op not in sup_m and not kept(op)


def _for_whole_table_backend(backend, extra: dict, user: dict, kept) -> _Resolved:
    """A backend that decomposes with its own whole table and translates whatever that leaves (OpenVINO)."""
    sup_m, unknown = _foreign_supported_ops(backend.supported_ops, warn=False)
    table = {op: fn for op, fn in backend.decompositions().items() if not kept(op)}
    table.update(extra)
    table.update(user)
    base = dict(table)  # (what a rewrite declines stays for the backend, as without one)
    for op, fn in tables.pt2b_decompositions().items():  # pt2b's own, for what the backend does not name
        if op not in sup_m and not kept(op):
            table.setdefault(op, fn)
    return _Resolved(table, lambda op: op not in base or kept(op), backend.key,
                     f"decomposed with {backend.name}'s own table ({backend.source}); {backend.name} "
                     f"{backend.version} takes what it leaves", True,
                     {"backend": backend.key, "supported_ops": sorted(backend.supported_ops), "inline_custom_ops": True},
                     supported=sup_m, unknown=unknown, inlines=_lacks(sup_m, kept))


def _for_op_list(supported_ops, backend, extra: dict, user: dict, kept) -> _Resolved:
    """Decomposed until only ``supported_ops`` remain (a backend's own list when ``backend`` is given)."""
    sup_m, unknown = _foreign_supported_ops(supported_ops, warn=backend is None)
    available = tables.closure_decompositions()
    if backend is not None:  # what the backend decomposes itself, as it does it
        available.update(backend.decompositions())
    table = {op: fn for op, fn in available.items() if op not in sup_m and not kept(op)}
    # pt2b's routes for ops whose torch route ends outside any backend's list, where this one takes them
    table.update(rewrites.preferred_routes(lambda op: op in sup_m or kept(op)))
    table.update(extra)
    table.update(user)
    falls_back = backend is not None and backend.falls_back_to_aten  # (an op without a decomposition runs as it is)
    accepts = lambda op: op in sup_m or kept(op) or ((falls_back or is_custom(op)) and op not in table)
    what = {"supported_ops": sorted(_entry_text(e) for e in _entries(supported_ops))}
    # a backend that runs any op by its ATen kernel runs a custom op by its own kernels too: it stays whole
    inlines = None if falls_back else _lacks(sup_m, kept)
    if inlines is not None:
        what["inline_custom_ops"] = True
    if backend is None:
        return _Resolved(table, accepts, "supported_ops", "decomposed until only the backend's supported ops remain",
                         True, what, supported=sup_m, unknown=unknown, inlines=inlines)
    description = (f"decomposed until only {backend.name}'s own ops remain ({len(backend.supported_ops)} "
                   f"from {backend.source}, {backend.name} {backend.version})")
    if falls_back:
        description += "; an op without a decomposition is taken as it is (the backend runs its ATen kernel)"
    what["backend"] = backend.key
    return _Resolved(table, accepts, backend.key, description, True, what, supported=sup_m, unknown=unknown,
                     inlines=inlines)


def _for_preset(preset: str, extra: dict, user: dict, kept) -> _Resolved:
    p = _presets.load(preset)
    base, names, frozen = _preset_base(p)
    table = {op: fn for op, fn in base.items() if not kept(op)}
    table.update(extra)
    table.update(user)
    opset_m = OpMatcher(p.opset) if p.opset is not None else None
    if opset_m is None:  # none/max: any op the table no longer decomposes
        accepts = lambda op: op not in table or kept(op)
    else:
        accepts = lambda op: op in opset_m or kept(op) or (is_custom(op) and op not in table)
    # a pinned preset ("core@2.13") guarantees its frozen opset: anything outside is an error
    closed = p.closed_opset or ("@" in preset and p.opset is not None)
    return _Resolved(table, accepts, p.key, p.description, closed, {"preset": preset, "frozen": frozen}, names)


def plan_lowering(preset: str | None = "core", *, backend: Any = None, supported_ops=None, decompositions=None,
                  keep=None, decompose=None, lossless: bool = False, fallback: str | None = None) -> LoweringPlan:
    """Resolve a request into a LoweringPlan. One of: ``preset`` (a name of presets.PRESETS, optionally
    @<torch version>); ``backend`` (an installed backend as exporter.backends.get returns it: its own op
    list and decompositions); ``supported_ops`` (your backend's op list). ``keep``: ops never to
    decompose. ``decompose``: ops to decompose beyond the preset, with the decompositions torch
    registers for them (``decompositions`` passes your own functions instead). ``lossless``: withhold
    the decompositions the audit classes lossy or wrong (LoweringPlan.withheld). ``fallback="reference"``
    (with ``backend`` or ``supported_ops``): an op no decomposition brings to the list stays, reported,
    for the reference to run beside the backend (LoweringPlan.fallback)."""
    if (why := fallback_refusal(fallback)) is not None:
        raise LoweringError(why)
    if fallback is not None and backend is None and supported_ops is None:
        raise LoweringError(f"fallback={fallback!r} leaves what a backend cannot take to the reference beside it: "
                            f"lower with backend=NAME or supported_ops=[...] too (a preset needs no fallback).")
    if backend is not None and supported_ops is not None:
        raise LoweringError(f"backend {backend.name!r} brings its own op list: pass supported_ops or backend, "
                            f"not both.")
    keep_m = _matcher(keep, "keep")
    _check_keepable(keep_m)
    kept = _keeps(keep_m)
    user = _user_table(decompositions)
    extra = _extra_decompositions(decompose, kept)
    if backend is not None and backend.takes_what_its_table_leaves:
        r = _for_whole_table_backend(backend, extra, user, kept)
    elif backend is not None:
        r = _for_op_list(backend.supported_ops, backend, extra, user, kept)
    elif supported_ops is not None:
        r = _for_op_list(supported_ops, None, extra, user, kept)
    else:
        r = _for_preset(preset or "core", extra, user, kept)
    table = r.table
    withheld = _withhold_lossy(table, user) if lossless else {}
    what = dict(r.what, keep=sorted(_entry_text(e) for e in _entries(keep)),
                decompose=sorted(op_name(op) for op in extra), closed_opset=r.closed_opset, lossless=lossless,
                table=sorted(r.names.get(op) or op_name(op) for op in table), withheld=sorted(withheld))
    description = r.description
    if fallback is not None:  # (a lowering that leaves ops to the reference is another request: keyed apart)
        what["fallback"] = fallback
        description += f"; an op no decomposition brings to it is left for the {fallback} (fallback={fallback!r})"
    fingerprint = None if user else json.dumps(what, sort_keys=True)
    label = r.label + ("+lossless" if lossless else "") + ("+fallback" if fallback is not None else "")
    return LoweringPlan(table, r.accepts, label, description,
                        r.closed_opset, keep_m, r.supported, fingerprint, withheld, r.unknown,
                        preset=(preset or "core") if backend is None and supported_ops is None else None,
                        backend=backend.name if backend is not None else None, inlines=r.inlines,
                        fallback=fallback)
