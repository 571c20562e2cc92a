"""The program-section verifier: its layout is the schema flatc compiles, it accepts every real
artifact, refuses each kind of malformed buffer with a message naming the place, and whatever it
accepts the FlatBuffers object API unpacks without error (hypothesis over byte mutations)."""

import inspect
import pathlib
import re
import struct
import zlib

import flatbuffers
import numpy as np
from tests.support import oracle_codec
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from exporter import export_model, load
from exporter.errors import CorruptArtifactError
from exporter.serialize import reader
from exporter.layout import fbs
from exporter.serialize.read import buffer_bounds, decode_schema, unpack_tables
from exporter.layout.container import FILE_IDENTIFIER, Header
from exporter.layout.generated import pt2b_generated as G
from tools.corpus.zoo import make_case

GOLDEN = pathlib.Path(__file__).parents[1] / "golden"


def _camel(name: str) -> str:
    return "".join(p[:1].upper() + p[1:] for p in name.split("_"))


def test_layout_is_the_schema_flatc_compiled():
    lay = fbs.layout()
    assert lay.root == "Program" and lay.file_identifier == FILE_IDENTIFIER.decode()
    assert len(lay.tables) > 60
    for table, fields in lay.tables.items():
        cls = getattr(G, table)
        for f in fields:
            src = inspect.getsource(getattr(cls, _camel(f.name)))
            assert f"self._tab.Offset({4 + 2 * f.slot})" in src, (table, f.name, f.slot)
            if f.kind == "vector":
                assert hasattr(cls, _camel(f.name) + "Length"), (table, f.name)
    for enum, (_, values) in lay.enums.items():
        declared = {v for k, v in vars(getattr(G, enum)).items() if not k.startswith("_")}
        assert declared == set(values), enum


def test_schema_constructs_outside_the_verifier_are_refused():
    with pytest.raises(fbs.SchemaLayoutError, match="struct Vec3"):
        fbs.parse("struct Vec3 { x: float; } table T { a: int; } root_type T;")
    with pytest.raises(fbs.SchemaLayoutError, match="union U"):
        fbs.parse("table A { x: int; } union U { A } table T { u: U; } root_type T;")
    with pytest.raises(fbs.SchemaLayoutError, match="attributes"):
        fbs.parse("table T { a: int (id: 3); } root_type T;")
    with pytest.raises(fbs.SchemaLayoutError, match="unknown type"):
        fbs.parse("table T { a: Missing; } root_type T;")
    lay = fbs.parse("enum E : ubyte { A, B = 5, C } table T { e: [E]; s: string; } root_type T;")
    assert lay.enums["E"] == ("ubyte", frozenset({0, 5, 6}))
    assert lay.tables["T"][0] == fbs.Field("e", 0, "vector", "ubyte", elem="scalar", enum="E")


def _program_bytes(path) -> bytes:
    art = reader.open_artifact(path)
    return bytes(art.mm[art.header.program_offset: art.header.program_offset + art.header.program_size])


def _pack(program_t) -> bytes:
    b = flatbuffers.Builder(1 << 12)
    b.Finish(program_t.Pack(b), file_identifier=FILE_IDENTIFIER)
    return bytes(b.Output())


def _with_program(src, dst, program: bytes):
    """``src`` with its program section replaced by ``program``, checksums made valid again."""
    art = reader.open_artifact(src)
    h = art.header
    data = bytearray(pathlib.Path(src).read_bytes()[: h.program_offset])
    data[:64] = Header(h.major, h.minor, h.data_offset, h.data_size, h.program_offset, len(program),
                       zlib.crc32(program)).pack()
    pathlib.Path(dst).write_bytes(bytes(data) + program)
    return dst


@pytest.fixture(scope="module")
def artifact(tmp_path_factory):
    case = make_case("cond")
    path = tmp_path_factory.mktemp("verifier") / "cond.pt2b"
    export_model(case.model, case.args, path, kwargs=case.kwargs, dynamic_shapes=case.dynamic_shapes)
    return path


def test_real_artifacts_verify():
    paths = sorted(GOLDEN.rglob("*.pt2b"))
    assert len(paths) >= 20
    for p in paths:
        buffer_bounds.check_buffer(_program_bytes(p), str(p))


def _u32_at(buf: bytes, pos: int, value: int) -> bytes:
    return buf[:pos] + struct.pack("<I", value) + buf[pos + 4:]


def _first(buf: bytes, pattern: bytes) -> int:
    i = buf.find(pattern)
    assert i >= 0
    return i


def _expect(buf: bytes, match: str):
    with pytest.raises(CorruptArtifactError, match=match):
        buffer_bounds.check_buffer(buf, "m.pt2b")


def test_root_and_identifier(artifact):
    buf = _program_bytes(artifact)
    _expect(buf[:6], "cannot hold a root offset")
    _expect(buf[:4] + b"XXXX" + buf[8:], "file identifier b'XXXX'")
    _expect(_u32_at(buf, 0, len(buf) + 64), r"Program at byte \d+ \(\+4\) lies outside the \d+-byte buffer")
    _expect(_u32_at(buf, 0, 2), "misaligned")


def test_vtable_out_of_bounds(artifact):
    buf = _program_bytes(artifact)
    root = struct.unpack_from("<I", buf, 0)[0]
    bad = buf[:root] + struct.pack("<i", -(len(buf) * 2)) + buf[root + 4:]
    _expect(bad, "Program vtable.*outside")
    bad = buf[:root] + struct.pack("<i", 1) + buf[root + 4:]
    _expect(bad, "vtable at odd byte")


def _string_pos(buf: bytes, text: bytes) -> int:
    """Offset of the length word of the FlatBuffers string holding ``text``."""
    i = _first(buf, text + b"\0")
    assert struct.unpack_from("<I", buf, i - 4)[0] == len(text)
    return i - 4


def test_string_length_and_terminator(artifact):
    buf = _program_bytes(artifact)
    pos = _string_pos(buf, b"training")  # Program.ir_level
    _expect(_u32_at(buf, pos, 0x7FFFFFF0), r"Program.ir_level \(2147483632 bytes\) .* outside")
    _expect(buf[: pos + 4 + 8] + b"!" + buf[pos + 4 + 9:], "Program.ir_level at byte .* is not NUL-terminated")


def test_huge_vector_count_is_refused_before_any_allocation(artifact):
    program = G.ProgramT.InitFromPackedBuf(_program_bytes(artifact), 0)
    marker = b"\x11\x22\x33\x44\x55\x66\x77\x88"
    program.exampleInputsLeaves = list(marker)  # a [ubyte] vector we can find
    buf = _pack(program)
    pos = _first(buf, marker) - 4
    assert struct.unpack_from("<I", buf, pos)[0] == len(marker)
    _expect(_u32_at(buf, pos, 0xFFFFFFFF), r"Program.example_inputs_leaves \(4294967295 elements\)")


def test_enum_out_of_range(artifact):
    program = G.ProgramT.InitFromPackedBuf(_program_bytes(artifact), 0)
    program.tensors[0].kind = 200
    _expect(_pack(program), r"Program.tensors\[0\].kind: 200 is not a value of enum TensorKind")
    program.tensors[0].kind = G.TensorKind.BUFFER
    program.operators[0].kind = 9
    _expect(_pack(program), r"Program.operators\[0\].kind: 9 is not a value of enum OperatorKind")


def test_shared_offsets_cannot_amplify_unpacking():
    """1,000 offsets to one 100 kB string: 0.1 MB on disk, 100 MB once unpacked. Refused."""
    b = flatbuffers.Builder(1 << 20)
    s = b.CreateString("x" * 100_000)
    b.StartVector(4, 1000, 4)
    for _ in range(1000):
        b.PrependUOffsetTRelative(s)
    vec = b.EndVector()
    G.ExportedProgramStart(b)
    G.ExportedProgramAddVerifiers(b, vec)
    ep = G.ExportedProgramEnd(b)
    G.ProgramStart(b)
    G.ProgramAddExportedProgram(b, ep)
    b.Finish(G.ProgramEnd(b), file_identifier=FILE_IDENTIFIER)
    buf = bytes(b.Output())
    assert len(buf) < 110_000
    _expect(buf, r"Program.exported_program.verifiers\[\d+\]: objects are referenced more often")


def _nested_graph(depth: int):
    graph = G.GraphT()
    for _ in range(depth):
        arg = G.ArgumentT()
        arg.tag, arg.asGraph = G.ArgumentTag.as_graph, G.GraphArgumentT()
        arg.asGraph.name, arg.asGraph.graph = "g", graph
        named = G.NamedArgumentT()
        named.name, named.arg = "x", arg
        node = G.NodeT()
        node.target, node.inputs = "torch.ops.higher_order.cond", [named]
        graph = G.GraphT()
        graph.nodes = [node]
    program = G.ProgramT()
    program.exportedProgram = G.ExportedProgramT()
    program.exportedProgram.graphModule = G.GraphModuleT()
    program.exportedProgram.graphModule.graph = graph
    return _pack(program)


def test_nesting_depth_is_bounded():
    buffer_bounds.check_buffer(_nested_graph(20), "m.pt2b")  # 20 nested subgraphs: fine
    _expect(_nested_graph(40), "nested deeper than 128")


def test_load_runs_the_verifier(artifact, tmp_path):
    program = G.ProgramT.InitFromPackedBuf(_program_bytes(artifact), 0)
    program.tensors[0].kind = 77
    bad = _with_program(artifact, tmp_path / "bad.pt2b", _pack(program))
    with pytest.raises(CorruptArtifactError, match=r"bad.pt2b: program section is malformed: .*enum TensorKind"):
        load(bad)
    good = _with_program(artifact, tmp_path / "good.pt2b", _program_bytes(artifact))
    x = make_case("cond").args
    torch.testing.assert_close(load(good)(*x), load(artifact)(*x), rtol=0, atol=0)


@pytest.fixture(scope="module")
def pristine(artifact):
    return _program_bytes(artifact)


def _mutated(pristine, data) -> bytes:
    buf = bytearray(pristine)
    for _ in range(data.draw(st.integers(1, 4))):
        pos = data.draw(st.integers(8, len(buf) - 1))
        how = data.draw(st.sampled_from(["byte", "u32", "u16"]))
        if how == "byte":
            buf[pos] = data.draw(st.integers(0, 255))
        else:
            fmt, size = ("<I", 4) if how == "u32" else ("<H", 2)
            pos = min(pos, len(buf) - size)
            value = data.draw(st.sampled_from([0, 1, 2, 3, 4, 0x7F, 0xFF, 0xFFFF, 0x7FFFFFFF, 0xFFFFFFFF,
                                               len(buf), len(buf) - pos, data.draw(st.integers(0, 2**16))]))
            struct.pack_into(fmt, buf, pos, value & (0xFFFFFFFF if size == 4 else 0xFFFF))
    return bytes(buf)


_MALFORMED = "m.pt2b: program section is malformed: "


def _refusal(buf) -> str | None:
    """The verifier's message for ``buf`` without the common prefix, or None when it accepts."""
    try:
        buffer_bounds.check_buffer(buf, "m.pt2b")
    except CorruptArtifactError as e:
        msg = str(e)
        assert msg.startswith(_MALFORMED) and msg.endswith("."), msg
        return msg[len(_MALFORMED):-1]
    return None


_DAMAGE = ("lies outside", "misaligned", "vtable", "table size", "NUL-terminated", "not a value of enum",
           "referenced more often", "nested deeper")


_PLACE = re.compile(r"(\.\w+|\[\d+\])")


def _assert_names_a_place(why: str) -> None:
    """The refusal starts with a place in the program (``Program.tensors[0].kind``) that exists in
    the schema's layout, then says which kind of damage is there."""
    lay = fbs.layout()
    assert why.startswith(lay.root), why
    rest, at = why[len(lay.root):], ("table", lay.root)  # what the place reached so far is
    while (m := _PLACE.match(rest)):
        part, rest = m.group(1), rest[m.end():]
        if part.startswith("["):  # an element of a vector
            assert at[0] == "vector", why
            at = ("table", at[1].type) if at[1].elem == "table" else ("element", None)
            continue
        assert at[0] == "table", why
        fields = [f for f in lay.tables[at[1]] if f.name == part[1:]]
        assert fields, f"{why}: {at[1]} has no field {part[1:]}"
        f = fields[0]
        at = ("table", f.type) if f.kind == "table" else (f.kind, f)
    assert rest.startswith((" ", ":")) and any(k in rest for k in _DAMAGE), why
    typed = re.match(r" \((\w+)\)", rest)  # a table's own damage names its type
    assert typed is None or at == ("table", typed.group(1)), why


@settings(max_examples=1000, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                    HealthCheck.too_slow])
@given(data=st.data())
def test_whatever_the_verifier_accepts_unpacks_and_every_refusal_names_a_place(pristine, data):
    """Soundness: a mutated buffer is either refused, with a message naming the place of the damage,
    or unpacked without error, identically by flatc's own object API and by unpack_tables."""
    buf = _mutated(pristine, data)
    why = _refusal(buf)
    if why is not None:
        _assert_names_a_place(why)  # (the mutations leave the root offset and identifier alone)
        return
    _same_tree(unpack_tables.unpack_program(buf), G.ProgramT.InitFromPackedBuf(buf, 0))


def test_single_byte_damage_is_refused_with_its_place(pristine):
    """Single-byte changes across the first 3 kB (every other byte): many are refused, each refusal
    in the one form (``<where>: program section is malformed: <place> <damage>.``) and of many kinds;
    what is accepted the reader's unpacker reads."""
    refused, kinds = 0, set()
    for pos in range(8, min(len(pristine), 3072), 2):
        for value in (0x00, 0xFF):
            buf = bytearray(pristine)
            buf[pos] = value
            buf = bytes(buf)
            why = _refusal(buf)
            if why is None:
                unpack_tables.unpack_program(buf)
                continue
            _assert_names_a_place(why)
            kinds.update(k for k in _DAMAGE if k in why)
            refused += 1
    assert refused > 100
    assert len(kinds) >= 5, kinds  # bounds, alignment, vtables, strings, enums...


def _same_tree(a, b, path="program"):
    """Object-API trees equal attribute for attribute (types, order, numpy dtypes and values)."""
    assert type(a) is type(b), f"{path}: {type(a).__name__} vs {type(b).__name__}"
    if isinstance(a, np.ndarray):
        assert a.dtype == b.dtype and np.array_equal(a, b, equal_nan=a.dtype.kind == "f"), path
    elif isinstance(a, list):
        assert len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b)):
            _same_tree(x, y, f"{path}[{i}]")
    elif hasattr(a, "__dict__"):
        assert list(vars(a)) == list(vars(b)), path
        for k in vars(a):
            _same_tree(vars(a)[k], vars(b)[k], f"{path}.{k}")
    else:
        assert a == b or (a != a and b != b), f"{path}: {a!r} vs {b!r}"


def test_unpack_tables_equals_the_object_api_on_every_golden(tmp_path):
    """reader.open_artifact unpacks with unpack_tables; it must build exactly what flatc's code builds."""
    paths = sorted(GOLDEN.rglob("*.pt2b"))
    assert len(paths) >= 40
    case = make_case("dtypes")  # scalars and tensors of every dtype
    export_model(case.model, case.args, tmp_path / "dtypes.pt2b")
    for p in paths + [tmp_path / "dtypes.pt2b"]:
        buf = _program_bytes(p)
        _same_tree(unpack_tables.unpack_program(buf), G.ProgramT.InitFromPackedBuf(buf, 0), str(p))


def test_decode_schema_equals_the_oracle_on_every_golden(tmp_path):
    """reader.decode_graph reads the graph straight from the buffer (decode_schema); it must give the
    schema tree that flatc's object API and the oracle decoding that (tests/support/oracle_codec.py) give."""
    from torch._export.serde import schema as S

    paths = sorted(GOLDEN.rglob("*.pt2b"))
    for name in ("dtypes", "dynamic_shapes", "cond", "pytree_io"):  # every dtype, symbols, subgraphs, pytrees
        case = make_case(name)
        export_model(case.model, case.args, tmp_path / f"{name}.pt2b", kwargs=case.kwargs,
                     dynamic_shapes=case.dynamic_shapes)
        paths.append(tmp_path / f"{name}.pt2b")
    for p in paths:
        art = reader.open_artifact(p)
        graph = art.program.exportedProgram
        assert isinstance(graph, unpack_tables.TableRef)
        ours = decode_schema.read(graph.buf, graph.pos, S.ExportedProgram, str(p))
        theirs = oracle_codec.decode(S.ExportedProgram, G.ExportedProgramT.InitFromBuf(graph.buf, graph.pos),
                                     str(p))
        assert ours == theirs, p
        assert repr(ours) == repr(theirs), p  # also int vs bool vs float, which == would let pass
        assert reader.decode_graph(art) == ours


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                   HealthCheck.too_slow])
@given(data=st.data())
def test_decode_schema_agrees_with_the_oracle_on_damaged_buffers(pristine, data):
    """On any buffer the verifier accepts, the direct decode and the oracle's decode of flatc's
    object API give the same tree or the same typed refusal (bad UTF-8, unknown enum value or
    union tag, missing required table)."""
    from torch._export.serde import schema as S

    buf = _mutated(pristine, data)
    try:
        buffer_bounds.check_buffer(buf, "m.pt2b")
    except CorruptArtifactError:
        return
    graph = unpack_tables.unpack_program(buf, lazy=("exportedProgram",)).exportedProgram
    if graph is None:
        return

    def outcome(fn):
        try:
            return repr(fn())
        except CorruptArtifactError as e:
            return f"refused: {e}"

    assert outcome(lambda: decode_schema.read(graph.buf, graph.pos, S.ExportedProgram, "m")) == \
        outcome(lambda: oracle_codec.decode(S.ExportedProgram,
                                            G.ExportedProgramT.InitFromBuf(graph.buf, graph.pos), "m"))


def test_decode_graph_of_a_tree_set_in_memory(artifact):
    """A graph set on an opened artifact in memory (an object-API tree, or encode_schema.Packed)
    decodes through the same path; an absent one is a missing required table."""
    from exporter.serialize.write import encode_schema

    art = reader.open_artifact(artifact)
    ep = reader.decode_graph(art)
    for tree in (encode_schema.Packed(ep), oracle_codec.encode(ep), art.program.exportedProgram.unpack()):
        art.program.exportedProgram = tree
        assert reader.decode_graph(art) == ep
    art.program.exportedProgram = None
    with pytest.raises(CorruptArtifactError, match="a required ExportedProgram table is missing"):
        reader.decode_graph(art)
