"""`pt2b inspect ART.pt2b`: a readable summary of an artifact, made from its program table alone (no
rebuild, so it works even when custom ops are not registered)."""

from __future__ import annotations

import collections

from ..dims import from_provenance
from ..serialize import reader
from ..serialize.mapping.dtypes import enum_to_dtype
from ..layout.generated import pt2b_generated as G
from ..layout.segments import KIND_NAMES
from ..versioning.formats import version_str


def run(ns) -> int:
    print(summarize(ns.artifact))
    return 0


def _argument_name(arg) -> str:
    value = arg.value
    return getattr(value, "name", None) or repr(value)


def summarize(path) -> str:
    art = reader.open_artifact(path)
    prog = art.program
    lines = [
        f"file:            {art.path}",
        f"format version:  {version_str(art.version)}",
        f"producer:        {reader.text(prog.producer)}",
        f"torch version:   {reader.text(prog.torchVersion)}",
    ]
    names = art.method_names
    prov = reader.read_provenance(art)
    if len(names) == 1:
        lines += _method_lines(art, {}, from_provenance(prov, None))
    else:
        users = collections.defaultdict(set)  # segment -> the methods whose state it holds
        for name in names:
            for rec in reader.method(art, name).program.tensors or []:
                if rec.kind != G.TensorKind.EXAMPLE_INPUT:
                    users[int(rec.segment)].add(name)
        lines.append(f"methods ({len(names)}): {', '.join(names)} (default: {names[0]})")
        order = {name: i for i, name in enumerate(names)}
        ordered = {seg: sorted(u, key=order.__getitem__) for seg, u in users.items()}  # once per segment
        for name in names:
            m = reader.method(art, name)
            shared = {}  # segment -> the other methods using it (at most _LISTED named, then a count)
            for rec in m.program.tensors or []:
                seg = int(rec.segment)
                if seg not in shared and name in users.get(seg, ()):
                    shared[seg] = _others(ordered[seg], name)
            n_shared = sum(1 for rec in m.program.tensors or [] if shared.get(int(rec.segment)))
            lines.append(f"method {name} ({n_shared} tensors shared with other methods):")
            lines += ["  " + line for line in _method_lines(m, shared, from_provenance(prov, name)) + [_lowered_line(m)]]
    by_kind = collections.Counter(KIND_NAMES.get(rec.kind, "?") for name in names
                                  for rec in reader.method(art, name).program.tensors or [])
    total = sum(int(s.nbytes) for s in prog.segments or [])
    lines.append(f"weight data: {total} bytes in {len(prog.segments or [])} segments "
                 f"({', '.join(f'{n} {k}s' for k, n in sorted(by_kind.items()))})")
    meta = reader.read_metadata(art)
    lines.append(f"metadata: {meta if meta else '(none)'}")
    if prov:
        lines.append(f"provenance: {prov}")
    if len(names) == 1:
        lines.append(_lowered_line(art))
    return "\n".join(lines)


_LISTED = 8  # methods named per shared tensor; the rest are counted


def _others(users: list[str], name: str) -> list[str]:
    """The methods in ``users`` (in method order) other than ``name``: at most _LISTED, then "N more"."""
    others = [u for u in users[:_LISTED + 1] if u != name][:_LISTED]
    rest = len(users) - 1 - len(others)
    return others + [f"{rest} more"] if rest > 0 else others


def _method_lines(art, shared: dict, dim_names: dict | None = None) -> list[str]:
    """IR level, op table, signature, symbols (with the user's Dim names) and tensors of one method
    (``shared``: segment -> the other methods using it, marked on its tensors)."""
    prog = art.program
    ep = reader.decode_graph(art)
    lines = [f"IR level:        {reader.text(prog.irLevel)}"]
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
        lines.append(f"  {sym}" + (f" ({dim_names[sym]})" if sym in (dim_names or {}) else "") + f": [{lo}, {hi}]")
    if not ep.range_constraints:
        lines.append("  (none: all shapes static)")
    lines.append("tensors:")
    for rec in prog.tensors or []:
        dtype = enum_to_dtype(rec.dtype, art.path)
        sizes = [int(s) for s in (rec.sizes if rec.sizes is not None else [])]
        kind = KIND_NAMES.get(rec.kind, "?")
        others = shared.get(int(rec.segment))
        lines.append(f"  {kind:10s} {reader.text(rec.name)}: {str(dtype).removeprefix('torch.')}{sizes}"
                     + (f" (shared with {', '.join(others)})" if others else ""))
    return lines


def _lowered_line(art) -> str:
    low = reader.read_lowering(art)
    if not low:
        return "lowered for:     (not lowered by pt2b)"
    outside = ", ".join(f"{k} x{v}" for k, v in low["outside_opset"].items()) or "none"
    return (f"lowered for:     {low['request']} by torch {low['torch_version']} "
            f"(request {low['fingerprint'][:12] or 'custom'}; outside the declared opset: {outside})")
