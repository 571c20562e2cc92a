"""pt2b refuses nothing PyTorch accepts: node targets are looked up in torch's operator registry
(aten::__and__ and friends included), state and module paths may be any name nn.Module accepts,
and what pt2b writes it reads back (export_model checks before the file appears)."""

from __future__ import annotations

import collections
import keyword
import unicodedata

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from exporter import export_model, load, load_for_backend, names, ops
from exporter.errors import CorruptArtifactError, ExportError
from exporter.serialize import reader
from exporter.serialize.read import untrusted
from exporter.layout.generated import pt2b_generated as G
from runtime_ref import Runtime


def _registered_aten_overloads():
    """Every aten overload the dispatcher holds (JIT-only schemas such as has_torch_function
    are not operators a program can call)."""
    for full in torch._C._dispatch_get_all_op_names():
        qname, _, overload = full.partition(".")
        ns, _, name = qname.partition("::")
        if ns == "aten":
            yield name, overload or "default"


def test_every_registered_aten_overload_is_an_accepted_target():
    """The check asks the registry: each of the ~2,500 aten overloads resolves to torch's own
    OpOverload, dunder names (__and__, __ilshift__, ...) included."""
    seen = 0
    for name, overload in _registered_aten_overloads():
        target = f"torch.ops.aten.{name}.{overload}"
        untrusted.check_target(target, "t")
        assert ops.op_of_target(target) is getattr(getattr(torch.ops.aten, name), overload)
        seen += 1
    assert seen > 2000


@pytest.mark.parametrize("target", [
    "torch.ops.aten.__class__.__init__", "torch.ops.aten.__class__.default", "torch.ops.prim.name.default",
    "torch.ops.aten.add", "torch.ops.aten.add.Tensor.__call__", "torch.ops.higher_order.__class__",
    "torch.ops.aten.no_such_op.default", "torch.os.system", "builtins.eval", "torch.load",
])
def test_targets_outside_the_registry_are_refused(target):
    with pytest.raises(CorruptArtifactError, match="neither an operator registered with this torch|higher-order op .* which pt2b does not accept"):
        untrusted.check_target(target, "t")
    assert ops.op_of_target(target) is None


class Bitwise(torch.nn.Module):
    """What the attention-mask code of transformers decoders calls: aten::__and__ and friends."""

    def forward(self, a, b, s):
        m = (a & b) | (a ^ b)
        m = m & (s > 0)
        c = a.clone()
        c &= b
        c |= a
        c ^= b
        sh = (a << 1) >> 1
        sh <<= 1
        sh >>= 1
        return m, c, sh


def test_dunder_operators_round_trip_and_run(tmp_path):
    a, b = torch.randint(0, 8, (4, 5)), torch.randint(0, 8, (4, 5))
    s = torch.randint(-2, 2, (4, 5))
    path = tmp_path / "bitwise.pt2b"
    ep = export_model(Bitwise(), (a, b, s), path)
    called = {str(n.target) for n in ep.graph.nodes if n.op == "call_function"}
    assert {"aten.__and__.Tensor", "aten.__or__.Tensor", "aten.__xor__.Tensor", "aten.__iand__.Tensor",
            "aten.__lshift__.Scalar", "aten.__ilshift__.Scalar"} <= called
    prog = load(path)
    want = Bitwise()(a, b, s)
    for got, exp in zip(prog(a, b, s), want):
        assert torch.equal(got, exp)
    for preset in ("none", "core", "max"):
        for got, exp in zip(Runtime(load_for_backend(path, preset, cache=False))(a, b, s), want):
            assert torch.equal(got, exp), preset


def _model_named(name: str) -> torch.nn.Module:
    """A module tree where ``name`` is a submodule, a nested submodule, a parameter and a buffer."""
    inner = torch.nn.Sequential(collections.OrderedDict([(name, torch.nn.Linear(3, 3)), ("act", torch.nn.ReLU())]))
    inner.register_buffer(name + "_b", torch.arange(3.0))
    inner.register_parameter(name + "_p", torch.nn.Parameter(torch.full((3,), 0.5)))

    class Root(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.add_module(name, inner)

        def forward(self, x):
            sub = self.get_submodule(name)
            return sub(x) * getattr(sub, name + "_p") + getattr(sub, name + "_b")

    return Root().eval()


def _state_names(path) -> set[str]:
    return {reader.text(r.name) for r in reader.open_artifact(path).program.tensors
            if r.kind != G.TensorKind.EXAMPLE_INPUT}


def _check_round_trip(tmp_path, name: str) -> None:
    model = _model_named(name)
    x = torch.randn(2, 3)
    path = tmp_path / "named.pt2b"
    ep = export_model(model, (x,), path)
    written = _state_names(path)
    assert written == set(ep.state_dict)  # the file keeps the names exactly as nn.Module has them
    prog = load(path)
    assert torch.equal(prog(x), model(x))
    state = prog.exported_program().state_dict
    assert {names.original_path(k) for k in state} == set(ep.state_dict)
    for k, v in state.items():
        assert torch.equal(v, ep.state_dict[names.original_path(k)])
    again = tmp_path / "again.pt2b"
    export_model(prog.exported_program(), path=again)  # aliases are written back as the original names
    assert _state_names(again) == written
    assert torch.equal(Runtime(load_for_backend(path, "core", cache=False))(x), model(x))


@pytest.mark.parametrize("name", [
    "block4-0", "a b", "блок", "模块", 'a"b', "x\\y", "a\nb", "\x00z", "class", "self", "graph", "code", "meta",
    "_guards_fn", "__foo__", "_pt2b_x61", "a,b;c", "a(b", "p[q]", "%2C", "x:y", "🙂", "0",
    "ª", "ﬁx", "x²",  # identifiers that Python's parser NFKC-normalizes ("a", "fix"): self.ª would read self.a
])
def test_any_name_nn_module_accepts_round_trips(tmp_path, name):
    _check_round_trip(tmp_path, name)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.text(st.characters(exclude_categories=("Cs",), exclude_characters="."), min_size=1, max_size=12))
def test_names_from_all_of_unicode_round_trip(tmp_path, name):
    try:
        _model_named(name)
    except KeyError:  # nn.Module refuses it too (e.g. the name of an attribute it already has)
        return
    _check_round_trip(tmp_path, name)


def test_aliases_are_a_bijection():
    for comp in ["a", "a-b", 'a"b', "class", "self", "_pt2b_x61", "_pt2b_x" + "class".encode().hex(), "x\n", "é", "ª", "ﬁ"]:
        assert names.original_path(names.safe_path(f"m.{comp}.w")) == f"m.{comp}.w"
        # what torch's code generation sees: identifiers that are neither keywords nor names it owns
        # (an identifier, or text that fits in getattr(self, "...") unchanged)
        assert all(((c.isidentifier() and unicodedata.normalize("NFKC", c) == c)
                    or (not c.isidentifier() and c.isprintable() and not set(c) & set('"\\')))
                   and not keyword.iskeyword(c) and c not in names._reserved()
                   for c in names.safe_path(f"m.{comp}.w").split("."))


def test_name_that_cannot_be_stored_is_an_export_error_not_a_file(tmp_path):
    path = tmp_path / "m.pt2b"
    with pytest.raises(ExportError, match="not valid Unicode .* stores text as UTF-8. Rename it."):
        export_model(_model_named("\ud800"), (torch.randn(2, 3),), path)
    assert not path.exists() and not list(tmp_path.iterdir())


def test_export_refuses_to_write_what_it_would_not_read(tmp_path, monkeypatch):
    """The writer loads the finished temp file before renaming it: a program the reader refuses
    (here: a reader made to refuse every state path) is an ExportError and no file appears."""
    path = tmp_path / "m.pt2b"
    export_model(torch.nn.Linear(3, 2), (torch.randn(1, 3),), path)
    before = path.read_bytes()
    monkeypatch.setattr(names, "path_ok", lambda path: False)
    with pytest.raises(ExportError, match=r"pt2b would refuse to load what it was about to write, so .*m\.pt2b' "
                                          r"was not written: CorruptArtifactError: .*m\.pt2b: .*'(weight|bias)' is not a "
                                          r"path of non-empty names"):
        export_model(torch.nn.Linear(3, 2), (torch.randn(1, 3),), path)
    assert path.read_bytes() == before  # the earlier file is untouched, no temp file is left
    assert [p.name for p in tmp_path.iterdir()] == ["m.pt2b"]


class Uniform(torch.nn.Module):
    def forward(self, x):
        y = x.clone()
        y.uniform_(1.0, 10.0)  # aten::uniform_(Tensor(a!) self, float from=0., float to=1., *, Generator? generator=None)
        return y


def test_schema_argument_named_like_a_python_keyword(tmp_path):
    """Op schemas name arguments `from` and `to`: the writer and reader accept what schemas hold (torch
    passes them positionally, so no keyword reaches generated code), while value names stay identifiers."""
    from exporter import load_for_backend
    from runtime_ref import Runtime

    path = tmp_path / "u.pt2b"
    export_model(Uniform(), (torch.randn(1000),), path)
    names_ = {i.name for n in reader.decode_graph(reader.open_artifact(path)).graph_module.graph.nodes
              for i in n.inputs if n.target == "torch.ops.aten.uniform_.default"}
    assert {"from", "to"} <= names_

    def drawn(out):
        assert out.shape == (1000,) and bool((out >= 1).all()) and bool((out < 10).all()) and out.std() > 1

    drawn(load(path)(torch.randn(1000)))
    for preset in ("core", "max"):
        lowered = load_for_backend(path, preset, cache=False)
        drawn(Runtime(lowered)(torch.randn(1000)))
    export_model(load_for_backend(path, "core", cache=False), path=tmp_path / "u.core.pt2b")  # aten::uniform
    drawn(load(tmp_path / "u.core.pt2b")(torch.randn(1000)))
    untrusted.check_name("from", untrusted.IDENT, "t", "NamedArgument.name", may_be_self=True)
    with pytest.raises(CorruptArtifactError, match="is not a Python identifier"):
        untrusted.check_name("from", untrusted.IDENT, "t", "value name")
