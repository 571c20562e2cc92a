"""Test utility: rewrite an existing .pt2b's op table and graph nodes to simulate an artifact an
older torch wrote (old schema strings, node inputs as the old op took them).

    rewrite_artifact(src, dst, edit=fn, ops={...}, torch_version="2.0.0")

``edit(serialized_ep, program)`` mutates torch's schema dataclasses (``torch._export.serde.schema``)
and/or the flatc object-API ProgramT; the result is re-packed (the schema tree through
exporter/serialize/write/encode_schema.py, as the writer packs it) with flatbuffers.Builder + container.Header exactly like exporter/serialize/write/writer.py, with the
weight segments copied byte for byte, and written atomically.
"""

from __future__ import annotations

import zlib

import flatbuffers

from exporter.serialize import reader
from exporter.serialize.write import encode_schema
from exporter.util.atomic import atomic_write
from exporter.layout.container import FILE_IDENTIFIER, Header, align
from exporter.layout.generated import pt2b_generated as G


def find_nodes(serialized_ep, target: str) -> list:
    """Every node (subgraphs included) calling ``target`` ("torch.ops.aten.gelu.default")."""
    from exporter.graph_walk import iter_serialized_graphs

    return [n for g in iter_serialized_graphs(serialized_ep.graph_module.graph) for n in g.nodes if n.target == target]


def drop_inputs(node, *names) -> None:
    node.inputs = [i for i in node.inputs if i.name not in names]


def set_op_record(program, qualified_name: str, overload: str, schema: str, *,
                  new_qualified_name: str | None = None, new_overload: str | None = None) -> None:
    """Replace the schema (and optionally the name) of one op-table record."""
    for r in program.operators or []:
        if reader.text(r.qualifiedName) == qualified_name and reader.text(r.overload) == overload:
            r.schema = schema
            if new_qualified_name is not None:
                r.qualifiedName = new_qualified_name
            if new_overload is not None:
                r.overload = new_overload
            return
    raise KeyError(f"no op-table record {qualified_name}.{overload}")


def add_op_record(program, qualified_name: str, overload: str, schema: str, kind=G.OperatorKind.ATEN,
                  count: int = 1) -> None:
    r = G.OperatorRecordT()
    r.qualifiedName, r.overload, r.schema, r.kind, r.count = qualified_name, overload, schema, kind, count
    program.operators = sorted([*(program.operators or []), r],
                               key=lambda x: (reader.text(x.qualifiedName), reader.text(x.overload)))


def rewrite_artifact(src, dst, *, edit=None, ops: dict | None = None, torch_version: str | None = None,
                     provenance: dict | None = None, keep_graph: bool = False) -> str:
    """Copy ``src`` to ``dst`` with ``edit(serialized_ep, program)`` applied, the op-table records
    in ``ops`` ({(qualified_name, overload): old schema string}) replaced, the producing torch
    version and extra provenance entries set. Returns ``dst``."""
    art = reader.open_artifact(src)
    try:
        prog = art.program
        serialized = reader.decode_graph(art)
        for (qname, overload), schema in (ops or {}).items():
            set_op_record(prog, qname, overload, schema)
        if not keep_graph:  # (``edit`` set the graph table itself)
            prog.exportedProgram = encode_schema.Packed(serialized)
        if edit is not None:
            edit(serialized, prog)
        if torch_version is not None:
            prog.torchVersion = torch_version
        if provenance:
            entries = [e for e in prog.provenance or [] if reader.text(e.key) not in provenance]
            for k, v in provenance.items():
                e = G.StringEntryT()
                e.key, e.value = k, v
                entries.append(e)
            prog.provenance = entries
        h = art.header
        data = art.mm[: h.data_offset + h.data_size]
        builder = flatbuffers.Builder(1 << 16)
        builder.Finish(prog.Pack(builder), file_identifier=FILE_IDENTIFIER)
        program = bytes(builder.Output())
    finally:
        art.mm.close()
    program_offset = align(len(data), 8)
    header = Header(h.major, h.minor, h.data_offset, h.data_size, program_offset, len(program),
                    zlib.crc32(program))
    with atomic_write(dst) as f:
        f.write(data)
        f.write(b"\0" * (program_offset - len(data)))
        f.write(program)
        f.seek(0)
        f.write(header.pack())
    return str(dst)


def damage_graph_table(tmp_path, source=None, method=None):
    """An artifact (``source``, else the zoo's mlp written to ``tmp_path``) copied with an
    out-of-bounds vtable offset at the start of its graph table (of ``method``, default: the default
    method's), the checksums made to match: what load() no longer walks and the graph's first use
    must refuse."""
    import pathlib

    from exporter import export_model
    from tools.corpus.zoo import make_case

    path = pathlib.Path(tmp_path) / "damaged.pt2b"
    if source is None:
        case = make_case("mlp")
        export_model(case.model, case.args, path)
    else:
        path.write_bytes(pathlib.Path(source).read_bytes())
    art = reader.open_artifact(path)
    graph = reader.method(art, method).program.exportedProgram
    program = bytearray(graph.buf)
    program[graph.pos:graph.pos + 4] = (0x7FFFFFF0).to_bytes(4, "little", signed=True)  # its vtable: far outside
    h = art.header
    data = bytearray(path.read_bytes()[: h.program_offset])
    data[:64] = Header(h.major, h.minor, h.data_offset, h.data_size, h.program_offset, len(program),
                       zlib.crc32(bytes(program))).pack()
    path.write_bytes(bytes(data) + bytes(program))
    return path


class _SharedTable:
    """Stands in one table that several fields reference: packed once per builder, then the same
    offset is returned to every later reference (what a crafted file can do; pt2b's writer never
    shares a table)."""

    def __init__(self, obj):
        self.obj, self.offsets = obj, {}

    def Pack(self, builder):  # noqa: N802 (flatc's name)
        if id(builder) not in self.offsets:
            self.offsets[id(builder)] = self.obj.Pack(builder)
        return self.offsets[id(builder)]


def share_graph_across_methods(src, dst, count: int) -> str:
    """Copy ``src`` (a one-method artifact) to ``dst`` as a format 1.2 artifact whose ``count`` extra
    methods (m0, m1, ...) all point at the ONE graph table of the default method, each with its own
    copy of the tensor records and op table."""
    def edit(serialized, program):
        shared = _SharedTable(encode_schema.Packed(serialized))
        program.exportedProgram = shared
        methods = []
        for i in range(count):
            m = G.MethodT()
            m.name, m.irLevel, m.exportedProgram = f"m{i}", program.irLevel, shared
            m.tensors, m.operators = program.tensors, program.operators
            methods.append(m)
        program.methods = methods

    return rewrite_artifact(src, dst, edit=edit, keep_graph=True)
