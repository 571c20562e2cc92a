"""Tensor-subclass weights in an ExportedProgram (torch's TwoTensor, a subclass whose ops give plain
tensors, nested subclasses) are written as their inner tensors plus the name their class is
registered under, and rebuilt on load only from a class the reading process registered: the loaded
program computes what eager and torch's own save/load compute, bit for bit. An unregistered class
is refused on write and on read with the way to register it."""

from __future__ import annotations

import pytest
import torch
from torch.testing._internal.two_tensor import TwoTensor

import exporter
from exporter import export_model, load, load_for_backend
from exporter.errors import CorruptArtifactError, ExportError, MissingTensorSubclassError, UnsupportedValueError
from exporter.layout.generated import pt2b_generated as G
from exporter.tensor_subclasses import register_tensor_subclass, unregister
from tests.support.artifact_surgery import rewrite_artifact
from tools.corpus.subclasses import NAME, ScaledTensor
from tools.corpus.subclasses import ScaledLinear as _ScaledLinear


@pytest.fixture
def registered():
    register_tensor_subclass(TwoTensor)
    register_tensor_subclass(ScaledTensor, name=NAME)  # tools.corpus.subclasses registers it on import
    yield
    unregister(TwoTensor)
    register_tensor_subclass(ScaledTensor, name=NAME)


class _TwoTensorWeights(torch.nn.Module):
    """A parameter, a buffer and a non-persistent buffer (a constant of the program), each a TwoTensor;
    the output is one too."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.p = torch.nn.Parameter(TwoTensor(torch.randn(3, 3), torch.randn(3, 3)))
        self.register_buffer("b", TwoTensor(torch.ones(3), torch.full((3,), 2.0)))
        self.register_buffer("c", TwoTensor(torch.arange(3.0), torch.arange(3.0) * -1), persistent=False)

    def forward(self, x):
        return x @ self.p + self.b * self.c


class _Nested(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(2)
        inner = [torch.randn(2, 2) for _ in range(4)]
        self.p = torch.nn.Parameter(TwoTensor(TwoTensor(inner[0], inner[1]), TwoTensor(inner[2], inner[3])))

    def forward(self, x):
        return x * self.p


def _leaves(t):
    if type(t) in (torch.Tensor, torch.nn.Parameter):
        return [t]
    attrs, _ = t.__tensor_flatten__()
    return [x for a in attrs for x in _leaves(getattr(t, a))]


def _assert_same(a, b):
    assert type(a) is type(b)
    la, lb = _leaves(a), _leaves(b)
    assert len(la) == len(lb) and all(torch.equal(x, y) for x, y in zip(la, lb))


@pytest.mark.parametrize("make, x", [(_TwoTensorWeights, torch.randn(2, 3)), (_ScaledLinear, torch.randn(3, 5)),
                                     (_Nested, torch.randn(2, 2))], ids=["two-tensor", "plain-outputs", "nested"])
def test_subclass_weights_round_trip_and_compute_like_eager_and_torchs_load(registered, tmp_path, make, x):
    m = make()
    ep = torch.export.export(m, (x,))
    path = tmp_path / "m.pt2b"
    export_model(ep, path)
    prog = load(path)
    loaded = prog.exported_program()
    for name, value in (*ep.state_dict.items(), *ep.constants.items()):
        got = loaded.state_dict.get(name, loaded.constants.get(name))
        _assert_same(got, value)
    expected = m(x)
    _assert_same(prog(x), expected)
    torch.export.save(ep, tmp_path / "m.pt2")
    _assert_same(prog(x), torch.export.load(tmp_path / "m.pt2").module()(x))
    lowered = load_for_backend(path, "core", cache=False)
    _assert_same(lowered(x), expected)


def test_a_parameter_keeps_requires_grad_and_parameter_type(registered, tmp_path):
    m = _TwoTensorWeights()
    export_model(torch.export.export(m, (torch.randn(2, 3),)), tmp_path / "m.pt2b")
    p = load(tmp_path / "m.pt2b").exported_program().state_dict["p"]
    assert isinstance(p, torch.nn.Parameter) and isinstance(p, TwoTensor) and p.requires_grad


def test_an_unregistered_subclass_is_refused_on_write_with_the_way_to_register_it(registered, tmp_path):
    ep = torch.export.export(_ScaledLinear(), (torch.randn(3, 5),))
    unregister(ScaledTensor)
    with pytest.raises(UnsupportedValueError, match=r"'w' is a tensor subclass, .*ScaledTensor \(it wraps the tensors "
                                                    r"data_\), and no name is registered for it: call "
                                                    r"exporter\.register_tensor_subclass\(ScaledTensor\)"):
        export_model(ep, tmp_path / "m.pt2b")
    assert not list(tmp_path.iterdir())


def test_a_file_naming_a_class_this_process_did_not_register_is_refused_naming_it(registered, tmp_path):
    export_model(torch.export.export(_ScaledLinear(), (torch.randn(3, 5),)), tmp_path / "m.pt2b")
    unregister(ScaledTensor)
    with pytest.raises(MissingTensorSubclassError, match=r"the weight 'w' is a tensor subclass stored as "
                                                         r"'pt2b\.corpus\.ScaledTensor', and no class is registered under "
                                                         r"that name.*never imports a class named by a file"):
        load(tmp_path / "m.pt2b").exported_program()
    register_tensor_subclass(ScaledTensor, name=NAME)
    x = torch.randn(3, 5)
    assert torch.equal(load(tmp_path / "m.pt2b")(x), _ScaledLinear()(x))


def test_the_registry_refuses_a_name_or_class_taken_and_a_class_without_the_flatten_protocol(registered):
    assert exporter.register_tensor_subclass is register_tensor_subclass
    register_tensor_subclass(TwoTensor)  # the same pair again: a no-op
    with pytest.raises(ValueError, match=r"'pt2b\.corpus\.ScaledTensor' is already registered for ScaledTensor"):
        register_tensor_subclass(TwoTensor, name=NAME)
    with pytest.raises(ValueError, match=r"TwoTensor is already registered as 'torch\.testing\._internal\.two_tensor"):
        register_tensor_subclass(TwoTensor, name="other.Name")

    class NoFlatten(torch.Tensor):
        pass

    with pytest.raises(TypeError, match=r"NoFlatten has no __tensor_flatten__ or __tensor_unflatten__"):
        register_tensor_subclass(NoFlatten)
    with pytest.raises(TypeError, match="takes a subclass of torch.Tensor"):
        register_tensor_subclass(int)
    unregister(TwoTensor)
    with pytest.raises(ValueError, match="a dotted Python name"):
        register_tensor_subclass(TwoTensor, name="bad name")


def test_a_context_pt2b_cannot_store_is_refused_naming_its_type(registered, tmp_path):
    class Opaque:
        pass

    m = _ScaledLinear()
    w = m.w
    ep = torch.export.export(m, (torch.randn(3, 5),))
    original = ScaledTensor.__tensor_flatten__
    ScaledTensor.__tensor_flatten__ = lambda self: (["data_"], {"scale": Opaque()})
    try:
        with pytest.raises(UnsupportedValueError, match=r"tensor subclass 'w': its flatten context holds a "
                                                        r".*Opaque, which \.pt2b does not store"):
            export_model(ep, tmp_path / "m.pt2b")
    finally:
        ScaledTensor.__tensor_flatten__ = original
    assert w is m.w and not list(tmp_path.iterdir())


def test_format_1_3_cannot_hold_subclass_weights(registered, tmp_path):
    ep = torch.export.export(_ScaledLinear(), (torch.randn(3, 5),))
    with pytest.raises(ExportError, match=r"format 1\.3 cannot hold this program: Program\.tensor_subclasses "
                                          r"\(tensor-subclass weights .*added in 1\.4\)"):
        export_model(ep, tmp_path / "m.pt2b", format_version="1.3")


def _edited(tmp_path, edit):
    src = tmp_path / "m.pt2b"
    export_model(torch.export.export(_Nested(), (torch.randn(2, 2),)), src)
    return rewrite_artifact(src, tmp_path / "bad.pt2b", edit=lambda _s, prog: edit(prog))


@pytest.mark.parametrize("edit, message", [
    (lambda p: setattr(p.tensorSubclasses[-1], "parts", [b"p.a", b"p.a"]), "lists 2 attributes|names the part"),
    (lambda p: setattr(p.tensorSubclasses[-1], "parts", [b"p.a", b"x.y"]), r"names the part 'x\.y'"),
    (lambda p: p.tensorSubclasses.reverse(), r"names the part 'p\.a'"),  # a parent before its parts: no cycles
    (lambda p: setattr(p.tensorSubclasses[0], "className", b"os.system(1)"), "is not a dotted class name"),
    (lambda p: setattr(p.tensorSubclasses[0], "context", list(b"\xc1")), "malformed flatten context"),
    (lambda p: setattr(p.tensorSubclasses[0], "context", list(b"\x81\xa3set\x90")), "a value pt2b does not write"),
    (lambda p: setattr(p.tensorSubclasses[-1], "sizes", [-1, 2]), r"tensor subclass 'p' has the invalid size"),
    (lambda p: p.tensorSubclasses.pop(0), "belong to no tensor subclass|names the part"),
    (lambda p: setattr(p.tensorSubclasses[-1], "kind", 9), "kind: 9 is not a value of enum TensorKind"),
], ids=["part-twice", "missing-part", "parent-first", "class-name", "bad-msgpack", "unknown-tag", "size",
        "orphan-parts", "kind"])
def test_a_damaged_subclass_record_is_a_corrupt_artifact_error(registered, tmp_path, edit, message):
    bad = _edited(tmp_path, edit)
    with pytest.raises(CorruptArtifactError, match=message):
        load(bad).exported_program()


def test_subclass_parts_are_weights_of_their_own_kind(registered, tmp_path):
    export_model(torch.export.export(_Nested(), (torch.randn(2, 2),)), tmp_path / "m.pt2b")
    from exporter.serialize import reader

    art = reader.open_artifact(tmp_path / "m.pt2b")
    try:
        kinds = {reader.text(r.name): r.kind for r in art.program.tensors if r.kind != G.TensorKind.EXAMPLE_INPUT}
        records = [(reader.text(r.name), reader.text(r.className)) for r in art.program.tensorSubclasses]
    finally:
        art.mm.close()
    assert kinds == {f"p.{a}.{b}": G.TensorKind.SUBCLASS_PART for a in "ab" for b in "ab"}
    two = "torch.testing._internal.two_tensor.TwoTensor"
    assert records == [("p.a", two), ("p.b", two), ("p", two)]  # the parts before the subclass they make


def test_lowering_computes_the_subclass_arithmetic_over_plain_inner_tensors(tmp_path):
    """As torch's run_decompositions does: the lowered program's weights are the inner tensors and its
    graph holds the subclass's own ops (the int8 -> float cast and the scale), so that a backend, which
    takes plain tensors, runs it; the result is eager's bit for bit without validation's help."""
    m, x = _ScaledLinear(), torch.randn(3, 5)
    export_model(torch.export.export(m, (x,)), tmp_path / "m.pt2b")
    lowered = load_for_backend(tmp_path / "m.pt2b", "core", cache=False, validate=False)
    state = lowered.exported_program().state_dict
    assert all(type(v) is torch.nn.Parameter for v in state.values()) and "parametrizations.w.original0" in state
    assert {"aten::_to_copy.default", "aten::mul.Tensor"} <= set(lowered.ops())
    assert torch.equal(lowered(x), m(x))


def test_a_subclass_weight_reaches_a_backend_as_plain_tensors(tmp_path):
    pytest.importorskip("onnxruntime")
    from exporter.backends import to_backend

    m, x = _ScaledLinear(), torch.randn(3, 5)
    export_model(torch.export.export(m, (x,)), tmp_path / "m.pt2b")
    compiled = to_backend(load_for_backend(tmp_path / "m.pt2b", backend="onnx", cache=False))
    assert compiled.validation.status == "passed"
    torch.testing.assert_close(compiled(x), m(x), rtol=1e-5, atol=1e-5)


def test_a_program_returning_a_subclass_is_lowered_over_its_subclass_weights(registered, tmp_path):
    """torch's unwrapped program would return the output's inner tensors in its place: such a program
    keeps its subclass weights in the lowering, and computes eager's result."""
    m, x = _TwoTensorWeights(), torch.randn(2, 3)
    export_model(torch.export.export(m, (x,)), tmp_path / "m.pt2b")
    lowered = load_for_backend(tmp_path / "m.pt2b", "core", cache=False, validate=False)
    assert isinstance(lowered.exported_program().state_dict["p"], TwoTensor)
    _assert_same(lowered(x), m(x))


def test_a_backend_is_not_handed_subclass_weights(registered, tmp_path):
    pytest.importorskip("onnxruntime")
    from exporter.backends import to_backend
    from exporter.errors import BackendHandOffError

    m, x = _TwoTensorWeights(), torch.randn(2, 3)
    export_model(torch.export.export(m, (x,)), tmp_path / "m.pt2b")
    lowered = load_for_backend(tmp_path / "m.pt2b", backend="onnx", cache=False)
    with pytest.raises(BackendHandOffError, match=r"the program's weights 'p' \(TwoTensor\), 'b' \(TwoTensor\), 'c' "
                                                  r"\(TwoTensor\) are tensor subclasses, kept as such because the "
                                                  r"program's own inputs or outputs are subclasses too"):
        to_backend(lowered)
