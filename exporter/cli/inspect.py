"""`pt2b inspect ART.pt2b`: a readable summary of an artifact (``--json``: the same facts as data), made
from its program table alone (no rebuild, so it works even when custom ops are not registered)."""

from __future__ import annotations

import collections

from ..dims import from_provenance
from ..serialize import reader
from ..serialize.mapping.dtypes import enum_to_dtype
from ..layout.generated import pt2b_generated as G
from ..layout.segments import KIND_NAMES
from ..versioning.formats import version_str
from . import json_out


def run(ns) -> int:
    if json_out.wanted(ns):
        json_out.emit(facts(ns.artifact))
    else:
        print(summarize(ns.artifact))
    return 0


def _argument_name(arg) -> str:
    value = arg.value
    return getattr(value, "name", None) or repr(value)


def facts(path) -> dict:
    """What `pt2b inspect` shows, as data: versions, every method (ops with counts and schemas,
    signature, symbols with ranges, tensors, lowering record), the weights, metadata and provenance."""
    art = reader.open_artifact(path)
    prog = art.program
    names = art.method_names
    prov = reader.read_provenance(art)
    users = collections.defaultdict(set)  # segment -> the methods whose state it holds
    if len(names) > 1:
        for name in names:
            for rec in reader.method(art, name).program.tensors or []:
                if rec.kind != G.TensorKind.EXAMPLE_INPUT:
                    users[int(rec.segment)].add(name)
    order = {name: i for i, name in enumerate(names)}
    ordered = {seg: sorted(u, key=order.__getitem__) for seg, u in users.items()}  # once per segment
    methods = {}
    for name in names:
        m = reader.method(art, name)
        shared = {int(rec.segment): [u for u in ordered[int(rec.segment)] if u != name]
                  for rec in m.program.tensors or [] if name in users.get(int(rec.segment), ())}
        methods[name] = _method_facts(m, shared, from_provenance(prov, name if len(names) > 1 else None))
    by_kind = collections.Counter(KIND_NAMES.get(rec.kind, "?") for name in names
                                  for rec in reader.method(art, name).program.tensors or [])
    return {
        "file": str(art.path),
        "format_version": version_str(art.version),
        "producer": reader.text(prog.producer),
        "torch_version": reader.text(prog.torchVersion),
        "default_method": names[0],
        "methods": methods,
        "weights": {"bytes": sum(int(s.nbytes) for s in prog.segments or []), "segments": len(prog.segments or []),
                    "tensors_by_kind": dict(sorted(by_kind.items()))},
        "metadata": reader.read_metadata(art),
        "provenance": prov,
    }


def _method_facts(art, shared: dict, dim_names: dict | None) -> dict:
    """IR level, op table, signature, symbols (with the user's Dim names), tensors and lowering record
    of one method (``shared``: segment -> the other methods using it)."""
    prog = art.program
    ep = reader.decode_graph(art)
    ops, schemas = {}, {}
    for (qname, overload, schema, _), rec in zip(reader.operator_records(art), prog.operators or []):
        label = f"{qname}.{overload}" if overload else qname
        ops[label] = int(rec.count)
        schemas[label] = schema
    sig = ep.graph_module.signature
    inputs, outputs = [], []
    for spec in sig.input_specs:
        v = spec.value
        target = (getattr(v, "parameter_name", None) or getattr(v, "buffer_name", None)
                  or getattr(v, "tensor_constant_name", None) or getattr(v, "name", None) or "")
        arg = getattr(v, "arg", None)
        name = _argument_name(arg) if hasattr(arg, "value") else getattr(arg, "name", "")
        inputs.append({"kind": spec.type, "name": name, "target": target})
    for spec in sig.output_specs:
        v = spec.value
        arg = v.arg
        name = _argument_name(arg) if hasattr(arg, "value") else getattr(arg, "name", "")
        target = getattr(v, "buffer_name", None) or getattr(v, "user_input_name", None) or ""
        outputs.append({"kind": spec.type, "name": name, "target": target})
    symbols = [{"name": sym, "dim_name": (dim_names or {}).get(sym), "min": rc.min_val, "max": rc.max_val}
               for sym, rc in ep.range_constraints.items()]
    tensors = []
    for rec in prog.tensors or []:
        dtype = enum_to_dtype(rec.dtype, art.path)
        tensors.append({"kind": KIND_NAMES.get(rec.kind, "?"), "name": reader.text(rec.name),
                        "dtype": str(dtype).removeprefix("torch."),
                        "shape": [int(s) for s in (rec.sizes if rec.sizes is not None else [])],
                        "shared_with": shared.get(int(rec.segment), [])})
    return {"ir_level": reader.text(prog.irLevel), "ops": ops, "schemas": schemas,
            "signature": {"inputs": inputs, "outputs": outputs}, "symbols": symbols, "tensors": tensors,
            "tensors_shared": sum(1 for t in tensors if t["shared_with"]), "lowering": reader.read_lowering(art)}


def summarize(path) -> str:
    f = facts(path)
    lines = [
        f"file:            {f['file']}",
        f"format version:  {f['format_version']}",
        f"producer:        {f['producer']}",
        f"torch version:   {f['torch_version']}",
    ]
    methods = f["methods"]
    if len(methods) == 1:
        lines += _method_lines(methods[f["default_method"]])
    else:
        lines.append(f"methods ({len(methods)}): {', '.join(methods)} (default: {f['default_method']})")
        for name, m in methods.items():
            lines.append(f"method {name} ({m['tensors_shared']} tensors shared with other methods):")
            lines += ["  " + line for line in _method_lines(m) + [_lowered_line(m["lowering"])]]
    w = f["weights"]
    lines.append(f"weight data: {w['bytes']} bytes in {w['segments']} segments "
                 f"({', '.join(f'{n} {k}s' for k, n in w['tensors_by_kind'].items())})")
    lines.append(f"metadata: {f['metadata'] if f['metadata'] else '(none)'}")
    if f["provenance"]:
        lines.append(f"provenance: {f['provenance']}")
    if len(methods) == 1:
        lines.append(_lowered_line(methods[f["default_method"]]["lowering"]))
    return "\n".join(lines)


_LISTED = 8  # methods named per shared tensor; the rest are counted


def _others(others: list[str]) -> list[str]:
    """The other methods of a shared tensor: at most _LISTED, then "N more"."""
    rest = len(others) - _LISTED
    return others[:_LISTED] + [f"{rest} more"] if rest > 0 else others


def _method_lines(m: dict) -> list[str]:
    lines = [f"IR level:        {m['ir_level']}", f"operators ({len(m['ops'])}):"]
    for label, count in m["ops"].items():
        lines.append(f"  {count:5d}  {label}")
        if m["schemas"][label]:
            lines.append(f"         {m['schemas'][label]}")
    for side in ("inputs", "outputs"):
        lines.append(f"signature {side}:")
        lines += [f"  {s['kind']:16s} {s['name']}" + (f" -> {s['target']}" if s["target"] else "")
                  for s in m["signature"][side]]
    lines.append("symbols and ranges:")
    for s in m["symbols"]:
        lo = "-inf" if s["min"] is None else s["min"]
        hi = "inf" if s["max"] is None else s["max"]
        lines.append(f"  {s['name']}" + (f" ({s['dim_name']})" if s["dim_name"] is not None else "") + f": [{lo}, {hi}]")
    if not m["symbols"]:
        lines.append("  (none: all shapes static)")
    lines.append("tensors:")
    for t in m["tensors"]:
        others = _others(t["shared_with"])
        lines.append(f"  {t['kind']:10s} {t['name']}: {t['dtype']}{t['shape']}"
                     + (f" (shared with {', '.join(others)})" if others else ""))
    return lines


def _lowered_line(low: dict | None) -> str:
    if not low:
        return "lowered for:     (not lowered by pt2b)"
    outside = ", ".join(f"{k} x{v}" for k, v in low["outside_opset"].items()) or "none"
    return (f"lowered for:     {low['request']} by torch {low['torch_version']} "
            f"(request {low['fingerprint'][:12] or 'custom'}; outside the declared opset: {outside})")
