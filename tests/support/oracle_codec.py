"""Test oracle: torch's export-schema dataclasses <-> flatc's object API (G.<Table>T), the slow,
descriptive way, following schema_map's rules field by field.

pt2b itself never builds an object-API tree of the graph: the writer packs the schema tree straight
into the builder (exporter/serialize/write/encode_schema.py), the reader decodes it straight from the
buffer (exporter/serialize/read/decode_schema.py). The tests check both against this codec and flatc's
own generated Pack/InitFromPackedBuf:

    encode(obj).Pack(builder)           must write the bytes encode_schema.pack(builder, obj) writes
    decode(cls, G.XT.InitFromPackedBuf) must give what decode_schema.read gives (or refuse the same way)

``encode`` also serves tests that edit a program's object-API tree by hand.
"""

from __future__ import annotations

from torch._export.serde.union import _Union

from exporter.errors import CorruptArtifactError
from exporter.serialize.mapping import schema_map
from exporter.layout.generated import pt2b_generated as G

_SCALAR_KINDS = frozenset({"int", "float", "bool", "enum"})


def _enc(desc: tuple, value):
    kind = desc[0]
    if value is None:
        return None
    if kind == "str":
        return value
    if kind in _SCALAR_KINDS:
        return schema_map.enc_scalar(desc, value)
    if kind == "dc":
        return encode(value)
    if kind == "opt":
        return _enc(desc[1], value)
    if kind == "list":
        return [_enc(desc[1], v) for v in value]
    if kind == "listlist":
        out = []
        for items in value:
            t = getattr(G, desc[2] + "T")()
            t.items = [_enc(desc[1], v) for v in items]
            out.append(t)
        return out
    if kind == "dict":
        out = []
        for k, v in value.items():
            t = getattr(G, desc[2] + "T")()
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
        t.tag = schema_map.tags(cls)[0][name]
        for fname, attr, desc, _ in schema_map.fields(cls):
            if fname == name:
                setattr(t, attr, _enc(desc, obj.value))
        return t
    for fname, attr, desc, _ in schema_map.fields(cls):
        setattr(t, attr, _enc(desc, getattr(obj, fname)))
    return t


def _dec(desc: tuple, value, where: str):
    kind = desc[0]
    if value is None:
        return None
    if kind == "str" or kind in _SCALAR_KINDS:
        return schema_map.dec_leaf(desc, value, where)
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
        return {_dec(schema_map.STR, t.key, where): _dec(desc[1], t.value, where) for t in value}
    raise AssertionError(kind)


def decode(cls, t, where: str = "program"):
    """A flatc object-API instance -> the torch serde schema dataclass ``cls``."""
    if t is None:
        raise CorruptArtifactError(f"{where}: a required {cls.__name__} table is missing.")
    if issubclass(cls, _Union):
        name = schema_map.tags(cls)[1].get(t.tag)
        if name is None:
            raise schema_map.unknown_tag(cls, t.tag, where)
        for fname, attr, desc, _ in schema_map.fields(cls):
            if fname == name:
                value = _dec(desc, getattr(t, attr), where)
                if value is None:
                    value = schema_map.required(cls, fname, desc, where)
                return cls.create(**{name: value})  # (torch's own constructor, not schema_map.make_union)
        raise AssertionError(name)
    kwargs = {}
    for fname, attr, desc, has_default in schema_map.fields(cls):
        value = _dec(desc, getattr(t, attr, None), where)
        if value is None:
            if desc[0] == "opt":
                kwargs[fname] = None
                continue
            if has_default:
                continue
            value = schema_map.required(cls, fname, desc, where)
        kwargs[fname] = value
    return cls(**kwargs)
