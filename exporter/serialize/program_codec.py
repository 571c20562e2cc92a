"""Maps torch.export's serialization dataclasses (torch._export.serde.schema) to the
FlatBuffers object API generated from schemas/pt2b.fbs, and back.

One rule drives both directions: every schema dataclass has a table of the same name whose
fields carry the same names (see the conventions at the top of pt2b.fbs).
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import types
import typing

from torch._export.serde import schema as S
from torch._export.serde.union import _Union

from ..errors import CorruptArtifactError, ExportError
from .generated import pt2b_generated as G


def _camel(name: str) -> str:
    """flatc's object-API attribute name for a snake_case schema field."""
    head, *rest = name.split("_")
    return head + "".join(p[:1].upper() + p[1:] for p in rest)


# ---- type descriptors: what a field's Python type means on the wire ----
# ("str",) ("int",) ("float",) ("bool",) ("enum", cls) ("dc", cls) ("list", desc)
# ("dict", value_desc, EntryT) ("listlist", elem_desc, ListT) ("opt", desc)

_SCALARS = {str: ("str",), int: ("int",), float: ("float",), bool: ("bool",)}
_LIST_TABLES = {int: "IntList", float: "DoubleList", S.TensorArgument: "TensorArgumentList"}
_ENTRY_TABLES = {str: "StringEntry", int: "IntEntry"}


def _describe(tp) -> tuple:
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        (inner,) = [a for a in args if a is not type(None)]
        return ("opt", _describe(inner))
    if tp in _SCALARS:
        return _SCALARS[tp]
    if isinstance(tp, type) and issubclass(tp, enum.IntEnum):
        return ("enum", tp)
    if dataclasses.is_dataclass(tp):
        return ("dc", tp)
    if origin is list:
        (elem,) = args
        if typing.get_origin(elem) is list:
            (inner,) = typing.get_args(elem)
            return ("listlist", _describe(inner), getattr(G, _LIST_TABLES[inner] + "T"))
        return ("list", _describe(elem))
    if origin is dict:
        _, value = args
        entry = _ENTRY_TABLES.get(value) or value.__name__ + "Entry"
        return ("dict", _describe(value), getattr(G, entry + "T"))
    raise TypeError(f"no .pt2b encoding for schema type {tp!r}")


@functools.cache
def _fields(cls) -> tuple[tuple[str, str, tuple, bool], ...]:
    """(field name, object-API attribute, descriptor, has default) for a schema dataclass."""
    hints = typing.get_type_hints(cls, vars(S))
    out = []
    for f in dataclasses.fields(cls):
        has_default = f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING
        out.append((f.name, _camel(f.name), _describe(hints[f.name]), has_default))
    return tuple(out)


@functools.cache
def _tags(cls) -> tuple[dict[str, int], dict[int, str]]:
    tag_cls = getattr(G, cls.__name__ + "Tag")
    by_name = {k: v for k, v in vars(tag_cls).items() if not k.startswith("_") and k != "NONE"}
    return by_name, {v: k for k, v in by_name.items()}


def strip_opt(desc: tuple) -> tuple:
    """The descriptor under any ("opt", ...) wrapping."""
    return strip_opt(desc[1]) if desc[0] == "opt" else desc


_SCALAR_KINDS = frozenset({"int", "float", "bool", "enum"})


# ---- encode: schema dataclass -> object API ----
def enc_scalar(desc: tuple, value):
    """A scalar field's value as it goes on the wire (int64 range checked, enums as ints)."""
    kind = desc[0]
    if kind == "int":
        if not -(2**63) <= value < 2**63:
            raise ExportError(f"integer {value} does not fit in 64 bits; .pt2b stores int64.")
        return int(value)
    if kind == "float":
        return float(value)
    if kind == "bool":
        return bool(value)
    if kind == "enum":
        return int(value)
    raise AssertionError(kind)


def _enc(desc: tuple, value):
    kind = desc[0]
    if value is None:
        return None
    if kind == "str":
        return value
    if kind in _SCALAR_KINDS:
        return enc_scalar(desc, value)
    if kind == "dc":
        return encode(value)
    if kind == "opt":
        return _enc(desc[1], value)
    if kind == "list":
        return [_enc(desc[1], v) for v in value]
    if kind == "listlist":
        out = []
        for items in value:
            t = desc[2]()
            t.items = [_enc(desc[1], v) for v in items]
            out.append(t)
        return out
    if kind == "dict":
        out = []
        for k, v in value.items():
            t = desc[2]()
            t.key = k
            t.value = _enc(desc[1], v)
            out.append(t)
        return out
    raise AssertionError(kind)


def encode(obj):
    """A torch serde schema dataclass -> the matching flatc object-API instance."""
    cls = type(obj)
    t = getattr(G, cls.__name__ + "T")()
    if isinstance(obj, _Union):
        name = obj.type
        by_name, _ = _tags(cls)
        t.tag = by_name[name]
        for fname, attr, desc, _ in _fields(cls):
            if fname == name:
                setattr(t, attr, _enc(desc, obj.value))
        return t
    for fname, attr, desc, _ in _fields(cls):
        setattr(t, attr, _enc(desc, getattr(obj, fname)))
    return t


# ---- decode: object API -> schema dataclass ----
def dec_leaf(desc: tuple, value, where: str):
    """A string (bytes) or scalar read from the wire as the schema value: CorruptArtifactError for
    invalid UTF-8 or an enum value the schema lacks."""
    kind = desc[0]
    if kind == "str":
        try:
            return value.decode("utf-8")
        except UnicodeDecodeError as e:
            raise CorruptArtifactError(f"{where}: string is not valid UTF-8 ({e}).") from None
    if kind == "int":
        return int(value)
    if kind == "float":
        return float(value)
    if kind == "bool":
        return bool(value)
    if kind == "enum":
        try:
            return desc[1](int(value))
        except ValueError:
            raise CorruptArtifactError(
                f"{where}: value {value} is not a valid {desc[1].__name__}; the artifact is "
                f"damaged or was written by a newer pt2b."
            ) from None
    raise AssertionError(kind)


def _dec(desc: tuple, value, where: str):
    kind = desc[0]
    if value is None:
        return None
    if kind == "str" or kind in _SCALAR_KINDS:
        return dec_leaf(desc, value, where)
    if kind == "dc":
        return decode(desc[1], value, where)
    if kind == "opt":
        return _dec(desc[1], value, where)
    if kind == "list":
        if hasattr(value, "tolist"):
            value = value.tolist()
        return [_dec(desc[1], v, where) for v in value]
    if kind == "listlist":
        return [_dec(("list", desc[1]), t.items if t.items is not None else [], where) for t in value]
    if kind == "dict":
        return {_dec(("str",), t.key, where): _dec(desc[1], t.value, where) for t in value}
    raise AssertionError(kind)


def _required(cls, fname: str, desc: tuple, where: str):
    if desc[0] in ("list", "listlist"):
        return []
    if desc[0] == "dict":
        return {}
    if desc[0] == "str":
        return ""
    raise CorruptArtifactError(f"{where}: required field {cls.__name__}.{fname} is missing.")


@functools.cache
def _union_layout(cls, name: str):
    """(field names in order, the tag object) of ``cls.create(name=...)``."""
    from torch._export.serde.union import _UnionTag

    return tuple(f.name for f in dataclasses.fields(cls)), _UnionTag.create(name, cls)


def make_union(cls, name: str, value):
    """What ``cls.create(**{name: value})`` builds (every member None but ``name``, and the tag),
    without its per-call dataclasses.fields() and __init__: a tenth of a load's decoding."""
    names, tag = _union_layout(cls, name)
    obj = object.__new__(cls)
    state = obj.__dict__
    for n in names:
        state[n] = None
    state[name] = value
    state["_type"] = tag
    return obj


def decode(cls, t, where: str = "program"):
    """A flatc object-API instance -> the torch serde schema dataclass ``cls``."""
    if t is None:
        raise CorruptArtifactError(f"{where}: a required {cls.__name__} table is missing.")
    if issubclass(cls, _Union):
        _, by_tag = _tags(cls)
        name = by_tag.get(t.tag)
        if name is None:
            raise CorruptArtifactError(
                f"{where}: {cls.__name__} has unknown tag {t.tag}; the artifact is damaged or "
                f"was written by a newer pt2b."
            )
        for fname, attr, desc, _ in _fields(cls):
            if fname == name:
                value = _dec(desc, getattr(t, attr), where)
                if value is None:
                    value = _required(cls, fname, desc, where)
                return make_union(cls, name, value)
        raise AssertionError(name)
    kwargs = {}
    for fname, attr, desc, has_default in _fields(cls):
        value = _dec(desc, getattr(t, attr, None), where)
        if value is None:
            if desc[0] == "opt":
                kwargs[fname] = None
                continue
            if has_default:
                continue
            value = _required(cls, fname, desc, where)
        kwargs[fname] = value
    return cls(**kwargs)


def schema_dataclasses() -> list[type]:
    """Every dataclass of torch's export schema that a .pt2b program can contain."""
    seen: dict[type, None] = {}

    def visit(desc):
        if desc[0] == "dc" and desc[1] not in seen:
            seen[desc[1]] = None
            for _, _, d, _ in _fields(desc[1]):
                visit(d)
        elif desc[0] in ("list", "opt", "dict", "listlist"):
            visit(desc[1])

    visit(("dc", S.ExportedProgram))
    return list(seen)
