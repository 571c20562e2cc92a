"""What torch.export accepts, pt2b writes, reads back and lowers: a TreeSpec held by the module, inputs
whose types are registered pytree nodes (a class, a dataclass) and the shape guards of
torch's dynamic-shape builders (ShapesCollection, Dim.AUTO/DYNAMIC, nested and dataclass specs,
AdditionalInputs), each against eager and torch's own run_decompositions."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from torch.export import Dim

from exporter import export_model, load, load_for_backend
from exporter._torch.pytree import pytree
from exporter.errors import CorruptArtifactError, RuntimeInputError
from exporter.serialize.read.untrusted import check_guard, check_guards
from tests.support.helpers import raised as _raises, same_tensor_leaves as _same


class Pair:
    """A plain class registered as a pytree node (with keys, as torch.export needs)."""

    def __init__(self, a, b):
        self.a, self.b = a, b


pytree.register_pytree_node(
    Pair, lambda p: ([p.a, p.b], None), lambda leaves, _: Pair(*leaves), serialized_type_name="pt2b_tests.Pair",
    flatten_with_keys_fn=lambda p: ([(pytree.GetAttrKey("a"), p.a), (pytree.GetAttrKey("b"), p.b)], None))


@dataclasses.dataclass
class Batch:
    x: torch.Tensor
    y: torch.Tensor


torch.export.register_dataclass(Batch, serialized_type_name="pt2b_tests.Batch")


class HoldsSpec(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.spec = pytree.tree_structure({"a": 0, "b": (0, 0)})

    def forward(self, x):
        d = pytree.tree_unflatten([x, x * 2, x + 1], self.spec)
        return d["a"] + d["b"][0] * d["b"][1]


class FlattensInForward(torch.nn.Module):
    def forward(self, x):
        leaves, spec = pytree.tree_flatten({"p": x, "q": [x * 2, x.cos()]})
        back = pytree.tree_unflatten([leaf * 3 for leaf in leaves], spec)
        return back["q"][1] - back["p"]


class TakesPair(torch.nn.Module):
    def forward(self, p, y):
        return Pair(p.a * y + p.b, p.b - y)


class TakesBatch(torch.nn.Module):
    def forward(self, batch, extra):
        return (batch.x * 2 + batch.y).sum(0) + extra["w"], batch.x @ batch.y.t()


class MatMul(torch.nn.Module):
    def forward(self, x, y):
        return x @ y + 1


def _t(*shape):
    return torch.randn(*shape)


def _written(tmp_path, model, args, dynamic=None):
    ep = torch.export.export(model, args, dynamic_shapes=dynamic)
    path = tmp_path / "m.pt2b"
    export_model(ep, path=path)
    return ep, path


PROGRAMS = {  # model, example inputs, other inputs of the same structure
    "treespec_attribute": (HoldsSpec, (_t(3),), [(_t(3),)]),
    "treespec_in_forward": (FlattensInForward, (_t(4),), [(_t(4),)]),
    "registered_class_input": (TakesPair, (Pair(_t(3), _t(3)), _t(3)), [(Pair(_t(3), _t(3)), _t(3))]),
    "registered_dataclass_input": (TakesBatch, (Batch(_t(2, 3), _t(2, 3)), {"w": _t(3)}),
                                   [(Batch(_t(2, 3), _t(2, 3)), {"w": _t(3)})]),
}


@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_pytree_programs_round_trip_and_lower_as_torch_does(tmp_path, name):
    model, example, others = PROGRAMS[name]
    ep, path = _written(tmp_path, model(), example)
    loaded = load(path)
    lowered = load_for_backend(path, "core", cache=False, validate=False)
    theirs = ep.run_decompositions().module()
    for args in [example, *others]:
        eager = model()(*args)
        got = loaded(*args)
        assert type(got) is type(eager) and _same(got, eager)  # the same structure comes back
        assert _same(lowered(*args), theirs(*args))


B = Dim("B", min=2, max=32)
N = Dim("n", max=64)


def _shapes_collection(model, args):
    sc = torch.export.ShapesCollection()
    sc[args[0]] = (B, 3)
    sc[args[1]] = (3, Dim.DYNAMIC)
    return sc.dynamic_shapes(model, args)


def _additional_inputs(model, args):
    extra = torch.export.dynamic_shapes.AdditionalInputs()
    extra.add(args)
    extra.add((_t(7, 3), _t(3, 2)))
    return extra


# model, example inputs, dynamic_shapes(model, args), inputs both run, inputs where torch's program raises
BUILDERS = {
    "shapes_collection": (MatMul, (_t(4, 3), _t(3, 5)), _shapes_collection,
                          [(_t(9, 3), _t(3, 2))], [(_t(40, 3), _t(3, 2))]),
    "auto_and_dynamic": (MatMul, (_t(4, 3), _t(3, 5)),
                         lambda m, a: ({0: Dim.AUTO, 1: Dim.AUTO}, {0: Dim.AUTO, 1: Dim.DYNAMIC}),
                         [(_t(9, 6), _t(6, 2))], [(_t(9, 6), _t(5, 2))]),
    "nested_dataclass_spec": (TakesBatch, (Batch(_t(4, 3), _t(4, 3)), {"w": _t(3)}),
                              lambda m, a: ([{0: N}, {0: N}], {"w": None}),
                              [(Batch(_t(7, 3), _t(7, 3)), {"w": _t(3)})],
                              [(Batch(_t(7, 3), _t(6, 3)), {"w": _t(3)})]),
    "spec_by_argument_name": (TakesBatch, (Batch(_t(4, 3), _t(4, 3)), {"w": _t(3)}),
                              lambda m, a: {"batch": [{0: N}, {0: N}], "extra": {"w": None}},
                              [(Batch(_t(5, 3), _t(5, 3)), {"w": _t(3)})], []),
    "additional_inputs": (MatMul, (_t(4, 3), _t(3, 5)), _additional_inputs, [(_t(9, 3), _t(3, 8))], []),
}


@pytest.mark.filterwarnings("ignore:Using None as a dynamic shape dimension")
@pytest.mark.parametrize("name", sorted(BUILDERS))
def test_shape_guards_of_dynamic_shape_builders_are_written_read_and_lowered(tmp_path, name):
    model, example, dynamic, good, bad = BUILDERS[name]
    ep, path = _written(tmp_path, model(), example, dynamic(model(), example))
    loaded = load(path)
    lowered = load_for_backend(path, "core", cache=False, validate=False)
    theirs = ep.run_decompositions().module()
    for args in [example, *good]:
        assert _same(loaded(*args), model()(*args))
        assert _same(lowered(*args), theirs(*args))
    for args in bad:
        want = _raises(theirs, args)
        assert isinstance(want, AssertionError), want
        for ours in (loaded, lowered):
            got = _raises(ours, args)
            assert isinstance(got, RuntimeInputError), got  # (InputGuardError is one)


def test_a_guard_on_a_dataclass_field_is_read_as_the_input_leaf_torch_names():
    example = ((Batch(_t(4, 3), _t(4, 3)),), {})
    code = "L['batch'].y.size()[0] == L['batch'].x.size()[0]"
    assert sorted(check_guard(code, {"batch"}, "guard"), key=str) == sorted(
        check_guard("L['batch'].x.size()[0] == L['batch'].y.size()[0]", {"batch"}, "guard"), key=str)
    check_guards([code], example, ["batch"], "guards")  # both paths are leaves of the example input


@pytest.mark.parametrize("code, why", [
    ("L['batch'].__class__.size()[0] == 2", "reads attribute '__class__'"),
    ("L['batch'].z.size()[0] == 2", r"reads L\['batch'\].z, which is not an input"),
    ("L['batch']['x'].size()[0] == 2", r"reads L\['batch'\]\['x'\], which is not an input"),
    ("(1).x.size()[0] == 2", "reads attribute 'x'"),
])
def test_a_field_read_that_is_no_input_leaf_is_still_refused(code, why):
    example = ((Batch(_t(4, 3), _t(4, 3)),), {})
    with pytest.raises(CorruptArtifactError, match=why):
        check_guards([code], example, ["batch"], "guards")
