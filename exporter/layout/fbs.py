"""The binary layout of schemas/pt2b.fbs as data (tables, field slots, types, enum values),
read from the schema itself so the verifier follows every schema change without hand edits.

Only the constructs pt2b.fbs uses are accepted (tables, enums, scalars, optional scalars,
strings, vectors of scalars/strings/tables, the `since`/`holds` attributes that date a field);
anything else (structs, unions, explicit ids, deprecated fields) is refused so a schema change that needs verifier work cannot slip by.
"""

from __future__ import annotations

import dataclasses
import functools
import re

from .. import package_data

SCHEMA = package_data.path("pt2b.fbs")

# flatbuffers scalar type -> (struct format, size)
SCALARS = {
    "bool": ("<B", 1), "byte": ("<b", 1), "ubyte": ("<B", 1), "int8": ("<b", 1), "uint8": ("<B", 1),
    "short": ("<h", 2), "ushort": ("<H", 2), "int16": ("<h", 2), "uint16": ("<H", 2),
    "int": ("<i", 4), "uint": ("<I", 4), "int32": ("<i", 4), "uint32": ("<I", 4),
    "long": ("<q", 8), "ulong": ("<Q", 8), "int64": ("<q", 8), "uint64": ("<Q", 8),
    "float": ("<f", 4), "double": ("<d", 8), "float32": ("<f", 4), "float64": ("<d", 8),
}


class SchemaLayoutError(ValueError):
    """pt2b.fbs uses a construct the verifier does not know (a developer error, not a file error)."""


@dataclasses.dataclass(frozen=True)
class Field:
    name: str
    slot: int            # vtable slot: the field's entry is at vtable + 4 + 2 * slot
    kind: str            # "scalar" | "string" | "table" | "vector"
    type: str            # scalar type name, table name, or the vector's element type name
    elem: str = ""       # for vectors: "scalar" | "string" | "table"
    enum: str = ""       # the enum a scalar (or vector element) is typed with, "" when none
    since: tuple[int, int] | None = None  # the format version that added it (attribute `since`), None: 1.0
    holds: str = ""      # what it holds (attribute `holds`), for the error that refuses it in an older version


@dataclasses.dataclass(frozen=True)
class Layout:
    tables: dict[str, tuple[Field, ...]]
    enums: dict[str, tuple[str, frozenset[int]]]  # name -> (underlying scalar, values)
    root: str
    file_identifier: str


_DECL = re.compile(r"\b(table|struct|union|enum)\s+(\w+)\s*(?::\s*(\w+))?\s*\{(.*?)\}", re.S)
_FIELD = re.compile(r"^\s*(\w+)\s*:\s*(\[?\s*[\w.]+\s*\]?)\s*(?:=\s*([^;(]+?))?\s*(\(.*\))?\s*$", re.S)
_ATTRIBUTE = re.compile(r'\s*(\w+)\s*:\s*"([^"]*)"\s*(?:,|$)')
ATTRIBUTES = ("since", "holds")  # the attributes pt2b.fbs declares; they change no byte of the layout


def _attributes(where: str, text: str) -> dict[str, str]:
    """``(since: "1.3", holds: "...")`` -> {"since": "1.3", "holds": "..."}; only ATTRIBUTES, with string values."""
    body, found, at = text.strip()[1:-1], {}, 0
    while at < len(body):
        m = _ATTRIBUTE.match(body, at)
        if not m or m.group(1) not in ATTRIBUTES:
            raise SchemaLayoutError(f"{where} has attributes {text}: only {', '.join(ATTRIBUTES)} with string values "
                                    "are supported.")
        found[m.group(1)] = m.group(2)
        at = m.end()
    return found


def _strip_comments(text: str) -> str:
    return re.sub(r"//[^\n]*", "", text)


def parse(text: str) -> Layout:
    text = _strip_comments(text)
    enums: dict[str, tuple[str, frozenset[int]]] = {}
    raw_tables: dict[str, list[tuple[str, str]]] = {}
    for kind, name, base, body in _DECL.findall(text):
        if kind in ("struct", "union"):
            raise SchemaLayoutError(f"pt2b.fbs declares {kind} {name}: the verifier supports tables and enums only.")
        if kind == "enum":
            if base not in SCALARS:
                raise SchemaLayoutError(f"enum {name} has no scalar base type.")
            values, nxt = set(), 0
            for item in filter(None, (s.strip() for s in body.split(","))):
                label, _, value = item.partition("=")
                nxt = int(value.strip(), 0) if value.strip() else nxt
                values.add(nxt)
                nxt += 1
            enums[name] = (base, frozenset(values))
        else:
            fields = []
            for decl in filter(None, (s.strip() for s in body.split(";"))):
                m = _FIELD.match(decl)
                if not m:
                    raise SchemaLayoutError(f"table {name}: cannot read field declaration {decl!r}.")
                attrs = _attributes(f"table {name}.{m.group(1)}", m.group(4)) if m.group(4) else {}
                fields.append((m.group(1), re.sub(r"\s", "", m.group(2)), attrs))
            raw_tables[name] = fields
    tables = {}
    for name, fields in raw_tables.items():
        out = []
        for slot, (fname, ftype, attrs) in enumerate(fields):
            vector = ftype.startswith("[")
            base = ftype.strip("[]").rsplit(".", 1)[-1]
            enum = base if base in enums else ""
            if enum:
                cls, scalar = "scalar", enums[base][0]
            elif base in SCALARS:
                cls, scalar = "scalar", base
            elif base == "string":
                cls, scalar = "string", "string"
            elif base in raw_tables:
                cls, scalar = "table", base
            else:
                raise SchemaLayoutError(f"table {name}.{fname}: unknown type {ftype!r}.")
            since = attrs.get("since")
            if since is not None and not re.fullmatch(r"\d+\.\d+", since):
                raise SchemaLayoutError(f"table {name}.{fname}: since must look like \"MAJOR.MINOR\", not {since!r}.")
            version = tuple(int(x) for x in since.split(".")) if since else None
            kind = dict(kind="vector", type=scalar, elem=cls) if vector else dict(kind=cls, type=scalar)
            out.append(Field(fname, slot, **kind, enum=enum, since=version, holds=attrs.get("holds", "")))
        tables[name] = tuple(out)
    root = re.search(r"\broot_type\s+(\w+)\s*;", text)
    ident = re.search(r'\bfile_identifier\s+"([^"]*)"\s*;', text)
    if not root or root.group(1) not in tables:
        raise SchemaLayoutError("pt2b.fbs has no root_type naming one of its tables.")
    return Layout(tables, enums, root.group(1), ident.group(1) if ident else "")


@functools.cache
def layout() -> Layout:
    """The layout of the schema this pt2b writes (schemas/pt2b.fbs)."""
    return parse(package_data.read_text("pt2b.fbs"))
