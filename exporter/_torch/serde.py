"""torch.export's serialization schema (torch._export.serde.schema: the dataclasses pt2b maps to its
FlatBuffers tables) and their union base: the cheap half of torch._export.serde, without torch._dynamo.
The serializer itself is in ``serializer``."""

from torch._export.serde import schema
from torch._export.serde.union import _Union as Union
from torch._export.serde.union import _UnionTag as UnionTag

__all__ = ["Union", "UnionTag", "schema"]
