"""The fuzzer's one conversion between flatc's object API (``G.ProgramT``) and torch's export-schema
dataclasses: the schema tree of a program table, and a program table given a new schema tree. Both go
through pt2b's own codec (exporter/serialize: encode_schema, decode_schema), the one the writer and the
reader use."""

from __future__ import annotations


def graph_of(tree):
    """torch's ``ExportedProgram`` schema tree of the object-API program table ``tree``."""
    from torch._export.serde import schema as S

    from exporter.serialize.read import decode_schema, unpack_tables

    ref = unpack_tables.packed(tree.exportedProgram, "ExportedProgram")
    return decode_schema.read(ref.buf, ref.pos, S.ExportedProgram, "seed")


def set_graph(tree, ep) -> None:
    """Replace the schema tree of ``tree`` by ``ep``; raises whatever encoding ``ep`` raises, and
    leaves ``tree`` as it was then (the table is packed here, not when ``tree`` is)."""
    from exporter.serialize.read import unpack_tables
    from exporter.serialize.write import encode_schema

    tree.exportedProgram = unpack_tables.packed(encode_schema.Packed(ep), "ExportedProgram")
