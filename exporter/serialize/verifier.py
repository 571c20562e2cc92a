"""A FlatBuffers verifier for the program section (the Python runtime has none): every offset,
vtable, length, string, enum value and nesting depth is checked before the object API reads it.

Besides bounds, it bounds the WORK of unpacking: a crafted buffer can point many offsets at one
string or table, so that unpacking materializes far more than the file holds (a vector of 100k
offsets to one 1 MB string unpacks to 100 GB). pt2b's writer never shares objects, so the bytes
of every table, string and vector reached, counted once per reference, must fit in the buffer.
"""

from __future__ import annotations

import struct

from ..errors import CorruptArtifactError
from .fbs_layout import SCALARS, Field, Layout, layout

MAX_DEPTH = 128  # nested tables (each subgraph adds about six: Argument -> GraphArgument -> Graph -> ...)

_U32 = struct.Struct("<I").unpack_from
_I32 = struct.Struct("<i").unpack_from
_U16 = struct.Struct("<H").unpack_from


class _Bad(Exception):
    pass


class _Walk:
    def __init__(self, buf, lay: Layout):
        self.buf, self.n, self.lay = buf, len(buf), lay
        self.budget = len(buf)
        self.enum_fmt = {name: struct.Struct(SCALARS[base][0]).unpack_from for name, (base, _) in lay.enums.items()}

    def spend(self, nbytes: int, what: str) -> None:
        self.budget -= nbytes
        if self.budget < 0:
            raise _Bad(f"{what}: objects are referenced more often than the buffer can hold "
                       f"(shared offsets would make unpacking materialize more than the file holds)")

    def within(self, pos: int, size: int, what: str) -> None:
        if pos < 0 or pos + size > self.n:
            raise _Bad(f"{what} at byte {pos} (+{size}) lies outside the {self.n}-byte buffer")

    def deref(self, at: int, what: str) -> int:
        self.within(at, 4, what)
        target = at + _U32(self.buf, at)[0]
        if target & 3:
            raise _Bad(f"{what} at byte {at} points to misaligned byte {target}")
        return target

    def string(self, pos: int, what: str) -> None:
        self.within(pos, 4, what)
        length = _U32(self.buf, pos)[0]
        self.within(pos + 4, length + 1, f"{what} ({length} bytes)")
        if self.buf[pos + 4 + length] != 0:
            raise _Bad(f"{what} at byte {pos} is not NUL-terminated")
        self.spend(length + 5, what)

    def table(self, pos: int, name: str, depth: int, what: str) -> None:
        if depth > MAX_DEPTH:
            raise _Bad(f"{what}: tables nested deeper than {MAX_DEPTH}")
        buf = self.buf
        path, what = what, (what if what == name else f"{what} ({name})")
        self.within(pos, 4, what)
        vt = pos - _I32(buf, pos)[0]
        if vt & 1:
            raise _Bad(f"{what}: vtable at odd byte {vt}")
        self.within(vt, 4, f"{what} vtable")
        vt_size, tbl_size = _U16(buf, vt)[0], _U16(buf, vt + 2)[0]
        if vt_size < 4 or vt_size & 1:
            raise _Bad(f"{what}: vtable size {vt_size} is invalid")
        self.within(vt, vt_size, f"{what} vtable")
        if tbl_size < 4:
            raise _Bad(f"{what}: table size {tbl_size} is invalid")
        self.within(pos, tbl_size, what)
        self.spend(tbl_size, what)
        for f in self.lay.tables[name]:
            voff = 4 + 2 * f.slot
            if voff >= vt_size:
                break  # written by an older schema: later fields absent
            fo = _U16(buf, vt + voff)[0]
            if fo:
                self.field(pos + fo, f, depth, f"{path}.{f.name}")

    def scalar(self, at: int, f: Field, what: str) -> None:
        size = SCALARS[f.type][1]
        self.within(at, size, what)
        if f.enum:
            value = self.enum_fmt[f.enum](self.buf, at)[0]
            if value not in self.lay.enums[f.enum][1]:
                raise _Bad(f"{what}: {value} is not a value of enum {f.enum}")

    def field(self, at: int, f: Field, depth: int, what: str) -> None:
        if f.kind == "scalar":
            self.scalar(at, f, what)
        elif f.kind == "string":
            self.string(self.deref(at, what), what)
        elif f.kind == "table":
            self.table(self.deref(at, what), f.type, depth + 1, what)
        else:
            vec = self.deref(at, what)
            self.within(vec, 4, what)
            count = _U32(self.buf, vec)[0]
            elem_size = SCALARS[f.type][1] if f.elem == "scalar" else 4
            self.within(vec + 4, count * elem_size, f"{what} ({count} elements)")
            self.spend(4 + count * elem_size, what)
            if f.elem == "scalar":
                if f.enum:
                    for i in range(count):
                        self.scalar(vec + 4 + i * elem_size, f, f"{what}[{i}]")
            elif f.elem == "string":
                for i in range(count):
                    e = vec + 4 + 4 * i
                    self.string(self.deref(e, f"{what}[{i}]"), f"{what}[{i}]")
            else:
                for i in range(count):
                    e = vec + 4 + 4 * i
                    self.table(self.deref(e, f"{what}[{i}]"), f.type, depth + 1, f"{what}[{i}]")


_PLANS: dict[int, tuple[Layout, dict]] = {}


def _plans(lay: Layout) -> dict:
    """table name -> ((vtable entry offset, kind code, size, enum values or None, sub-table name), ...)
    for the fast walk; kinds: 0 scalar, 1 string, 2 table, 3 vector of scalars, 4 of strings, 5 of tables."""
    codes = {("scalar", ""): 0, ("string", ""): 1, ("table", ""): 2,
             ("vector", "scalar"): 3, ("vector", "string"): 4, ("vector", "table"): 5}
    out = {}
    for name, fields in lay.tables.items():
        plan = []
        for f in fields:
            code = codes[(f.kind, f.elem)]
            size = SCALARS[f.type][1] if code in (0, 3) else 4
            enum = None
            if f.enum:
                enum = (struct.Struct(SCALARS[lay.enums[f.enum][0]][0]).unpack_from, lay.enums[f.enum][1])
            plan.append((4 + 2 * f.slot, code, size, enum, f.type if code in (2, 5) else ""))
        out[name] = tuple(plan)
    _PLANS[id(lay)] = (lay, out)  # (the layout is kept alive, so its id stays its own)
    return out


def _fast_ok(buf, lay: Layout) -> bool:
    """The checks of _Walk without building a single message: True when ``buf`` passes all of them.
    (On False the descriptive walk runs to say what is wrong.)"""
    n = len(buf)
    cached = _PLANS.get(id(lay))
    plans = cached[1] if cached is not None and cached[0] is lay else _plans(lay)
    budget = n
    u32, i32, u16 = _U32, _I32, _U16

    def string(p) -> bool:
        nonlocal budget
        if p < 0 or p + 4 > n:
            return False
        length = u32(buf, p)[0]
        if p + 4 + length + 1 > n or buf[p + 4 + length] != 0:
            return False
        budget -= length + 5
        return budget >= 0

    def table(pos, name, depth) -> bool:
        nonlocal budget
        if depth > MAX_DEPTH or pos < 0 or pos + 4 > n:
            return False
        vt = pos - i32(buf, pos)[0]
        if vt & 1 or vt < 0 or vt + 4 > n:
            return False
        vt_size, tbl_size = u16(buf, vt)[0], u16(buf, vt + 2)[0]
        if vt_size < 4 or vt_size & 1 or vt + vt_size > n or tbl_size < 4 or pos + tbl_size > n:
            return False
        budget -= tbl_size
        if budget < 0:
            return False
        for voff, code, size, enum, sub in plans[name]:
            if voff >= vt_size:
                break
            fo = u16(buf, vt + voff)[0]
            if not fo:
                continue
            at = pos + fo
            if code == 0:
                if at + size > n:
                    return False
                if enum is not None and enum[0](buf, at)[0] not in enum[1]:
                    return False
                continue
            if at + 4 > n:
                return False
            target = at + u32(buf, at)[0]
            if target & 3:
                return False
            if code == 1:
                if not string(target):
                    return False
            elif code == 2:
                if not table(target, sub, depth + 1):
                    return False
            else:
                if target + 4 > n:
                    return False
                count = u32(buf, target)[0]
                start = target + 4
                if start + count * size > n:
                    return False
                budget -= 4 + count * size
                if budget < 0:
                    return False
                if code == 3:
                    if enum is not None:
                        fmt, values = enum
                        for e in range(start, start + count * size, size):
                            if fmt(buf, e)[0] not in values:
                                return False
                else:
                    for e in range(start, start + 4 * count, 4):
                        t = e + u32(buf, e)[0]
                        if t & 3:
                            return False
                        if code == 4:
                            if not string(t):
                                return False
                        elif not table(t, sub, depth + 1):
                            return False
        return True

    if n < 8 or (lay.file_identifier and bytes(buf[4:8]) != lay.file_identifier.encode()):
        return False
    root = u32(buf, 0)[0]
    return not root & 3 and table(root, lay.root, 0)


def problem(buf, lay: Layout | None = None) -> str | None:
    """What makes ``buf`` malformed (the descriptive walk), or None when it is well formed."""
    lay = lay or layout()
    walk = _Walk(buf, lay)
    try:
        if len(buf) < 8:
            raise _Bad(f"{len(buf)} bytes cannot hold a root offset and file identifier")
        if lay.file_identifier and bytes(buf[4:8]) != lay.file_identifier.encode():
            raise _Bad(f"file identifier {bytes(buf[4:8])!r} is not {lay.file_identifier!r}")
        walk.table(walk.deref(0, "root offset"), lay.root, 0, lay.root)
    except _Bad as e:
        return str(e)
    return None


def verify_program(buf, where: str, lay: Layout | None = None) -> None:
    """Raise CorruptArtifactError unless ``buf`` is a well-formed buffer of the schema's root table.
    A message-free walk decides (twice as fast); the descriptive walk runs only to explain a failure
    (tests/test_verifier.py checks both walks agree on thousands of damaged buffers)."""
    lay = lay or layout()
    if _fast_ok(buf, lay):
        return
    why = problem(buf, lay)
    if why is not None:
        raise CorruptArtifactError(f"{where}: program section is malformed: {why}.")
