"""Unpack pt2b's own tables of a VERIFIED program buffer (tensor records, segments, op table, metadata,
provenance) into flatc's object-API classes (G.<Table>T), several times faster than InitFromPackedBuf; the
graph is left packed as a TableRef for decode_schema. It trusts offsets: run buffer_bounds.check_buffer
first. How: docs/format.md#the-mapping-and-the-codec."""

from __future__ import annotations

import functools
import struct

import flatbuffers
import numpy as np

from ...layout.generated import pt2b_generated as G
from ...layout import fbs
from ..mapping import schema_map

_U32 = struct.Struct("<I").unpack_from
_I32 = struct.Struct("<i").unpack_from
_U16 = struct.Struct("<H").unpack_from


@functools.cache
def _plan(table: str):
    """(class, [(attr, vtable entry offset, kind, type, elem, struct unpacker, numpy dtype, default)])."""
    cls = getattr(G, table + "T")
    plan = []
    for (attr, default), f in zip(schema_map.table_defaults(table), fbs.layout().tables[table]):
        scalar = f.type if f.kind == "scalar" else (f.type if f.kind == "vector" and f.elem == "scalar" else "")
        unpack = struct.Struct(fbs.SCALARS[scalar][0]).unpack_from if scalar else None
        dtype = schema_map.wire_dtype(scalar) if f.kind == "vector" and scalar else None
        plan.append((attr, 4 + 2 * f.slot, f.kind, f.type, f.elem, unpack, dtype, default))
    return cls, plan


class TableRef:
    """A table left packed (``unpack_program(..., lazy=...)``): where it is in the buffer.
    Pack() still works (the table is unpacked then); reader.decode_graph reads it directly.

    ``pending``: the verifier's walk of this table when the program's verification skipped it
    (reader.open_artifact leaves the graph to its first read); ``verified()`` runs it once, and every
    read here does so first."""

    __slots__ = ("buf", "pos", "table", "pending")

    def __init__(self, buf, pos: int, table: str, pending=None):
        self.buf, self.pos, self.table, self.pending = buf, pos, table, pending

    def verified(self) -> "TableRef":
        if self.pending is not None:
            self.pending()  # raises CorruptArtifactError, and then stays pending
            self.pending = None
        return self

    def unpack(self):
        self.verified()
        return _table(self.buf, self.pos, self.table)

    def Pack(self, builder):  # noqa: N802 (flatc's name)
        return self.unpack().Pack(builder)


def packed(obj, table: str) -> TableRef:
    """A TableRef to ``obj`` (anything with flatc's Pack: an object-API tree, a TableRef,
    encode_schema.Packed) packed on its own: for a table built in memory, which is trusted."""
    if isinstance(obj, TableRef):
        return obj
    builder = flatbuffers.Builder(1 << 12)
    builder.Finish(obj.Pack(builder))
    buf = bytes(builder.Output())
    return TableRef(buf, _U32(buf, 0)[0], table)


def _table(buf: bytes, pos: int, table: str, lazy=()):
    cls, plan = _plan(table)
    obj = cls.__new__(cls)
    d = obj.__dict__
    vt = pos - _I32(buf, pos)[0]
    vt_len = _U16(buf, vt)[0]
    for attr, entry, kind, typ, elem, unpack, dtype, default in plan:
        off = _U16(buf, vt + entry)[0] if entry < vt_len else 0
        if off == 0:
            d[attr] = default
            continue
        p = pos + off
        if kind == "scalar":
            v = unpack(buf, p)[0]
            d[attr] = bool(v) if typ == "bool" else v
        elif kind == "string":
            q = p + _U32(buf, p)[0]
            d[attr] = buf[q + 4:q + 4 + _U32(buf, q)[0]]
        elif kind == "table":
            q = p + _U32(buf, p)[0]
            d[attr] = TableRef(buf, q, typ) if attr in lazy else _table(buf, q, typ, lazy)
        else:  # vector
            q = p + _U32(buf, p)[0]
            n, start = _U32(buf, q)[0], q + 4
            if elem == "scalar":
                d[attr] = np.frombuffer(buf, dtype=dtype, count=n, offset=start)
            elif elem == "string":
                out = []
                for e in range(start, start + 4 * n, 4):
                    s = e + _U32(buf, e)[0]
                    out.append(buf[s + 4:s + 4 + _U32(buf, s)[0]])
                d[attr] = out
            else:
                d[attr] = [_table(buf, e + _U32(buf, e)[0], typ, lazy) for e in range(start, start + 4 * n, 4)]
    return obj


def unpack_program(buf: bytes, lazy=()):
    """The G.ProgramT of a verified program buffer (offset 0 holds the root table's offset); table
    fields named in ``lazy`` (object-API names: the root's and every Method's) are left packed as
    TableRefs."""
    return _table(buf, _U32(buf, 0)[0], fbs.layout().root, frozenset(lazy))
