"""Unpack a VERIFIED program buffer into flatc's object-API classes (G.<Table>T), field for field
what `G.ProgramT.InitFromPackedBuf` builds, about 4x faster.

flatc's Python object API reads every field through flatbuffers' generic Table accessors (several
Python calls per field). Here each table kind gets a plan once (field slot, kind, struct format,
default) from the schema's layout (fbs_layout, the same data the verifier checks with), and a
table is read with direct struct reads. It trusts offsets: run verifier.verify_program first.

The result is made of the generated classes themselves (Pack() works, tests and tools treat it as
the object API's); tests/test_verifier.py compares both on every artifact it has.
"""

from __future__ import annotations

import functools
import struct

import numpy as np

from . import fbs_layout
from .generated import pt2b_generated as G

_U32 = struct.Struct("<I").unpack_from
_I32 = struct.Struct("<i").unpack_from
_U16 = struct.Struct("<H").unpack_from
_NUMPY = {"bool": np.bool_, "byte": np.int8, "ubyte": np.uint8, "int8": np.int8, "uint8": np.uint8,
          "short": np.int16, "ushort": np.uint16, "int16": np.int16, "uint16": np.uint16, "int": np.int32,
          "uint": np.uint32, "int32": np.int32, "uint32": np.uint32, "long": np.int64, "ulong": np.uint64,
          "int64": np.int64, "uint64": np.uint64, "float": np.float32, "double": np.float64,
          "float32": np.float32, "float64": np.float64}


@functools.cache
def _plan(table: str):
    """(class, [(attr, vtable entry offset, kind, type, elem, struct unpacker, default)])."""
    cls = getattr(G, table + "T")
    defaults = cls().__dict__  # flatc assigns the attributes in declaration order, with defaults
    fields = fbs_layout.layout().tables[table]
    if len(defaults) != len(fields):
        raise fbs_layout.SchemaLayoutError(f"{table}T has {len(defaults)} attributes, pt2b.fbs {len(fields)} fields.")
    plan = []
    for (attr, default), f in zip(defaults.items(), fields):
        scalar = f.type if f.kind == "scalar" else (f.type if f.kind == "vector" and f.elem == "scalar" else "")
        unpack = struct.Struct("<" + fbs_layout.SCALARS[scalar][0][1:]).unpack_from if scalar else None
        plan.append((attr, 4 + 2 * f.slot, f.kind, f.type, f.elem, unpack, default))
    return cls, plan


class TableRef:
    """A table left packed (``unpack_program(..., lazy=...)``): where it is in the verified buffer.
    Pack() still works (the table is unpacked then); reader.decode_graph reads it directly."""

    __slots__ = ("buf", "pos", "table")

    def __init__(self, buf, pos: int, table: str):
        self.buf, self.pos, self.table = buf, pos, table

    def unpack(self):
        return _table(self.buf, self.pos, self.table)

    def Pack(self, builder):  # noqa: N802 (flatc's name)
        return self.unpack().Pack(builder)


def _table(buf: bytes, pos: int, table: str, lazy=()):
    cls, plan = _plan(table)
    obj = cls.__new__(cls)
    d = obj.__dict__
    vt = pos - _I32(buf, pos)[0]
    vt_len = _U16(buf, vt)[0]
    for attr, entry, kind, typ, elem, unpack, default in plan:
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
            d[attr] = TableRef(buf, q, typ) if attr in lazy else _table(buf, q, typ)
        else:  # vector
            q = p + _U32(buf, p)[0]
            n, start = _U32(buf, q)[0], q + 4
            if elem == "scalar":
                d[attr] = np.frombuffer(buf, dtype=np.dtype(_NUMPY[typ]).newbyteorder("<"), count=n, offset=start)
            elif elem == "string":
                out = []
                for e in range(start, start + 4 * n, 4):
                    s = e + _U32(buf, e)[0]
                    out.append(buf[s + 4:s + 4 + _U32(buf, s)[0]])
                d[attr] = out
            else:
                d[attr] = [_table(buf, e + _U32(buf, e)[0], typ) for e in range(start, start + 4 * n, 4)]
    return obj


def unpack_program(buf: bytes, lazy=()):
    """The G.ProgramT of a verified program buffer (offset 0 holds the root table's offset); the
    root's table fields named in ``lazy`` (object-API names) are left packed as TableRefs."""
    return _table(buf, _U32(buf, 0)[0], fbs_layout.layout().root, frozenset(lazy))
