"""The model zoo (tools/corpus/zoo.py: MLP, CNN+BN, RNNs, transformers, buffer mutation, pytrees,
kwargs, dynamic shapes, cond/map/while_loop, custom op, tied weights, dtypes, in-place ops)
round-trips through .pt2b: graph node by node, outputs bitwise, close to eager."""

import copy

import pytest
import torch

from exporter import export_model, load
from tools.corpus.zoo import make_case, zoo_names
from exporter.versioning.formats import FORMAT_VERSION
from tests.support.helpers import assert_bitwise, assert_close_to_eager, assert_programs_equal

INPLACE = {torch.ops.aten.add_.Tensor, torch.ops.aten.mul_.Tensor, torch.ops.aten.copy_.default}


def test_zoo_is_big_enough():
    assert len(zoo_names()) >= 12


@pytest.mark.parametrize("name", zoo_names())
def test_zoo_roundtrip(tmp_path, name):
    case = make_case(name)
    kwargs = case.kwargs or {}
    eager_model = copy.deepcopy(case.model)
    with torch.no_grad():
        eager = eager_model(*copy.deepcopy(case.args), **copy.deepcopy(kwargs))
    path = tmp_path / f"{name}.pt2b"
    ep = export_model(copy.deepcopy(case.model), case.args, path, kwargs=case.kwargs,
                      dynamic_shapes=case.dynamic_shapes, strict=case.strict)
    prog = load(path, verify=True)
    assert_programs_equal(ep, prog.exported_program())
    ops = {n.target for n in prog.exported_program().graph.nodes if n.op == "call_function"}
    original_ops = {n.target for n in ep.graph.nodes if n.op == "call_function"}
    assert ops == original_ops  # nothing decomposed, in-place ops kept
    out = prog(*copy.deepcopy(case.args), **copy.deepcopy(kwargs))
    ref = ep.module()(*copy.deepcopy(case.args), **copy.deepcopy(kwargs))
    assert_bitwise(out, ref)
    assert_close_to_eager(out, eager, rtol=case.rtol, atol=case.atol)
    # buffers mutated by the call end up where eager puts them
    eager_buffers = dict(eager_model.named_buffers())
    for k, b_out in prog.module().named_buffers():
        if k in eager_buffers:  # float8 has no arithmetic for assert_close: compare its bits
            b_eager = eager_buffers[k]
            if b_out.dtype.itemsize == 1 and b_out.is_floating_point():
                assert_bitwise(b_out, b_eager)
            else:
                torch.testing.assert_close(b_out, b_eager, rtol=case.rtol, atol=case.atol, msg=k)


@pytest.mark.parametrize("name", zoo_names())
def test_writer_serializes_what_torchs_serializer_does(name):
    """writer.serialize_graph builds torch's schema tree from torch's own pieces without the
    serializer's discarded canonicalization self-test: the result must be the same tree."""
    from exporter._torch import compat as torch_compat
    from exporter.serialize import writer

    case = make_case(name)
    ep = torch.export.export(case.model, case.args, case.kwargs or {}, dynamic_shapes=case.dynamic_shapes,
                             strict=case.strict)
    theirs = torch_compat.torch_serialized_program(ep)
    assert writer.serialize_graph(ep) == theirs


@pytest.mark.parametrize("name", ["buffer_mutation", "inplace_ops"])
def test_inplace_ops_stay_in_graph(tmp_path, name):
    case = make_case(name)
    path = tmp_path / "m.pt2b"
    export_model(case.model, case.args, path, kwargs=case.kwargs, dynamic_shapes=case.dynamic_shapes)
    prog = load(path)
    assert INPLACE & {n.target for n in prog.exported_program().graph.nodes}
    assert any(name.startswith("aten::add_") or name.startswith("aten::mul_") for name in prog.ops())


def test_custom_op_recorded_with_schema_and_missing_op_error(tmp_path, monkeypatch):
    case = make_case("custom_op")
    path = tmp_path / "m.pt2b"
    export_model(case.model, case.args, path)
    prog = load(path)
    custom = [op for op in prog.operators if op.kind == "custom"]
    assert [op.qualified_name for op in custom] == ["pt2b_zoo::scaled_add"]
    assert custom[0].schema == str(torch.ops.pt2b_zoo.scaled_add.default._schema)
    from exporter.errors import MissingOperatorError
    from exporter.versioning import op_table

    real = op_table.resolve
    monkeypatch.setattr(op_table, "resolve", lambda q, o: None if q.startswith("pt2b_zoo::") else real(q, o))
    with pytest.raises(MissingOperatorError, match="pt2b_zoo::scaled_add.default.*'pt2b_zoo' library"):
        load(path)


def test_exported_program_given_is_written_as_given(tmp_path):
    case = make_case("mlp")
    ep = torch.export.export(case.model, case.args, dynamic_shapes=case.dynamic_shapes)
    core = ep.run_decompositions()
    export_model(core, path=tmp_path / "core.pt2b")
    prog = load(tmp_path / "core.pt2b")
    assert prog.ir_level == "aten"
    assert prog.provenance["captured_by"].startswith("user")
    assert_programs_equal(core, prog.exported_program())


def test_example_inputs_metadata_and_op_table(tmp_path):
    case = make_case("pytree_io")
    path = tmp_path / "m.pt2b"
    ep = export_model(case.model, case.args, path, kwargs=case.kwargs, metadata={"owner": "team-a", "rev": 3,
                                                                                 "tags": ["x", 1.5, None]})
    prog = load(path)
    assert_bitwise(prog.exported_program().example_inputs, ep.example_inputs)
    assert prog.metadata == {"owner": "team-a", "rev": 3, "tags": ["x", 1.5, None]}
    counts = {}
    for n in ep.graph.nodes:
        if n.op == "call_function" and isinstance(n.target, torch._ops.OpOverload):
            key = f"{n.target._schema.name}.{n.target._overloadname}"
            counts[key] = counts.get(key, 0) + 1
    assert {k: v for k, v in prog.ops().items() if k.startswith("aten::")} == counts
    assert prog.torch_version == torch.__version__ and prog.format_version == FORMAT_VERSION


def test_bad_metadata_is_a_clear_error(tmp_path):
    from exporter.errors import ExportError

    case = make_case("mlp")
    with pytest.raises(ExportError, match="metadata cannot be stored"):
        export_model(case.model, case.args, tmp_path / "m.pt2b", metadata={"obj": object()})
    with pytest.raises(ExportError, match="metadata must be a dict with str keys"):
        export_model(case.model, case.args, tmp_path / "m.pt2b", metadata={1: "a"})
    assert not (tmp_path / "m.pt2b").exists()


def _meta_signature(v):
    if isinstance(v, torch.Tensor):
        return (type(v).__name__, tuple(map(str, v.shape)), tuple(map(str, v.stride())), v.dtype, v.device,
                v.requires_grad, v.storage_offset())
    if isinstance(v, (list, tuple)):
        return tuple(_meta_signature(x) for x in v)
    return (type(v).__name__, str(v))


@pytest.mark.parametrize("name", zoo_names())
def test_fast_tensor_meta_equals_torchs_deserializer(tmp_path, name):
    """exporter/serialize/read/deserialize.py builds static CPU fake tensors directly instead of through
    a fake dispatch of empty_strided: every node's meta['val'] (type, sizes, strides, dtype, device,
    requires_grad), the generated code and the fake mode sharing must equal torch's deserializer's;
    so must every other meta entry (module stacks are split once per distinct text), in the same order,
    with module-stack dicts shared between nodes exactly where torch's are."""
    from torch._export.serde.serialize import ExportedProgramDeserializer

    from exporter.serialize import reader
    from exporter.serialize.read import deserialize

    case = make_case(name)
    path = tmp_path / f"{name}.pt2b"
    ep = export_model(copy.deepcopy(case.model), case.args, path, kwargs=case.kwargs,
                      dynamic_shapes=case.dynamic_shapes, strict=case.strict)
    serialized = reader.decode_graph(reader.open_artifact(path))
    ours = deserialize.deserialize_program(serialized, ep.state_dict, ep.constants, None)
    theirs = ExportedProgramDeserializer().deserialize(serialized, ep.state_dict, ep.constants, None)
    assert ours.graph_module.code == theirs.graph_module.code
    modes, stacks = set(), []
    for a, b in zip(ours.graph.nodes, theirs.graph.nodes, strict=True):
        va, vb = a.meta.get("val"), b.meta.get("val")
        assert _meta_signature(va) == _meta_signature(vb), a.name
        assert list(a.meta) == list(b.meta), a.name
        assert {k: v for k, v in a.meta.items() if k != "val"} == {k: v for k, v in b.meta.items() if k != "val"}
        if "nn_module_stack" in a.meta:
            stacks.append((id(a.meta["nn_module_stack"]), id(b.meta["nn_module_stack"])))
        for v in va if isinstance(va, (list, tuple)) else [va]:
            if isinstance(v, torch.Tensor):
                modes.add(id(v.fake_mode))
    assert len(modes) <= 1  # one FakeTensorMode for the whole graph, as in torch's
    assert len(set(stacks)) == len({o for o, _ in stacks}) == len({t for _, t in stacks})
    assert ours.range_constraints == theirs.range_constraints


@pytest.mark.parametrize("name", zoo_names())
def test_encode_schema_writes_the_object_apis_bytes(name):
    """The writer packs torch's schema tree straight into the builder (serialize/write/encode_schema.py):
    the program table must be byte for byte what flatc's object API writes for the tree the oracle
    (tests/support/oracle_codec.py) builds, packed through the library's Builder; the writer's own Builder
    (serialize/write/builder.py) packs it."""
    import flatbuffers
    from tests.support import oracle_codec

    from exporter.serialize import writer
    from exporter.serialize.write import encode_schema
    from exporter.serialize.write.builder import Builder

    case = make_case(name)
    ep = torch.export.export(copy.deepcopy(case.model), case.args, case.kwargs or {},
                             dynamic_shapes=case.dynamic_shapes, strict=case.strict)
    serialized = writer.serialize_graph(ep)
    reference, ours = flatbuffers.Builder(1024), Builder(16)  # (ours grows from a small buffer)
    reference.Finish(oracle_codec.encode(serialized).Pack(reference))
    ours.Finish(encode_schema.pack(ours, serialized))
    assert bytes(ours.Output()) == bytes(reference.Output())
