"""The rules that map torch.export's serialization dataclasses (torch._export.serde.schema) to the tables
of schemas/pt2b.fbs: one home for them, used by both directions (encode_schema.py, decode_schema.py)
and by the checks of untrusted.py. The convention and its descriptors:
docs/format.md#the-mapping-and-the-codec."""

from __future__ import annotations

import dataclasses
import enum
import functools
import types
import typing

import numpy as np

from ..._torch import compat as torch_compat
from ..._torch.serde import schema as S
from ...errors import ArtifactError, CorruptArtifactError, ExportError, UnsupportedVersionError
from ...layout import fbs
from ...layout.generated import pt2b_generated as G

STR = ("str",)
_SCALARS = {str: STR, int: ("int",), float: ("float",), bool: ("bool",)}
_LIST_TABLES = {int: "IntList", float: "DoubleList", S.TensorArgument: "TensorArgumentList"}
_ENTRY_TABLES = {str: "StringEntry", int: "IntEntry"}


def camel(name: str) -> str:
    """flatc's object-API attribute name for a snake_case schema field."""
    head, *rest = name.split("_")
    return head + "".join(p[:1].upper() + p[1:] for p in rest)


def describe(tp) -> tuple:
    """The descriptor of a schema field's Python type (docs/format.md#the-mapping-and-the-codec)."""
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        (inner,) = [a for a in args if a is not type(None)]
        return ("opt", describe(inner))
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
            return ("listlist", describe(inner), _LIST_TABLES[inner])
        return ("list", describe(elem))
    if origin is dict:
        _, value = args
        return ("dict", describe(value), _ENTRY_TABLES.get(value) or value.__name__ + "Entry")
    raise TypeError(f"no .pt2b encoding for schema type {tp!r}")


@functools.cache
def fields(cls) -> tuple[tuple[str, str, tuple, bool], ...]:
    """(field name, object-API attribute, descriptor, has a dataclass default) of a schema dataclass."""
    hints = typing.get_type_hints(cls, vars(S))
    out = []
    for f in dataclasses.fields(cls):
        has_default = f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING
        out.append((f.name, camel(f.name), describe(hints[f.name]), has_default))
    return tuple(out)


@functools.cache
def tags(cls) -> tuple[dict[str, int], dict[int, str]]:
    """({member name: tag value}, {tag value: member name}) of a schema union."""
    tag_cls = getattr(G, cls.__name__ + "Tag")
    by_name = {k: v for k, v in vars(tag_cls).items() if not k.startswith("_") and k != "NONE"}
    return by_name, {v: k for k, v in by_name.items()}


@functools.cache
def table_defaults(table: str) -> tuple[tuple[str, object], ...]:
    """(object-API attribute, wire default) of each field of ``table``, in declaration order, i.e.
    layout/fbs.py's order: what flatc's <table>T() initialises (a scalar equal to its default is not
    written; an absent one reads as it)."""
    defaults = tuple(getattr(G, table + "T")().__dict__.items())
    n = len(fbs.layout().tables[table])
    if len(defaults) != n:
        raise fbs.SchemaLayoutError(f"{table}T has {len(defaults)} attributes, pt2b.fbs {n} fields.")
    return defaults


def wire_dtype(scalar: str) -> np.dtype:
    """The numpy dtype of a vector of the wire scalar type ``scalar`` (flatc's, bool as np.bool_)."""
    return np.dtype(np.bool_) if scalar == "bool" else np.dtype(fbs.SCALARS[scalar][0])


def strip_opt(desc: tuple) -> tuple:
    """The descriptor under any ("opt", ...) wrapping."""
    return strip_opt(desc[1]) if desc[0] == "opt" else desc


# the Python type of a plain scalar, the same on both sides of the wire
_PLAIN = {"int": int, "float": float, "bool": bool}


def enc_scalar(desc: tuple, value):
    """A scalar field's value as it goes on the wire (int64 range checked, enums as ints)."""
    kind = desc[0]
    if kind == "int" and not -(2**63) <= value < 2**63:
        raise ExportError(f"integer {value} does not fit in 64 bits; .pt2b stores int64.")
    cast = _PLAIN.get(kind)
    if cast is not None:
        return cast(value)
    if kind == "enum":
        return int(value)
    raise AssertionError(kind)


def dec_leaf(desc: tuple, value, where: str):
    """A string (bytes) or scalar read from the wire as the schema value: CorruptArtifactError for
    invalid UTF-8 or an enum value the schema lacks."""
    kind = desc[0]
    if kind == "str":
        try:
            return value.decode("utf-8")
        except UnicodeDecodeError as e:
            raise CorruptArtifactError(f"{where}: string is not valid UTF-8 ({e}).") from None
    cast = _PLAIN.get(kind)
    if cast is not None:
        return cast(value)
    if kind == "enum":
        try:
            return desc[1](int(value))
        except ValueError:
            member = {v: k for k, v in vars(getattr(G, desc[1].__name__)).items() if not k.startswith("_")}.get(value)
            if member is not None:  # in pt2b.fbs, not in the running torch's export schema
                what = f"{desc[1].__name__}.{member}"
                raise UnsupportedVersionError(f"{where}: {torch_compat.schema_lacks(what)}.") from None
            raise CorruptArtifactError(
                f"{where}: value {value} is not a valid {desc[1].__name__}; the artifact is "
                f"damaged or was written by a newer pt2b."
            ) from None
    raise AssertionError(kind)


def required(cls, fname: str, desc: tuple, where: str):
    """The value of a field absent from the wire that has no dataclass default and is not optional:
    an empty list/dict/string; a missing table or scalar is damage."""
    if desc[0] in ("list", "listlist"):
        return []
    if desc[0] == "dict":
        return {}
    if desc[0] == "str":
        return ""
    raise CorruptArtifactError(f"{where}: required field {cls.__name__}.{fname} is missing.")


def unknown_tag(cls, value, where: str) -> ArtifactError:
    """The error for a union whose tag names no member (of pt2b.fbs, or of the running torch's schema)."""
    member = tags(cls)[1].get(value)
    if member is not None and member not in torch_compat.schema_union_members(cls):
        return UnsupportedVersionError(f"{where}: {torch_compat.schema_lacks(f'{cls.__name__}.{member}')}.")
    return CorruptArtifactError(f"{where}: {cls.__name__} has unknown tag {value}; the artifact is damaged or "
                                f"was written by a newer pt2b.")
