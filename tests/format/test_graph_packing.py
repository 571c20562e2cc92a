"""What a save spends on the graph, made cheaper without changing a byte: the writer's flatbuffers Builder
(exporter/serialize/write/builder.py) writes the library's bytes (random sequences of strings, vectors and
tables built through both from small buffers, so both grow; whole programs packed through both; the
library's errors for misuse), and torch's serializer formats no graph code for a debug line it drops."""

from __future__ import annotations

import contextlib

import flatbuffers
import flatbuffers.number_types as N
import numpy as np
import pytest
import torch
from flatbuffers.builder import IsNestedError, IsNotNestedError, OffsetArithmeticError
from hypothesis import given, settings
from hypothesis import strategies as st

from exporter import export_model, load
from exporter.layout.container import FILE_IDENTIFIER
from exporter.serialize.read import reader
from exporter.serialize.write import encode_schema
from exporter.serialize.write.builder import Builder
from tools.corpus.zoo import make_case

_SCALARS = [N.BoolFlags, N.Int8Flags, N.Uint8Flags, N.Int16Flags, N.Uint16Flags, N.Int32Flags, N.Uint32Flags,
            N.Int64Flags, N.Uint64Flags, N.Float32Flags, N.Float64Flags]


def _scalar(draw, flags):
    if flags is N.BoolFlags:
        return draw(st.booleans())
    if flags in (N.Float32Flags, N.Float64Flags):
        return draw(st.floats(width=32 if flags is N.Float32Flags else 64, allow_nan=False))
    return draw(st.integers(flags.min_val, flags.max_val))


@st.composite
def _plans(draw):
    """A build plan: ("string", text) | ("numbers", dtype, values) | ("offsets", [object index]) |
    ("table", nfields, [(slot, flags or None, scalar or object index)], whole)."""
    plan, objects = [], 0
    for _ in range(draw(st.integers(1, 40))):
        kind = draw(st.sampled_from(["string", "numbers", "offsets", "table"]) if objects else
                    st.sampled_from(["string", "numbers", "table"]))
        if kind == "string":
            plan.append(("string", draw(st.text(max_size=40))))
        elif kind == "numbers":
            dtype = draw(st.sampled_from(["int8", "int32", "int64", "float32", "float64", "uint8"]))
            plan.append(("numbers", dtype, draw(st.lists(st.integers(0, 100), max_size=12))))
        elif kind == "offsets":
            plan.append(("offsets", draw(st.lists(st.integers(0, objects - 1), max_size=8))))
        else:
            nfields = draw(st.integers(0, 12))
            slots = []
            for slot in draw(st.permutations(list(range(nfields)))):
                if draw(st.booleans()):
                    continue  # an absent field
                if objects and draw(st.booleans()):
                    slots.append((slot, None, draw(st.integers(0, objects - 1))))
                else:
                    flags = draw(st.sampled_from(_SCALARS))
                    slots.append((slot, flags, _scalar(draw, flags)))
            plan.append(("table", nfields, slots, draw(st.booleans())))
        objects += 1
    return plan, draw(st.integers(1, 64)), draw(st.booleans())


def _build(builder, plan, identifier: bool, fast: bool) -> bytes:
    """The plan's bytes: through the library's calls, or (``fast``) the writer's one-call tables and
    offset vectors where the plan says so."""
    offsets = []
    for step in plan:
        if step[0] == "string":
            offsets.append(builder.CreateString(step[1]))
        elif step[0] == "numbers":
            offsets.append(builder.CreateNumpyVector(np.array(step[2], dtype=step[1])))
        elif step[0] == "offsets":
            refs = [offsets[i] for i in step[1]]
            if fast:
                offsets.append(builder.offsets(refs))
            else:
                builder.StartVector(4, len(refs), 4)
                for off in reversed(refs):
                    builder.PrependUOffsetTRelative(off)
                offsets.append(builder.EndVector())
        else:
            _, nfields, slots, whole = step
            slots = [(s, f, offsets[v] if f is None else v) for s, f, v in slots]
            if fast and whole:
                offsets.append(builder.table(nfields, slots))
                continue
            offsets.append(encode_schema.table_by_calls(builder, nfields, slots))
    builder.Finish(offsets[-1], file_identifier=FILE_IDENTIFIER if identifier else None)
    return bytes(builder.Output())


@settings(max_examples=400, deadline=None)
@given(_plans())
def test_random_buffers_are_the_librarys_bytes(case):
    plan, size, identifier = case
    expected = _build(flatbuffers.Builder(size), plan, identifier, fast=False)
    assert _build(Builder(size), plan, identifier, fast=False) == expected
    assert _build(Builder(size), plan, identifier, fast=True) == expected


@pytest.mark.parametrize("name", ["cond", "transformer_decoder", "dtypes"])
def test_a_written_program_is_what_the_librarys_builder_packs(tmp_path, name):
    """The program section export_model wrote is byte for byte what the library's Builder packs from the
    same tables in the writer's order (each graph first, then the Program table)."""
    case = make_case(name)
    path = tmp_path / "m.pt2b"
    export_model(case.model, case.args, path=path, kwargs=case.kwargs, dynamic_shapes=case.dynamic_shapes)
    art = reader.open_artifact(path)
    try:
        h = art.header
        written = bytes(art.mm[h.program_offset:h.program_offset + h.program_size])
        prog = art.program
        prog.exportedProgram = encode_schema.Packed(reader.decode_graph(art))
        builder = flatbuffers.Builder(1 << 16)
        prog.exportedProgram.pack_early(builder)
        builder.Finish(prog.Pack(builder), file_identifier=FILE_IDENTIFIER)
        assert bytes(builder.Output()) == written
    finally:
        art.mm.close()


def test_misuse_fails_as_the_librarys_builder_does():
    for make in (flatbuffers.Builder, Builder):
        b = make(8)
        b.StartObject(2)
        with pytest.raises(IsNestedError):
            b.CreateString("x")
        with pytest.raises(IsNestedError):
            b.StartVector(4, 1, 4)
        b.EndObject()
        with pytest.raises(IsNotNestedError):
            b.EndObject()
        with pytest.raises(IsNotNestedError):
            b.Slot(0)
        with pytest.raises(OffsetArithmeticError):
            b.PrependUOffsetTRelative(10_000)
        b.StartObject(1)
        with pytest.raises(TypeError, match="bad number 300"):
            b.Prepend(N.Int8Flags, 300)
    b = Builder(8)
    b.StartObject(1)
    with pytest.raises(IsNestedError):
        b.table(1, [])
    b.EndObject()
    with pytest.raises(OffsetArithmeticError):
        b.table(1, [(0, None, 10_000)])
    with pytest.raises(OffsetArithmeticError):
        Builder(8).offsets([10_000])


def test_the_writer_packs_through_it(tmp_path, monkeypatch):
    """export_model's program goes through the writer's Builder (a change that dropped it would leave the
    tests above passing and the save slower)."""
    made = []

    class Counting(Builder):
        def __init__(self, *a):
            made.append(self)
            super().__init__(*a)

    from exporter.serialize.write import writer

    monkeypatch.setattr(writer, "Builder", Counting)
    case = make_case("mlp")
    export_model(case.model, case.args, path=tmp_path / "m.pt2b")
    assert len(made) == 1
    x = case.args[0]
    torch.testing.assert_close(load(tmp_path / "m.pt2b")(x), case.model(x))


class _Branches(torch.nn.Module):
    def forward(self, x):
        return torch.cond(x.sum() > 0, lambda t: t.sin(), lambda t: t.cos(), (x,))


def test_serializing_formats_no_graph_code_unless_torch_logs_it(tmp_path, monkeypatch, caplog):
    """torch's serialize_graph passes gm.print_readable() to log.debug: outside a debug log the writer
    shadows it on the graph modules (subgraphs too) for the serialization only; with torch's serializer
    logging at DEBUG, the code is formatted and logged as torch does."""
    import logging

    from exporter._torch.serializer import unprinted

    ep = torch.export.export(_Branches(), (torch.randn(3),))
    gms = [m for m in ep.graph_module.modules() if isinstance(m, torch.fx.GraphModule)]
    assert len(gms) == 3
    calls = []
    real = torch.fx.GraphModule.print_readable
    monkeypatch.setattr(torch.fx.GraphModule, "print_readable",
                        lambda self, *a, **k: calls.append(self) or real(self, *a, **k))
    export_model(ep, path=tmp_path / "a.pt2b")
    assert calls == []
    assert all("print_readable" not in vars(m) for m in gms)  # the shadows are gone
    with unprinted(ep.graph_module):
        assert [m.print_readable(print_output=False) for m in gms] == ["", "", ""]
    assert "def forward" in ep.graph_module.print_readable(print_output=False)
    calls.clear()
    with caplog.at_level(logging.DEBUG, logger="torch._export.serde.serialize"):
        export_model(ep, path=tmp_path / "b.pt2b")
    assert len(calls) == 3 and "[serialize_graph]" in caplog.text and "def forward" in caplog.text
    x = torch.randn(3)
    torch.testing.assert_close(load(tmp_path / "a.pt2b")(x), ep.module()(x))


@pytest.mark.parametrize("name", ["cond", "transformer_decoder", "dtypes"])
def test_torchs_serializer_makes_the_same_program_with_the_writers_unions(name, monkeypatch):
    """Issue 69: the writer runs torch's serializer with its schema's unions made by
    _torch/serializer._fast_create (about half of the serializer's time went to torch's own create): the
    serialized program is equal to the one torch's create makes, torch's create is not called on the way,
    it is back in place after, and misuse fails as torch's does."""
    from torch._export.serde import schema as S
    from torch._export.serde.union import _Union

    from exporter._torch import serializer
    from exporter.serialize.write import writer

    case = make_case(name)
    ep = torch.export.export(case.model, case.args, case.kwargs or {}, dynamic_shapes=case.dynamic_shapes)
    own = _Union.__dict__["create"]
    with monkeypatch.context() as m:
        m.setattr(serializer, "fast_unions", contextlib.nullcontext)
        want = writer._serialize_program(ep)
    calls = []
    monkeypatch.setattr(_Union, "create", classmethod(lambda cls, **k: calls.append(cls) or own.__func__(cls, **k)))
    patched = _Union.__dict__["create"]
    got = writer._serialize_program(ep)
    assert got == want and calls == [] and _Union.__dict__["create"] is patched
    monkeypatch.undo()
    assert _Union.__dict__["create"] is own
    with serializer.fast_unions():
        with pytest.raises(AssertionError, match="expected exactly 1 kwarg, got 2"):
            S.Argument.create(as_int=1, as_float=1.0)
        with pytest.raises(TypeError, match="unexpected keyword argument 'as_nothing'"):
            S.Argument.create(as_nothing=1)
        assert S.Argument.create(as_int=3) == own.__func__(S.Argument, as_int=3)
