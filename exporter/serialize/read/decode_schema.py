"""Decode pt2b.fbs tables of a VERIFIED program buffer into torch's export-schema dataclasses: the
reader's one path from bytes to a schema tree. It trusts offsets: run buffer_bounds.check_buffer
first. How and why: docs/format.md#the-mapping-and-the-codec."""

from __future__ import annotations

import functools
import struct


from ..._torch.serde import Union as _Union
from ..._torch.serde import make_union
from ...layout import fbs
from ...layout.fbs import SCALARS
from ..mapping import schema_map

_U32 = struct.Struct("<I").unpack_from
_I32 = struct.Struct("<i").unpack_from
_U16 = struct.Struct("<H").unpack_from
_FMT = {name: fmt[1] for name, (fmt, _) in SCALARS.items()}
_STR = schema_map.STR


@functools.cache
def _plan(cls):
    """(union tag reader or None, {tag: field index}, fields) of a schema dataclass; a field is
    (name, vtable entry, wire kind, vector element kind, wire type, scalar unpacker, wire default,
    descriptor, has a dataclass default, the descriptor without "opt")."""
    layout = fbs.layout().tables[cls.__name__]
    wire = {f.name: f for f in layout}
    defaults = dict(zip((f.name for f in layout), (d for _, d in schema_map.table_defaults(cls.__name__))))
    fields = []
    for name, _, desc, has_default in schema_map.fields(cls):
        f = wire[name]
        scalar = f.type if f.kind == "scalar" else ""
        unpack = struct.Struct("<" + _FMT[scalar]).unpack_from if scalar else None
        fields.append((name, 4 + 2 * f.slot, f.kind, f.elem, f.type, unpack, defaults[name], desc, has_default,
                       schema_map.strip_opt(desc)))
    tag = None
    by_tag = {}
    if issubclass(cls, _Union):
        f = wire["tag"]
        tag = (4 + 2 * f.slot, struct.Struct("<" + _FMT[f.type]).unpack_from)
        index = {fl[0]: i for i, fl in enumerate(fields)}
        by_tag = {value: index[name] for value, name in schema_map.tags(cls)[1].items() if name in index}
    return tag, by_tag, tuple(fields)


def _string_at(buf, p: int) -> bytes:
    return buf[p + 4:p + 4 + _U32(buf, p)[0]]


def _vector(buf, q: int, elem: str, typ: str, desc: tuple, where: str) -> list:
    """The elements of the vector at ``q`` as schema values (desc: the list's element descriptor)."""
    n, start = _U32(buf, q)[0], q + 4
    desc = schema_map.strip_opt(desc)
    if elem == "scalar":
        values = struct.unpack_from(f"<{n}{_FMT[typ]}", buf, start)
        if desc[0] == "int":
            return list(values)
        return [schema_map.dec_leaf(desc, v, where) for v in values]
    offsets = [e + _U32(buf, e)[0] for e in range(start, start + 4 * n, 4)]
    if elem == "string":
        return [schema_map.dec_leaf(desc, _string_at(buf, p), where) for p in offsets]
    return [read(buf, p, desc[1], where) for p in offsets]


def _field(buf, pos: int, vt: int, vt_len: int, field, where: str):
    """The field's value (None when absent and without a wire default)."""
    _, entry, kind, elem, typ, unpack, default, _, _, desc = field
    off = _U16(buf, vt + entry)[0] if entry < vt_len else 0
    if off == 0:
        if kind != "scalar" or default is None:
            return None
        return schema_map.dec_leaf(desc, default, where)
    p = pos + off
    if kind == "scalar":
        return schema_map.dec_leaf(desc, unpack(buf, p)[0], where)
    q = p + _U32(buf, p)[0]
    if kind == "string":
        return schema_map.dec_leaf(desc, _string_at(buf, q), where)
    if kind == "table":
        return read(buf, q, desc[1], where)
    dk = desc[0]
    if dk == "list":
        return _vector(buf, q, elem, typ, desc[1], where)
    if dk == "listlist":  # [XList { items }]
        (items,) = fbs.layout().tables[desc[2]]
        out = []
        for t in _table_offsets(buf, q):
            at = _field_at(buf, t, 0)
            out.append([] if at is None else _vector(buf, _deref(buf, at), items.elem, items.type, desc[1], where))
        return out
    if dk == "dict":  # [XEntry { key, value }]
        value_desc = schema_map.strip_opt(desc[1])
        value_f = fbs.layout().tables[desc[2]][1]
        out = {}
        for t in _table_offsets(buf, q):
            at = _field_at(buf, t, 0)
            key = None if at is None else schema_map.dec_leaf(_STR, _string_at(buf, _deref(buf, at)), where)
            at = _field_at(buf, t, 1)
            if value_f.kind == "scalar":  # absent: the wire default, 0
                raw = 0 if at is None else struct.unpack_from("<" + _FMT[value_f.type], buf, at)[0]
                value = schema_map.dec_leaf(value_desc, raw, where)
            elif at is None:
                value = None
            elif value_f.kind == "string":
                value = schema_map.dec_leaf(value_desc, _string_at(buf, _deref(buf, at)), where)
            else:
                value = read(buf, _deref(buf, at), value_desc[1], where)
            out[key] = value
        return out
    raise AssertionError(dk)


def _table_offsets(buf, q: int) -> list[int]:
    n, start = _U32(buf, q)[0], q + 4
    return [e + _U32(buf, e)[0] for e in range(start, start + 4 * n, 4)]


def _field_at(buf, t: int, slot: int):
    """Where field ``slot`` of the helper table at ``t`` sits, or None when it is absent."""
    vt = t - _I32(buf, t)[0]
    entry = 4 + 2 * slot
    off = _U16(buf, vt + entry)[0] if entry < _U16(buf, vt)[0] else 0
    return t + off if off else None


def _deref(buf, at: int) -> int:
    return at + _U32(buf, at)[0]


def read(buf, pos: int, cls, where: str = "program"):
    """The schema dataclass ``cls`` stored as the table at ``pos`` of a verified buffer."""
    tag, by_tag, fields = _plan(cls)
    vt = pos - _I32(buf, pos)[0]
    vt_len = _U16(buf, vt)[0]
    if tag is not None:
        entry, unpack = tag
        off = _U16(buf, vt + entry)[0] if entry < vt_len else 0
        value = unpack(buf, pos + off)[0] if off else 0
        i = by_tag.get(value)
        if i is None:
            raise schema_map.unknown_tag(cls, value, where)
        field = fields[i]
        v = _field(buf, pos, vt, vt_len, field, where)
        if v is None:
            v = schema_map.required(cls, field[0], field[7], where)
        return make_union(cls, field[0], v)
    kwargs = {}
    for field in fields:
        v = _field(buf, pos, vt, vt_len, field, where)
        if v is None:
            if field[7][0] == "opt":
                kwargs[field[0]] = None
                continue
            if field[8]:
                continue
            v = schema_map.required(cls, field[0], field[7], where)
        kwargs[field[0]] = v
    return cls(**kwargs)
