"""lower(): functionalize + decompose an undecomposed program for one backend, then verify."""

from __future__ import annotations

import dataclasses
import functools
import json
import warnings
from typing import Callable

import torch

from ..errors import LoweringError, OpsetError, UnknownOpsWarning
from .._torch.dispatch import drop_cached_dispatches
from ..functionalize import forced_ops, program_fake_mode
from ..ops import OpMatcher, op_name, resolve_op
from . import presets as _presets
from . import tables
from .deferred_codegen import compiled, deferred
from ..lazy import Lazy
from ..util.process_state import preserved
from .engines import lower_program
from .lowered import LoweredProgram
from .opset_check import outside, route_lines

ATEN_LIKE = {"aten", "prims"}


def _is_custom(op) -> bool:
    return isinstance(op, torch._ops.OpOverload) and op.namespace not in ATEN_LIKE


def _matcher(entries, what: str, unknown_out: list | None = None) -> OpMatcher | None:
    """The matcher of an op list. A name the running torch lacks is a LoweringError, unless
    ``unknown_out`` collects such names (a backend's own list, taken as it comes)."""
    if entries is None:
        return None
    if isinstance(entries, (str, torch._ops.OpOverload, torch._ops.OpOverloadPacket)):
        entries = [entries]
    try:
        m = OpMatcher(entries)
    except TypeError as e:
        raise LoweringError(f"{what}: {e}") from None
    unknown = m.unknown_entries()
    if unknown and unknown_out is None:
        raise LoweringError(f"{what} names ops this torch does not have: {', '.join(unknown)} "
                            f"(write them as 'aten::add.Tensor', 'aten.add', 'aten.add.*' or 'mylib::*').")
    if unknown_out is not None:
        unknown_out.extend(unknown)
    return m


def _foreign_supported_ops(supported_ops, strict: bool, warn: bool = True) -> tuple[OpMatcher, list[str]]:
    """A backend's supported_ops as it comes: names this torch lacks (TorchScript-only overloads such as
    aten::add.int, ops of another release, typos) are left out with an UnknownOpsWarning naming them;
    strict=True refuses them."""
    unknown: list[str] = []
    m = _matcher(supported_ops, "supported_ops", unknown)
    if unknown and strict:
        raise LoweringError(f"supported_ops names ops this torch does not have: {', '.join(unknown)} (strict=True "
                            f"refuses them; without strict they are left out with a warning).")
    if unknown and warn:
        shown = ", ".join(unknown[:8]) + (f" and {len(unknown) - 8} more" if len(unknown) > 8 else "")
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


@dataclasses.dataclass
class LoweringPlan:
    """What a lowering request resolves to before any graph is touched."""

    table: dict
    accepts: Callable
    label: str
    description: str
    strict: bool
    keep: OpMatcher | None
    supported: OpMatcher | None
    fingerprint: str | None  # everything that determines the result; None when it cannot be keyed
    withheld: dict = dataclasses.field(default_factory=dict)  # strict=True: op name -> measured error
    unknown: list = dataclasses.field(default_factory=list)  # supported_ops names this torch lacks (left out)


def _withhold_untrusted(table: dict, user: dict) -> dict[str, str]:
    """strict=True: drop from ``table`` every decomposition the audit classes lossy or wrong (a
    decomposition the caller passed in ``decompositions`` is theirs to trust); op name -> why."""
    from . import verdicts
    from .presets import torch_minor

    stored = verdicts.read()
    if stored is None:
        raise LoweringError(f"strict=True needs the decomposition audit of torch {torch_minor()} "
                            f"(schemas/opsets/audit@{torch_minor()}.json): run `pt2b opset audit`.")
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


def _backend_of(preset: str):
    """The installed backend a preset names ("inductor"), or None for pt2b's own presets."""
    from .. import backends

    return backends.get(preset) if preset in backends.names() else None


def _entry_text(e) -> str:
    return op_name(e) if isinstance(e, torch._ops.OpOverload) else str(e)


def plan_lowering(preset: str = "core", *, supported_ops=None, decompositions=None, keep=None,
                  decompose=None, strict: bool = False) -> LoweringPlan:
    """Resolve a preset or supported_ops list, keep, decompose and decompositions into a table and an
    accept rule. ``decompose``: ops to decompose beyond the preset, with the decompositions torch
    registers for them (``decompositions`` passes your own functions instead).
    ``strict``: withhold the decompositions the audit classes lossy or wrong (LoweringPlan.withheld)."""
    keep_m = _matcher(keep, "keep")
    _check_keepable(keep_m)
    kept = (lambda op: op in keep_m) if keep_m is not None else (lambda op: False)
    user = _user_table(decompositions)
    extra = _extra_decompositions(decompose, kept)
    sup_m, unknown, backend = None, [], _backend_of(preset)
    if backend is not None:  # a backend's own op list, as the installed backend gives it (backends/)
        if supported_ops is not None:
            raise LoweringError(f"preset {preset!r} is the backend's own op list: pass supported_ops or the "
                                f"backend's preset, not both.")
        supported_ops = backend.supported_ops
    if backend is not None and backend.takes_what_its_table_leaves:
        # the backend decomposes with its own whole table and translates whatever that leaves (OpenVINO)
        sup_m, unknown = _foreign_supported_ops(supported_ops, strict, warn=False)
        names = {}
        table = {op: fn for op, fn in backend.decompositions().items() if not kept(op)}
        table.update(extra)
        table.update(user)
        accepts = lambda op: op not in table or kept(op)
        label, opset_strict = backend.key, True
        description = (f"decomposed with {backend.name}'s own table ({backend.source}); {backend.name} "
                       f"{backend.version} takes what it leaves")
        what = {"backend": backend.key, "supported_ops": sorted(supported_ops)}
    elif supported_ops is not None:
        sup_m, unknown = _foreign_supported_ops(supported_ops, strict, warn=backend is None)
        names = {}
        available = tables.closure_decompositions()
        if backend is not None:  # what the backend decomposes itself, as it does it
            available.update(backend.decompositions())
        table = {op: fn for op, fn in available.items() if op not in sup_m and not kept(op)}
        table.update(extra)
        table.update(user)
        falls_back = backend is not None and backend.falls_back_to_aten  # (an op without a decomposition runs as it is)
        accepts = lambda op: op in sup_m or kept(op) or ((falls_back or _is_custom(op)) and op not in table)
        label, opset_strict = "supported_ops", True
        description = "decomposed until only the backend's supported ops remain"
        what = {"supported_ops": sorted(_entry_text(e) for e in _entries(supported_ops))}
        if backend is not None:
            label = backend.key
            description = (f"decomposed until only {backend.name}'s own ops remain ({len(backend.supported_ops)} "
                           f"from {backend.source}, {backend.name} {backend.version})")
            if falls_back:
                description += "; an op without a decomposition is taken as it is (the backend runs its ATen kernel)"
            what["backend"] = backend.key
    else:
        p = _presets.load(preset)
        base, names, frozen = _preset_base(p)
        table = {op: fn for op, fn in base.items() if not kept(op)}
        table.update(extra)
        table.update(user)
        opset_m = OpMatcher(p.opset) if p.opset is not None else None
        if opset_m is None:  # none/max: any op the table no longer decomposes
            accepts = lambda op: op not in table or kept(op)
        else:
            accepts = lambda op: op in opset_m or kept(op) or (_is_custom(op) and op not in table)
        # a pinned preset ("core@2.13") guarantees its frozen opset: anything outside is an error
        label, description, opset_strict = p.key, p.description, p.strict or ("@" in preset and p.opset is not None)
        what = {"preset": preset, "frozen": frozen}
    withheld = _withhold_untrusted(table, user) if strict else {}
    if strict:
        label += "+strict"
    what.update(keep=sorted(_entry_text(e) for e in _entries(keep)), decompose=sorted(op_name(op) for op in extra),
                strict=opset_strict, trusted_only=strict,
                table=sorted(names.get(op) or op_name(op) for op in table), withheld=sorted(withheld))
    fingerprint = None if user else json.dumps(what, sort_keys=True)
    return LoweringPlan(table, accepts, label, description, opset_strict, keep_m, sup_m, fingerprint, withheld,
                        unknown)


@functools.cache
def _preset_base(p: _presets.Preset) -> tuple[dict, dict, str]:
    """(op -> decomposition, op -> name, the preset as JSON) for preset ``p``, computed once: torch's
    tables are fixed for the process (tables.py caches them), and a cache hit would otherwise spend
    40% of its time rebuilding this."""
    source_table = tables.torch_default_table() if p.name == "core" else tables.available_decompositions()
    by_name = {op_name(op): op for op in source_table}
    table = {by_name[n]: source_table[by_name[n]] for n in p.decompose if n in by_name}
    return table, {op: n for n, op in by_name.items() if op in table}, p.to_json()


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


def _entries(entries) -> list:
    if entries is None:
        return []
    return [entries] if isinstance(entries, (str, torch._ops.OpOverload, torch._ops.OpOverloadPacket)) else list(entries)


@preserved()
def lower(source_ep, preset: str = "core", *, supported_ops=None, decompositions=None, keep=None,
          decompose=None, source=None, plan: LoweringPlan | None = None, strict: bool = False) -> LoweredProgram:
    plan = plan or plan_lowering(preset, supported_ops=supported_ops, decompositions=decompositions, keep=keep,
                                 decompose=decompose, strict=strict)
    with deferred():  # the programs made on the way generate no code (deferred_codegen.py)
        lowered, reused = lower_program(source_ep, plan.table)  # (lowering/engines/)
    # what the lowering's traces cached is not for the backend's own retrace (another config)
    drop_cached_dispatches(program_fake_mode(lowered.graph_module))
    compiled(lowered)
    result = finish(plan, lowered, source_ep=source_ep, source=source)
    result.reused = reused  # the lowering cache stores its collapsed form
    return result


def finish(plan: LoweringPlan, lowered, *, source_ep, source=None, hit=None) -> LoweredProgram:
    """Verify ``lowered`` against the plan's accepted op set and wrap it; ``source_ep`` may be a
    Lazy (the undecomposed program is then loaded only when explain() or an error needs it).
    ``hit``: a lowering-cache entry opened without its graph (cache.Hit; ``lowered`` is None): what
    fell outside the opset is what the lowering that stored it found for the same request."""
    if hit is not None:
        lowered, bad = hit.program, dict(hit.outside)  # (a Lazy)
    else:
        bad = outside(lowered.graph_module, plan.accepts)
    untrusted = {name: why for name, why in plan.withheld.items() if name in bad}
    if untrusted:
        raise OpsetError(
            f"lowering with {plan.label}: {len(untrusted)} op(s) would need a decomposition that strict=True "
            f"does not apply, and the backend does not support them:\n"
            + "\n".join(f"  {name} ({bad[name]} call sites): {why}" for name, why in untrusted.items())
            + "\nImplement them in the backend (add them to supported_ops), or lower without strict=True "
              "to accept the measured error.")
    if bad and plan.strict:
        source_ep = source_ep.get() if isinstance(source_ep, Lazy) else source_ep
        stop = lambda op: op not in plan.table
        lines = []
        for name, count in bad.items():
            lines.append(f"  {name} ({count} call sites): no decomposition reaches the accepted set")
            lowered_gm = (lowered.get() if isinstance(lowered, Lazy) else lowered).graph_module
            lines += ["      route: " + r for r in route_lines(name, lowered_gm, source_ep.graph_module,
                                                               plan.table, stop)]
        raise OpsetError(
            f"lowering with {plan.label}: {len(bad)} op(s) cannot reach the accepted op set:\n" + "\n".join(lines)
            + "\nAdd them to supported_ops, give a decomposition for them (decompositions={op: fn}), or keep them."
        )
    return LoweredProgram(lowered, source_ep=source_ep, preset=plan.label, table=plan.table, keep=plan.keep,
                          supported=plan.supported, accepts=plan.accepts, outside=bad,
                          description=plan.description, source=source, fingerprint=plan.fingerprint,
                          ops=hit.ops if hit is not None else None, unknown_supported_ops=plan.unknown)
