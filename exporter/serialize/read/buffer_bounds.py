"""The buffer-bounds check of the program section (a FlatBuffers verifier): every offset, vtable, length,
string, enum value and nesting depth is checked, and the work of unpacking bounded, before anything
reads the buffer. The second step of a read, after layout/container.py's header. Why and how:
docs/untrusted.md#the-checks-in-order."""

from __future__ import annotations

import struct

from ...errors import CorruptArtifactError
from ...layout.fbs import SCALARS, Layout, layout

MAX_DEPTH = 128  # nested tables (each subgraph adds about six: Argument -> GraphArgument -> Graph -> ...)

_U32 = struct.Struct("<I").unpack_from
_I32 = struct.Struct("<i").unpack_from
_U16 = struct.Struct("<H").unpack_from

_SHARED = (": objects are referenced more often than the buffer can hold "
           "(shared offsets would make unpacking materialize more than the file holds)")


class _Refusal(Exception):
    """A failed check: ``tail`` says what is wrong where it failed; the frames the refusal leaves
    add the place's parts (".field", "[index]", the root table's name), innermost first."""

    def __init__(self, tail: str):
        super().__init__(tail)
        self.tail = tail
        self.parts: list[str] = []

    def message(self) -> str:
        return "".join(reversed(self.parts)) + self.tail


def _outside(pos: int, size: int, n: int) -> str:
    return f" at byte {pos} (+{size}) lies outside the {n}-byte buffer"


def _of(name: str, depth: int) -> str:
    """How a refusal about a table itself names its type (the root table's place is its name)."""
    return f" ({name})" if depth else ""


_PLANS: dict[int, tuple[Layout, dict]] = {}
_CODES = {("scalar", ""): 0, ("string", ""): 1, ("table", ""): 2,
          ("vector", "scalar"): 3, ("vector", "string"): 4, ("vector", "table"): 5}


def _plans(lay: Layout) -> dict:
    """table name -> ((vtable entry offset, kind code, size, enum or None, sub-table name, ".field"),
    ...); kinds: 0 scalar, 1 string, 2 table, 3 vector of scalars, 4 of strings, 5 of tables; an
    enum is (unpacker, values, enum name)."""
    cached = _PLANS.get(id(lay))
    if cached is not None and cached[0] is lay:
        return cached[1]
    out = {}
    for name, fields in lay.tables.items():
        plan = []
        for f in fields:
            code = _CODES[(f.kind, f.elem)]
            size = SCALARS[f.type][1] if code in (0, 3) else 4
            enum = None
            if f.enum:
                enum = (struct.Struct(SCALARS[lay.enums[f.enum][0]][0]).unpack_from, lay.enums[f.enum][1], f.enum)
            plan.append((4 + 2 * f.slot, code, size, enum, f.type if code in (2, 5) else "", "." + f.name))
        out[name] = tuple(plan)
    _PLANS[id(lay)] = (lay, out)  # (the layout is kept alive, so its id stays its own)
    return out


# budget units (bytes of tables, strings and vectors, once per reference) every walk of this process
# has spent: a count that lets tests bound the verifier's work without a clock
SPENT = 0


class Budget:
    """The work left to one buffer's walks: its size in bytes at first. check_buffer's walk and every
    later check_table walk of a table it skipped (each method's graph) draw from the same Budget, so
    tables that several methods reference are counted once per reference and the whole of a file's
    checking, however its tables are shared, reads at most the file's size."""

    __slots__ = ("left",)

    def __init__(self, left: int):
        self.left = left


def _walk(buf, lay: Layout, start: int | None = None, name: str = "", skip=frozenset(), depth0: int = 0,
          shared: Budget | None = None) -> dict:
    """Check the root table (or the ``name`` table at ``start``, ``depth0`` levels below the root)
    and everything it reaches; raises _Refusal (place: below the table). Fields of the first table
    named in ``skip`` (".field") are checked as offsets only and not entered: returns {".field":
    the position of the root's table} for the caller to check with another walk when it is first
    read; a Method's table of that field is skipped alike, for the reader to check the same way."""
    global SPENT
    n = len(buf)
    plans = _plans(lay)
    budget = initial = n if shared is None else shared.left
    skipped: dict[str, int] = {}
    u32, i32, u16 = _U32, _I32, _U16

    def string(p) -> None:  # p >= 0: an offset plus an unsigned one
        nonlocal budget
        if p + 4 > n:
            raise _Refusal(_outside(p, 4, n))
        length = u32(buf, p)[0]
        end = p + 4 + length
        if end + 1 > n:
            raise _Refusal(f" ({length} bytes)" + _outside(p + 4, length + 1, n))
        if buf[end] != 0:
            raise _Refusal(f" at byte {p} is not NUL-terminated")
        budget -= length + 5
        if budget < 0:
            raise _Refusal(_SHARED)

    def table(pos, name, depth) -> None:  # pos >= 0, as for strings
        nonlocal budget
        if depth > MAX_DEPTH:
            raise _Refusal(f": tables nested deeper than {MAX_DEPTH}")
        if pos + 4 > n:
            raise _Refusal(_of(name, depth) + _outside(pos, 4, n))
        vt = pos - i32(buf, pos)[0]
        if vt & 1:
            raise _Refusal(f"{_of(name, depth)}: vtable at odd byte {vt}")
        if vt < 0 or vt + 4 > n:
            raise _Refusal(f"{_of(name, depth)} vtable" + _outside(vt, 4, n))
        vt_size, tbl_size = u16(buf, vt)[0], u16(buf, vt + 2)[0]
        if vt_size < 4 or vt_size & 1:
            raise _Refusal(f"{_of(name, depth)}: vtable size {vt_size} is invalid")
        if vt + vt_size > n:
            raise _Refusal(f"{_of(name, depth)} vtable" + _outside(vt, vt_size, n))
        if tbl_size < 4:
            raise _Refusal(f"{_of(name, depth)}: table size {tbl_size} is invalid")
        if pos + tbl_size > n:
            raise _Refusal(_of(name, depth) + _outside(pos, tbl_size, n))
        budget -= tbl_size
        if budget < 0:
            raise _Refusal(_of(name, depth) + _SHARED)
        for voff, code, size, enum, sub, field in plans[name]:
            if voff >= vt_size:
                break  # written by an older schema: later fields absent
            fo = u16(buf, vt + voff)[0]
            if not fo:
                continue
            at = pos + fo
            try:
                if code == 0:
                    if at + size > n:
                        raise _Refusal(_outside(at, size, n))
                    if enum is not None and enum[0](buf, at)[0] not in enum[1]:
                        raise _Refusal(f": {enum[0](buf, at)[0]} is not a value of enum {enum[2]}")
                    continue
                if at + 4 > n:
                    raise _Refusal(_outside(at, 4, n))
                target = at + u32(buf, at)[0]
                if target & 3:
                    raise _Refusal(f" at byte {at} points to misaligned byte {target}")
                if code == 1:
                    string(target)
                elif code == 2:
                    if field in skip:  # the root's graph and every Method's (format 1.2)
                        skipped.setdefault(field, target)
                        continue
                    table(target, sub, depth + 1)
                else:  # a vector
                    if target + 4 > n:
                        raise _Refusal(_outside(target, 4, n))
                    count = u32(buf, target)[0]
                    start = target + 4
                    if start + count * size > n:
                        raise _Refusal(f" ({count} elements)" + _outside(start, count * size, n))
                    budget -= 4 + count * size
                    if budget < 0:
                        raise _Refusal(_SHARED)
                    if code == 3:
                        if enum is not None:
                            fmt, values, enum_name = enum
                            for e in range(start, start + count * size, size):
                                if fmt(buf, e)[0] not in values:
                                    raise _Refusal(f"[{(e - start) // size}]: {fmt(buf, e)[0]} is not a value "
                                                   f"of enum {enum_name}")
                        continue
                    e = start
                    try:
                        for e in range(start, start + 4 * count, 4):
                            t = e + u32(buf, e)[0]
                            if t & 3:
                                raise _Refusal(f" at byte {e} points to misaligned byte {t}")
                            if code == 4:
                                string(t)
                            else:
                                table(t, sub, depth + 1)
                    except _Refusal as r:
                        r.parts.append(f"[{(e - start) // 4}]")
                        raise
            except _Refusal as r:
                r.parts.append(field)
                raise

    if start is None:
        start, name = u32(buf, 0)[0], lay.root
        if start & 3:
            raise _Refusal(f"root offset at byte 0 points to misaligned byte {start}")
    try:
        table(start, name, depth0)
    except _Refusal as r:
        r.parts.append(lay.root if depth0 == 0 else "")
        raise
    finally:
        if shared is not None:
            shared.left = budget  # (it started from shared.left and only went down)
        SPENT += initial - max(budget, 0)  # (a refusal's last claim overdraws it: not spent)
    return skipped


def problem(buf, lay: Layout | None = None, skip=()) -> str | None:
    """What makes ``buf`` malformed, or None when it is a well-formed buffer of the schema's root
    table (``lay``: the schema's layout, pt2b.fbs's by default)."""
    return _checked(buf, lay or layout(), frozenset("." + f for f in skip))[0]


def _checked(buf, lay: Layout, skip, shared: Budget | None = None) -> tuple[str | None, dict]:
    if len(buf) < 8:
        return f"{len(buf)} bytes cannot hold a root offset and file identifier", {}
    if lay.file_identifier and bytes(buf[4:8]) != lay.file_identifier.encode():
        return f"file identifier {bytes(buf[4:8])!r} is not {lay.file_identifier!r}", {}
    try:
        return None, _walk(buf, lay, skip=skip, shared=shared)
    except _Refusal as r:
        return r.message(), {}


def check_buffer(buf, where: str, lay: Layout | None = None, skip=(), budget: Budget | None = None) -> dict[str, int]:
    """Raise CorruptArtifactError unless ``buf`` is a well-formed buffer of the schema's root table;
    the message names the place and what is wrong there. The root's table fields named in ``skip``
    (schema names, e.g. "exported_program") are checked as offsets only: returns {field: position}
    of those present, for check_table when the field is first read. ``budget``: the buffer's Budget,
    which the walks of the skipped tables then draw from (by default a fresh one, unshared)."""
    why, skipped = _checked(buf, lay or layout(), frozenset("." + f for f in skip), budget)
    if why is not None:
        raise CorruptArtifactError(f"{where}: program section is malformed: {why}.")
    return {f[1:]: pos for f, pos in skipped.items()}


def check_table(buf, pos: int, table: str, field: str, where: str, lay: Layout | None = None,
                 budget: Budget | None = None) -> None:
    """The check check_buffer skipped for the root's ``field``: the ``table`` at ``pos`` and
    everything it reaches (the same rules), drawing on the buffer's ``budget`` (check_buffer's):
    a table reached again through another reference is paid for again, from the same budget."""
    lay = lay or layout()
    try:
        _walk(buf, lay, start=pos, name=table, depth0=1, shared=budget)
    except _Refusal as r:
        raise CorruptArtifactError(f"{where}: program section is malformed: {lay.root}.{field}"
                                   f"{r.message()}.") from None
