"""Read the graph part of a VERIFIED program buffer straight into torch's export-schema dataclasses:
what ``program_codec.decode(cls, fast_unpack.unpack(...))`` returns, in one pass instead of two
(no object-API tree in between; a fifth of a load of the 6x512 encoder).

Each schema dataclass gets a plan once: for every field its vtable entry, wire kind and type (from
fbs_layout) and how the value maps back (program_codec's descriptors). The mapping rules are
program_codec's: invalid UTF-8 or enum values and missing required tables are CorruptArtifactError,
absent lists/dicts/strings become empty, fields with a dataclass default keep it.
tests/test_roundtrip_zoo.py and tests/test_golden.py compare both paths on every artifact they have.
"""

from __future__ import annotations

import functools
import struct

from torch._export.serde.union import _Union

from ..errors import CorruptArtifactError
from . import fbs_layout, program_codec
from .fbs_layout import SCALARS
from .generated import pt2b_generated as G

_U32 = struct.Struct("<I").unpack_from
_I32 = struct.Struct("<i").unpack_from
_U16 = struct.Struct("<H").unpack_from
_FMT = {name: fmt[1] for name, (fmt, _) in SCALARS.items()}
_STR = ("str",)


@functools.cache
def _plan(cls):
    """(union tag reader or None, {tag: field index}, fields) of a schema dataclass; a field is
    (name, vtable entry, wire kind, vector element kind, wire type, scalar unpacker, wire default,
    descriptor, has a dataclass default, the descriptor without "opt")."""
    layout = fbs_layout.layout().tables[cls.__name__]
    wire = {f.name: f for f in layout}
    defaults = dict(zip((f.name for f in layout), getattr(G, cls.__name__ + "T")().__dict__.values()))
    fields = []
    for name, _, desc, has_default in program_codec._fields(cls):
        f = wire[name]
        scalar = f.type if f.kind == "scalar" else ""
        unpack = struct.Struct("<" + _FMT[scalar]).unpack_from if scalar else None
        fields.append((name, 4 + 2 * f.slot, f.kind, f.elem, f.type, unpack, defaults[name], desc, has_default,
                       program_codec.strip_opt(desc)))
    tag = None
    by_tag = {}
    if issubclass(cls, _Union):
        f = wire["tag"]
        tag = (4 + 2 * f.slot, struct.Struct("<" + _FMT[f.type]).unpack_from)
        index = {fl[0]: i for i, fl in enumerate(fields)}
        by_tag = {value: index[name] for value, name in program_codec._tags(cls)[1].items()}
    return tag, by_tag, tuple(fields)


def _string_at(buf, p: int) -> bytes:
    return buf[p + 4:p + 4 + _U32(buf, p)[0]]


def _vector(buf, q: int, elem: str, typ: str, desc: tuple, where: str) -> list:
    """The elements of the vector at ``q`` as program_codec would decode them (desc: the list's
    element descriptor, or for listlist/dict fields the field's whole descriptor)."""
    n, start = _U32(buf, q)[0], q + 4
    if elem == "scalar":
        desc = program_codec.strip_opt(desc)
        values = struct.unpack_from(f"<{n}{_FMT[typ]}", buf, start)
        if desc[0] == "int":
            return list(values)
        return [program_codec.dec_leaf(desc, v, where) for v in values]
    offsets = [e + _U32(buf, e)[0] for e in range(start, start + 4 * n, 4)]
    if elem == "string":
        return [program_codec.dec_leaf(program_codec.strip_opt(desc), _string_at(buf, p), where) for p in offsets]
    desc = program_codec.strip_opt(desc)
    return [read(buf, p, desc[1], where) for p in offsets]


def _field(buf, pos: int, vt: int, vt_len: int, field, where: str):
    """The field's value as program_codec's _dec gives it (None when absent and None-valued)."""
    _, entry, kind, elem, typ, unpack, default, _, _, desc = field
    off = _U16(buf, vt + entry)[0] if entry < vt_len else 0
    if off == 0:
        if kind != "scalar" or default is None:
            return None
        return program_codec.dec_leaf(desc, default, where)
    p = pos + off
    if kind == "scalar":
        return program_codec.dec_leaf(desc, unpack(buf, p)[0], where)
    q = p + _U32(buf, p)[0]
    if kind == "string":
        return program_codec.dec_leaf(desc, _string_at(buf, q), where)
    if kind == "table":
        return read(buf, q, desc[1], where)
    dk = desc[0]
    if dk == "list":
        return _vector(buf, q, elem, typ, desc[1], where)
    if dk == "listlist":  # [XList { items }]
        (items,) = fbs_layout.layout().tables[typ]
        out = []
        for t in _table_offsets(buf, q):
            at = _field_at(buf, t, 0)
            out.append([] if at is None else _vector(buf, _deref(buf, at), items.elem, items.type, desc[1], where))
        return out
    if dk == "dict":  # [XEntry { key, value }]
        value_desc = program_codec.strip_opt(desc[1])
        value_f = fbs_layout.layout().tables[typ][1]
        out = {}
        for t in _table_offsets(buf, q):
            at = _field_at(buf, t, 0)
            key = None if at is None else program_codec.dec_leaf(_STR, _string_at(buf, _deref(buf, at)), where)
            at = _field_at(buf, t, 1)
            if value_f.kind == "scalar":  # absent: the wire default, 0
                raw = 0 if at is None else struct.unpack_from("<" + _FMT[value_f.type], buf, at)[0]
                value = program_codec.dec_leaf(value_desc, raw, where)
            elif at is None:
                value = None
            elif value_f.kind == "string":
                value = program_codec.dec_leaf(value_desc, _string_at(buf, _deref(buf, at)), where)
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
            raise CorruptArtifactError(
                f"{where}: {cls.__name__} has unknown tag {value}; the artifact is damaged or "
                f"was written by a newer pt2b.")
        field = fields[i]
        v = _field(buf, pos, vt, vt_len, field, where)
        if v is None:
            v = program_codec._required(cls, field[0], field[7], where)
        return program_codec.make_union(cls, field[0], v)
    kwargs = {}
    for field in fields:
        v = _field(buf, pos, vt, vt_len, field, where)
        if v is None:
            if field[7][0] == "opt":
                kwargs[field[0]] = None
                continue
            if field[8]:
                continue
            v = program_codec._required(cls, field[0], field[7], where)
        kwargs[field[0]] = v
    return cls(**kwargs)
