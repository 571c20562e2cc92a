"""``export_model(..., target_torch="2.11")``: write an artifact that another torch release reads as its
own, by reconciling the program with the target's stored operator registry (registries.py) under the
rules of schema_drift.reconcile; what the target cannot express is refused before anything is written.
How: docs/releases.md#op-schemas-across-releases-both-ways."""

from __future__ import annotations


from .._torch.serde import schema as S
from ..errors import MissingOperatorError, TargetTorchError
from ..graph_walk import iter_serialized_graphs
from ..layout.generated import pt2b_generated as G
from . import registries, schema_drift


def registry_for(target: str):
    try:
        return registries.load(target)
    except ValueError as e:
        raise TargetTorchError(f"target_torch={target!r}: {e}.") from None


def _dtypes(serialized: S.ExportedProgram) -> dict[str, list[str]]:
    """dtype name -> the program's values of that dtype."""
    out: dict = {}
    for graph in iter_serialized_graphs(serialized.graph_module.graph):
        for name, meta in graph.tensor_values.items():
            out.setdefault(meta.dtype.name, []).append(name)
    return out


def retarget(serialized: S.ExportedProgram, records: list, target: str) -> tuple[S.ExportedProgram, list, list[str]]:
    """(program, op records, notes "<op>: <what was done>") for torch ``target``; ``records`` are the
    writer's OperatorRecordT. Nodes are rewritten in place. TargetTorchError lists everything the
    target cannot read."""
    reg = registry_for(target)
    side = schema_drift.Side(reg)
    where = f"target_torch={target!r}"
    dtypes = _dtypes(serialized)
    lacking = sorted(set(dtypes) - reg.scalar_types)
    if lacking:
        used = "; ".join(f"{d}: {', '.join(dtypes[d][:5])}{' ...' if len(dtypes[d]) > 5 else ''}" for d in lacking)
        raise TargetTorchError(f"{where}: torch {reg.torch_version}'s export schema has no dtype "
                               f"{', '.join(lacking)}, which the program's values use ({used}). Change the "
                               f"model so that they have another dtype, or target a later release.")
    checked = [r for r in records if r.kind == G.OperatorKind.ATEN and r.qualifiedName.startswith(registries.NAMESPACES)]
    tuples = [(r.qualifiedName, r.overload, r.schema, r.kind) for r in checked]
    try:
        serialized, notes, plans = schema_drift.reconcile(serialized, tuples, where, side)
    except MissingOperatorError as e:  # SchemaDriftError too
        body = str(e).split("\n", 1)[1] if "\n" in str(e) else str(e)
        raise TargetTorchError(
            f"{where}: the program cannot be written for torch {reg.torch_version}: it calls what that "
            f"release does not have:\n{body}\nTarget a later release, or change the model so that it "
            f"does not call them.") from None
    by_key: dict = {}
    for r in records:
        key = (r.qualifiedName, r.overload, r.kind)
        if r.kind == G.OperatorKind.ATEN and r.qualifiedName.startswith(registries.NAMESPACES):
            plan = plans.get(schema_drift.op_target(r.qualifiedName, r.overload))
            if plan is not None:
                key = (plan.final_schema.name, plan.final_schema.overload_name or "default", r.kind)
            r.qualifiedName, r.overload = key[0], key[1]
            r.schema = reg.schema(key[0], key[1])
        if key in by_key:
            by_key[key].count += r.count  # two ops rewritten to one
        else:
            by_key[key] = r
    out = sorted(by_key.values(), key=lambda r: (r.qualifiedName, r.overload, r.schema, r.kind))
    return serialized, out, notes
