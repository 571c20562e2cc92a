"""The .pt2b format: reading and writing the container (preamble and header, weight segments, the
FlatBuffers program). The rest of the package enters here: ``from exporter.serialize import reader,
writer`` (loaded on first use: the writer imports torch.export's serializer, and with it
torch._dynamo). docs/format.md describes the file, docs/architecture.md the steps.

    write/     ExportedProgram -> file: writer (the whole save), serde_repairs (programs torch
               writes but cannot read, repaired), encode_schema (torch's schema tree -> tables),
               weights (segments planned and written)
    read/      file -> ExportedProgram, in the order a file is read: layout/container (preamble,
               header), buffer_bounds (the FlatBuffers buffer check), unpack_tables (pt2b's own
               tables), decode_schema (torch's schema tree), untrusted (checks on the decoded
               program), versioning's op-schema upgraders, weights (segments mapped back),
               deserialize (torch's deserializer, made cheaper); reader runs them
    mapping/   torch's schema <-> pt2b.fbs: schema_map (the field rules), dtypes, return_types,
               module_stacks
    layout/    what both directions share about the bytes: container (preamble, header), fbs (the
               table layout of schemas/pt2b.fbs), segments (tensor kinds, segment digests)
    generated/ flatc's code for schemas/pt2b.fbs (tools/regen_flatbuffers.py; never edited)

Format versions, older-major steps and op-schema drift are exporter/versioning/, which this
package calls and which imports none of its code (only the classes in generated/).
"""

from __future__ import annotations


def __getattr__(name: str):
    if name == "reader":
        from .read import reader
        return reader
    if name == "writer":
        from .write import writer
        return writer
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
