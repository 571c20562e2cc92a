"""lower(): functionalize + decompose an undecomposed program for one backend, then verify."""

from __future__ import annotations

import torch

from ..errors import LoweringError, OpsetError
from ..functionalize import functionalize
from ..ops import OpMatcher, op_name, resolve_op
from . import presets as _presets
from . import tables
from .decompose import run_decompositions
from .lowered import LoweredProgram
from .verify import outside, route_lines

ATEN_LIKE = {"aten", "prims"}


def _is_custom(op) -> bool:
    return isinstance(op, torch._ops.OpOverload) and op.namespace not in ATEN_LIKE


def _matcher(entries, what: str) -> OpMatcher | None:
    if entries is None:
        return None
    if isinstance(entries, (str, torch._ops.OpOverload, torch._ops.OpOverloadPacket)):
        entries = [entries]
    try:
        m = OpMatcher(entries)
    except TypeError as e:
        raise LoweringError(f"{what}: {e}") from None
    unknown = m.unknown_entries()
    if unknown:
        raise LoweringError(f"{what} names ops this torch does not have: {', '.join(unknown)} "
                            f"(write them as 'aten::add.Tensor', 'aten.add', 'aten.add.*' or 'mylib::*').")
    return m


def _user_table(decompositions) -> dict:
    out = {}
    for key, fn in (decompositions or {}).items():
        op = resolve_op(key) if isinstance(key, str) else key
        if not isinstance(op, torch._ops.OpOverload) or not callable(fn):
            raise LoweringError(f"decompositions must map op overloads to callables; got {key!r}: {fn!r}.")
        out[op] = fn
    return out


def lower(source_ep, preset: str = "core", *, supported_ops=None, decompositions=None, keep=None,
          source=None) -> LoweredProgram:
    keep_m = _matcher(keep, "keep")
    kept = (lambda op: op in keep_m) if keep_m is not None else (lambda op: False)
    user = _user_table(decompositions)
    if supported_ops is not None:
        sup_m = _matcher(supported_ops, "supported_ops")
        available = tables.available_decompositions()
        table = {op: fn for op, fn in available.items() if op not in sup_m and not kept(op)}
        table.update(user)
        accepts = lambda op: op in sup_m or kept(op) or (_is_custom(op) and op not in table)
        label, description, strict = "supported_ops", "decomposed until only the backend's supported ops remain", True
    else:
        p = _presets.load(preset)
        source_table = tables.torch_default_table() if p.name == "core" else tables.available_decompositions()
        by_name = {op_name(op): op for op in source_table}
        table = {by_name[n]: source_table[by_name[n]] for n in p.decompose if n in by_name and not kept(by_name[n])}
        table.update(user)
        opset_m = OpMatcher(p.opset) if p.opset is not None else None
        if opset_m is None:  # none/max: any op the table no longer decomposes
            accepts = lambda op: op not in table or kept(op)
        else:
            accepts = lambda op: op in opset_m or kept(op) or (_is_custom(op) and op not in table)
        # a pinned preset ("core@2.13") guarantees its frozen opset: anything outside is an error
        label, description, strict = p.key, p.description, p.strict or ("@" in preset and p.opset is not None)
    lowered = functionalize(source_ep) if not table else run_decompositions(source_ep, table)
    bad = outside(lowered.graph_module, accepts)
    if bad and strict:
        stop = lambda op: op not in table
        lines = []
        for name, count in bad.items():
            lines.append(f"  {name} ({count} call sites): no decomposition reaches the accepted set")
            lines += ["      route: " + r for r in route_lines(name, lowered.graph_module, source_ep.graph_module, table, stop)]
        raise OpsetError(
            f"lowering with {label}: {len(bad)} op(s) cannot reach the accepted op set:\n" + "\n".join(lines)
            + "\nAdd them to supported_ops, give a decomposition for them (decompositions={op: fn}), or keep them."
        )
    return LoweredProgram(lowered, source_ep=source_ep, preset=label, table=table, keep=keep_m,
                          supported=sup_m if supported_ops is not None else None, accepts=accepts,
                          outside=bad, description=description, source=source)
