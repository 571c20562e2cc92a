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
from .builder import Builder

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
    if isinstance(builder, Builder):
        return builder.offsets(offsets)
    builder.StartVector(4, len(offsets), 4)
    for off in reversed(offsets):
        builder.PrependUOffsetTRelative(off)
    return builder.EndVector()


def _maker(f, desc: tuple):
    """make(builder, value) -> the offset of a non-scalar field's value, created in the builder: chosen
    once per field from its wire kind and descriptor."""
    if f.kind == "string":
        return lambda builder, value: builder.CreateString(value)
    if f.kind == "table":  # (through the module's name, each call: a wrapper set on it sees every table)
        return lambda builder, value: pack(builder, value)
    # vectors
    kind = desc[0]
    if f.elem == "scalar":
        encode = _scalar_encoder(schema_map.strip_opt(desc[1]))
        dtype = schema_map.wire_dtype(f.type)
        return lambda builder, value: builder.CreateNumpyVector(np.array([encode(v) for v in value], dtype=dtype))
    if f.elem == "string":
        return lambda builder, value: _vector_of_offsets(builder, [builder.CreateString(v) for v in value])
    if kind == "list":
        return lambda builder, value: _vector_of_offsets(builder, [pack(builder, v) for v in value])
    if kind == "listlist":  # [XList { items }]
        (item_f,) = fbs.layout().tables[desc[2]]
        items = _maker(item_f, ("list", desc[1]))

        def list_table(builder, value) -> int:
            return _table(builder, 1, [(0, None, items(builder, value))])

        return lambda builder, value: _vector_of_offsets(builder, [list_table(builder, v) for v in value])
    if kind == "dict":  # [XEntry { key, value }]
        entry = _entry_packer(desc)
        return lambda builder, value: _vector_of_offsets(builder, [entry(builder, k, v) for k, v in value.items()])
    raise AssertionError((f, kind))


def _entry_packer(desc: tuple):
    """pack(builder, key, value) of one XEntry { key, value } table of a dict[str, X] field (desc: ("dict",
    value, "XEntry"))."""
    value_desc = schema_map.strip_opt(desc[1])
    key_f, value_f = fbs.layout().tables[desc[2]]
    if value_f.kind == "scalar":
        encode, flags = _scalar_encoder(value_desc), _FLAGS[value_f.type]

        def scalar_entry(builder, key: str, value) -> int:
            slots = [(0, None, builder.CreateString(key))]
            if value is not None and (value := encode(value)) != 0:
                slots.append((1, flags, value))
            return _table(builder, 2, slots)

        return scalar_entry
    make = _maker(value_f, value_desc)

    def entry(builder, key: str, value) -> int:
        key_off = builder.CreateString(key)
        if value is None:
            return _table(builder, 2, [(0, None, key_off)])
        value_off = make(builder, value)
        return _table(builder, 2, [(0, None, key_off), (1, None, value_off)])

    return entry


def _scalar_encoder(desc: tuple):
    """encode(value) -> a scalar as it goes on the wire (schema_map.enc_scalar), chosen once per field."""
    plain = {"float": float, "bool": bool}.get(desc[0])  # (ints: enc_scalar's int64 range check)
    return plain or (lambda value: schema_map.enc_scalar(desc, value))


def _table(builder, nfields: int, slots: list) -> int:
    """One table: ``slots`` ((slot, flags, scalar) or (slot, None, offset), defaults left out) prepended
    in order; in one call where the builder is the writer's (builder.Builder.table)."""
    if isinstance(builder, Builder):
        return builder.table(nfields, slots)
    return table_by_calls(builder, nfields, slots)


def table_by_calls(builder, nfields: int, slots: list) -> int:
    """_table through the library Builder's own calls (StartObject, Prepend and Slot, EndObject)."""
    builder.StartObject(nfields)
    for slot, flags, value in slots:
        if flags is None:
            builder.PrependUOffsetTRelativeSlot(slot, value, 0)
        else:
            builder.Prepend(flags, value)
            builder.Slot(slot)
    return builder.EndObject()


@functools.cache
def _packer(cls):
    """pack for one schema dataclass: its fields' encoders and makers chosen once (_plan), then per object
    the children created in field order, the table begun, and its slots written in field order (the
    order flatc's generated Pack writes them in)."""
    nfields, plan = _plan(cls)
    fields = []  # (name, slot, flags or None for a child, encoder or maker, default) in field order
    tag = None
    for f, name, desc, default in plan:
        if name == "<tag>":
            tag = (f.slot, _FLAGS[f.type], default)
        elif name is not None and f.kind == "scalar":
            fields.append((name, f.slot, _FLAGS[f.type], _scalar_encoder(desc), default))
        elif name is not None:
            fields.append((name, f.slot, None, _maker(f, desc), default))
    if issubclass(cls, _Union):
        tag_values = schema_map.tags(cls)[0]
        order = [name for _, name, _, _ in plan]
        # each member with whether the tag's slot comes after it in field order
        members = {field[0]: (field, order.index("<tag>") > order.index(field[0])) for field in fields}

        def pack_union(builder, obj) -> int:
            state = obj.__dict__  # plain reads: _Union's __getattribute__ and tag __eq__ are Python code
            active = str.__str__(state["_type"])
            (name, slot, flags, code, default), tag_after = members[active]
            value = state[active]
            slots = []
            if value is not None:
                if flags is None:
                    slots.append((slot, None, code(builder, value)))
                elif (value := code(value)) != default:
                    slots.append((slot, flags, value))
            if tag_values[active] != tag[2]:
                slots.insert(len(slots) if tag_after else 0, (tag[0], tag[1], tag_values[active]))
            return _table(builder, nfields, slots)

        return pack_union
    children = [(name, code) for name, _, flags, code, _ in fields if flags is None]

    def pack_table(builder, obj) -> int:
        state = obj.__dict__
        offsets = {}
        for name, make in children:
            value = state[name]
            if value is not None:
                offsets[name] = make(builder, value)
        slots = []
        for name, slot, flags, code, default in fields:
            if flags is None:
                off = offsets.get(name)
                if off is not None:
                    slots.append((slot, None, off))
            else:
                value = state[name]
                if value is not None and (value := code(value)) != default:
                    slots.append((slot, flags, value))
        return _table(builder, nfields, slots)

    return pack_table


def pack(builder, obj) -> int:
    """Pack the torch schema dataclass ``obj`` as its table; returns the table's offset."""
    return _packer(type(obj))(builder, obj)


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
