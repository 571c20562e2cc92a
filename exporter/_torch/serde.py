"""torch.export's serialization schema (torch._export.serde.schema: the dataclasses pt2b maps to its
FlatBuffers tables) and their union base: the cheap half of torch._export.serde, without torch._dynamo.
The serializer itself is in ``serializer``."""

import dataclasses
import functools

from torch._export.serde import schema
from torch._export.serde.union import _Union as Union
from torch._export.serde.union import _UnionTag as UnionTag

__all__ = ["Union", "UnionTag", "make_union", "schema"]


@functools.cache
def _union_layout(cls, name: str):
    """(field names in order, the tag object) of ``cls.create(name=...)``; None where ``cls`` has no
    field ``name``."""
    names = tuple(f.name for f in dataclasses.fields(cls))
    return (names, UnionTag.create(name, cls)) if name in names else None


def make_union(cls, name: str, value):
    """What ``cls.create(**{name: value})`` builds (every member None but ``name``, and the tag; one tag
    object per member, shared: a str), without its per-call dataclasses.fields(), __init__ and
    __post_init__: a tenth of a load's decoding, half of torch's serializer's time on a graph."""
    layout = _union_layout(cls, name)
    if layout is None:
        raise TypeError(f"{cls.__name__}.__init__() got an unexpected keyword argument {name!r}")
    names, tag = layout
    obj = object.__new__(cls)
    state = obj.__dict__
    for n in names:
        state[n] = None
    state[name] = value
    state["_type"] = tag
    return obj
