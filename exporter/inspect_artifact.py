"""A readable summary of a .pt2b artifact, made from its program table alone (no rebuild,
so it works even when custom ops are not registered)."""

from __future__ import annotations

import collections

from .serialize import reader
from .serialize.dtypes import enum_to_dtype
from .serialize.weights import KIND_NAMES
from .versioning.formats import version_str


def _argument_name(arg) -> str:
    value = arg.value
    return getattr(value, "name", None) or repr(value)


def summarize(path) -> str:
    art = reader.open_artifact(path)
    prog = art.program
    ep = reader.decode_graph(art)
    lines = [
        f"file:            {art.path}",
        f"format version:  {version_str(art.version)}",
        f"producer:        {reader.text(prog.producer)}",
        f"torch version:   {reader.text(prog.torchVersion)}",
        f"IR level:        {reader.text(prog.irLevel)}",
    ]
    ops = reader.operator_records(art)
    lines.append(f"operators ({len(ops)}):")
    for (qname, overload, schema, _), rec in zip(ops, prog.operators or []):
        label = f"{qname}.{overload}" if overload else qname
        lines.append(f"  {int(rec.count):5d}  {label}")
        if schema:
            lines.append(f"         {schema}")
    sig = ep.graph_module.signature
    lines.append("signature inputs:")
    for spec in sig.input_specs:
        v = spec.value
        target = (getattr(v, "parameter_name", None) or getattr(v, "buffer_name", None)
                  or getattr(v, "tensor_constant_name", None) or getattr(v, "name", None) or "")
        arg = getattr(v, "arg", None)
        name = _argument_name(arg) if hasattr(arg, "value") else getattr(arg, "name", "")
        lines.append(f"  {spec.type:16s} {name}" + (f" -> {target}" if target else ""))
    lines.append("signature outputs:")
    for spec in sig.output_specs:
        v = spec.value
        arg = v.arg
        name = _argument_name(arg) if hasattr(arg, "value") else getattr(arg, "name", "")
        target = getattr(v, "buffer_name", None) or getattr(v, "user_input_name", None) or ""
        lines.append(f"  {spec.type:16s} {name}" + (f" -> {target}" if target else ""))
    lines.append("symbols and ranges:")
    for sym, rc in ep.range_constraints.items():
        lo = "-inf" if rc.min_val is None else rc.min_val
        hi = "inf" if rc.max_val is None else rc.max_val
        lines.append(f"  {sym}: [{lo}, {hi}]")
    if not ep.range_constraints:
        lines.append("  (none: all shapes static)")
    lines.append("tensors:")
    by_kind = collections.Counter()
    for rec in prog.tensors or []:
        dtype = enum_to_dtype(rec.dtype, art.path)
        sizes = [int(s) for s in (rec.sizes if rec.sizes is not None else [])]
        kind = KIND_NAMES.get(rec.kind, "?")
        by_kind[kind] += 1
        lines.append(f"  {kind:10s} {reader.text(rec.name)}: {str(dtype).removeprefix('torch.')}{sizes}")
    total = sum(int(s.nbytes) for s in prog.segments or [])
    lines.append(f"weight data: {total} bytes in {len(prog.segments or [])} segments "
                 f"({', '.join(f'{n} {k}s' for k, n in sorted(by_kind.items()))})")
    meta = reader.read_metadata(art)
    lines.append(f"metadata: {meta if meta else '(none)'}")
    prov = {reader.text(e.key): reader.text(e.value) for e in prog.provenance or []}
    if prov:
        lines.append(f"provenance: {prov}")
    low = reader.read_lowering(art)
    if low:
        outside = ", ".join(f"{k} x{v}" for k, v in low["outside_opset"].items()) or "none"
        lines.append(f"lowered for:     {low['request']} by torch {low['torch_version']} "
                     f"(request {low['fingerprint'][:12] or 'custom'}; outside the declared opset: {outside})")
    else:
        lines.append("lowered for:     (not lowered by pt2b)")
    return "\n".join(lines)
