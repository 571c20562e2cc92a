"""Encode torch's export-schema dataclasses as pt2b.fbs tables, straight into a flatbuffers.Builder: the
writer's one path from a schema tree to bytes, the same bytes flatc's object API would write. How and
why: docs/format.md#the-mapping-and-the-codec."""

from __future__ import annotations

import functools

import flatbuffers.number_types as N
import numpy as np

from ..._torch.serde import Union as _Union
from ...layout import fbs
from ..mapping import schema_map

_FLAGS = {"bool": N.BoolFlags, "byte": N.Int8Flags, "int8": N.Int8Flags, "ubyte": N.Uint8Flags,
          "uint8": N.Uint8Flags, "short": N.Int16Flags, "int16": N.Int16Flags, "ushort": N.Uint16Flags,
          "uint16": N.Uint16Flags, "int": N.Int32Flags, "int32": N.Int32Flags, "uint": N.Uint32Flags,
          "uint32": N.Uint32Flags, "long": N.Int64Flags, "int64": N.Int64Flags, "ulong": N.Uint64Flags,
          "uint64": N.Uint64Flags, "float": N.Float32Flags, "float32": N.Float32Flags,
          "double": N.Float64Flags, "float64": N.Float64Flags}


@functools.cache
def _plan(cls):
    """(table field count, [(fbs field, dataclass field name or None, descriptor, default)]) for a
    schema dataclass; the union tag comes first as the pseudo-name "<tag>"."""
    fields = fbs.layout().tables[cls.__name__]
    descs = {name: desc for name, _, desc, _ in schema_map.fields(cls)}
    plan = []
    for f, (_, default) in zip(fields, schema_map.table_defaults(cls.__name__)):
        if f.name == "tag" and issubclass(cls, _Union):
            plan.append((f, "<tag>", None, default))
        elif f.name in descs:
            plan.append((f, f.name, schema_map.strip_opt(descs[f.name]), default))
        else:  # a table field no dataclass field maps to: flatc would write its default, i.e. nothing
            plan.append((f, None, None, default))
    return len(fields), tuple(plan)


def _vector_of_offsets(builder, offsets: list) -> int:
    builder.StartVector(4, len(offsets), 4)
    for off in reversed(offsets):
        builder.PrependUOffsetTRelative(off)
    return builder.EndVector()


def _child(builder, f, desc: tuple, value) -> int:
    """The offset of a non-scalar field's value, created in the builder."""
    if f.kind == "string":
        return builder.CreateString(value)
    if f.kind == "table":
        return pack(builder, value)
    # vectors
    kind = desc[0]
    if f.elem == "scalar":
        elem = schema_map.strip_opt(desc[1])
        items = [schema_map.enc_scalar(elem, v) for v in value]
        return builder.CreateNumpyVector(np.array(items, dtype=schema_map.wire_dtype(f.type)))
    if f.elem == "string":
        return _vector_of_offsets(builder, [builder.CreateString(v) for v in value])
    if kind == "list":
        return _vector_of_offsets(builder, [pack(builder, v) for v in value])
    if kind == "listlist":  # [XList { items }]
        return _vector_of_offsets(builder, [_list_table(builder, desc, items) for items in value])
    if kind == "dict":  # [XEntry { key, value }]
        return _vector_of_offsets(builder, [_entry(builder, desc, k, v) for k, v in value.items()])
    raise AssertionError((f, kind))


def _list_table(builder, desc: tuple, items) -> int:
    """One XList { items } table of a list[list[X]] field (desc: ("listlist", elem, "XList"))."""
    (f,) = fbs.layout().tables[desc[2]]
    off = _child(builder, f, ("list", desc[1]), items)
    builder.StartObject(1)
    builder.PrependUOffsetTRelativeSlot(0, off, 0)
    return builder.EndObject()


def _entry(builder, desc: tuple, key: str, value) -> int:
    """One XEntry { key, value } table of a dict[str, X] field (desc: ("dict", value, "XEntry"))."""
    value_desc = schema_map.strip_opt(desc[1])
    key_f, value_f = fbs.layout().tables[desc[2]]
    key_off = builder.CreateString(key)
    value_off = None if value is None or value_f.kind == "scalar" else _child(builder, value_f, value_desc, value)
    builder.StartObject(2)
    builder.PrependUOffsetTRelativeSlot(0, key_off, 0)
    if value_f.kind == "scalar":
        if value is not None:
            _prepend_slot(builder, value_f, 1, schema_map.enc_scalar(value_desc, value), 0)
    elif value_off is not None:
        builder.PrependUOffsetTRelativeSlot(1, value_off, 0)
    return builder.EndObject()


def _prepend_slot(builder, f, slot: int, value, default) -> None:
    if value != default:
        builder.Prepend(_FLAGS[f.type], value)
        builder.Slot(slot)


def pack(builder, obj) -> int:
    """Pack the torch schema dataclass ``obj`` as its table; returns the table's offset."""
    cls = type(obj)
    nfields, plan = _plan(cls)
    state = obj.__dict__  # plain reads: _Union's __getattribute__ and tag __eq__ are Python code
    union = isinstance(obj, _Union)
    if union:
        active = str.__str__(state["_type"])
        tag = schema_map.tags(cls)[0][active]
    values = []
    for f, name, desc, default in plan:
        if name is None:
            values.append(None)
            continue
        if name == "<tag>":
            values.append(tag)
            continue
        value = (state[active] if name == active else None) if union else state[name]
        if value is None:
            values.append(None)
        elif f.kind == "scalar":
            values.append(schema_map.enc_scalar(desc, value))
        else:
            values.append(_child(builder, f, desc, value))
    builder.StartObject(nfields)
    for (f, name, desc, default), value in zip(plan, values):
        if value is None:
            continue
        if f.kind == "scalar":
            _prepend_slot(builder, f, f.slot, value, default)
        else:
            builder.PrependUOffsetTRelativeSlot(f.slot, value, 0)
    return builder.EndObject()


class Packed:
    """Stands in an object-API tree for ``obj`` (a schema dataclass): its Pack writes the table
    through ``pack``. Lets flatc's generated ProgramT.Pack embed the graph table in place
    (``program.exportedProgram = Packed(serialized)``)."""

    def __init__(self, obj):
        self.obj = obj
        self._packed: tuple[object, int] | None = None  # (builder, offset) of pack_early

    def pack_early(self, builder) -> None:
        """Write the table into ``builder`` now (between two of its objects, nothing begun); the
        generated Pack then takes its offset: the writer packs the graph while the weights are still
        being written."""
        self._packed = (builder, pack(builder, self.obj))

    def Pack(self, builder) -> int:  # noqa: N802 (flatc's name)
        if self._packed is not None and self._packed[0] is builder:
            return self._packed[1]
        return pack(builder, self.obj)
