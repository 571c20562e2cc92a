"""A program split for fallback="reference" hands the backend parts that take tensors only: a size a part
uses is computed inside it from the tensor it is a size of (exporter/backends/part_sizes.py), so a backend
whose compiled programs take tensors only (torch-mlir, TVM, Core ML) takes those parts, at any size."""

from __future__ import annotations

import pytest
import torch
from torch.export import Dim

from exporter import backends
from exporter.backends import Backend
from exporter.backends.part_sizes import sizes_from_tensors
from exporter.errors import BackendHandOffError, BackendResultError


class Sorted(torch.nn.Module):
    """A sort (which the backend lacks) between two runs of ops; the second views by the input's sizes."""

    def forward(self, x):
        t = x * 2
        u = torch.sort(t, -1).values
        return (u + 1).view(t.shape[0] * t.shape[1], 1)


class ReadBack(torch.nn.Module):
    """A size read from a tensor's values (``item``): no tensor's size, so it stays a number."""

    def forward(self, x, n):
        k = n.sum().item()
        torch._check(k >= 1)
        torch._check(k <= x.shape[0])
        return torch.sort(x, 0).values[:k] + 1


def _program(model, *args, dynamic_shapes=None):
    return torch.export.export(model, args, dynamic_shapes=dynamic_shapes)


LISTED = ("aten::mul.Tensor", "aten::add.Tensor", "aten::view.default", "aten::slice.Tensor")


def _tensors_only(ep):
    """A backend's hand-off that takes programs of tensor inputs only, as torch-mlir's, TVM's, Core ML's,
    and of the ops it lists."""
    from exporter.ops import op_name

    unknown = {op_name(n.target) for n in ep.graph.nodes if n.op == "call_function"
               and isinstance(n.target, torch._ops.OpOverload) and n.target._schema.name != "aten::sym_size"
               and op_name(n.target) not in LISTED}
    if unknown:
        raise BackendHandOffError(f"converts no {sorted(unknown)}")
    numbers = [n.name for n in ep.graph.nodes if n.op == "placeholder" and not isinstance(n.meta.get("val"), torch.Tensor)]
    if numbers:
        raise BackendHandOffError(f"takes tensors only, not {numbers}")
    return ep.module(), ep


def _backend(monkeypatch, hand_off=_tensors_only):
    fake = Backend("tensors_only", "1", LISTED, "", dict, hand_off, lambda native, program, args, kwargs: native(*args, **kwargs))
    monkeypatch.setitem(backends._CACHE, "onnx", fake)


def test_a_part_computes_the_sizes_it_uses_from_the_tensors_it_takes():
    ep = _program(Sorted(), torch.randn(4, 3), dynamic_shapes=({0: Dim("a"), 1: Dim("b")},))
    from exporter.backends.partition import _Listed
    from torch.fx.passes.infra.partitioner import CapabilityBasedPartitioner

    gm = torch.fx.GraphModule(ep.graph_module, ep.graph_module.graph.__deepcopy__())
    listed = _Listed(lambda op: "sort" not in str(op), set())
    split = CapabilityBasedPartitioner(gm, listed, allows_single_node_partition=True).partition_and_fuse()
    takes = lambda: {n.target: [type(a.meta["val"]).__name__ for a in n.args]  # noqa: E731
                     for n in split.graph.nodes if n.op == "call_module"}
    assert "SymInt" in sum(takes().values(), [])  # (the partitioner hands the product of sizes over)
    sizes_from_tensors(split)
    assert set(sum(takes().values(), [])) == {"FakeTensor"}
    for shape in ((4, 3), (7, 5)):
        x = torch.randn(shape)
        assert torch.equal(split(x)[0], Sorted()(x))


def test_a_backend_taking_tensors_only_runs_every_part_it_lists(monkeypatch):
    _backend(monkeypatch)
    ep = _program(Sorted(), torch.randn(4, 3), dynamic_shapes=({0: Dim("a"), 1: Dim("b")},))
    compiled = backends.to_backend("onnx", ep, fallback="reference")
    share = compiled.share
    assert share.on_reference == {"aten::sort.default": 1} and share.refused == ()
    # the nodes that compute are counted, the size reads a split adds to its parts aside (tapas had been
    # counted running "195 of 194" nodes)
    computing = [n for n in ep.graph.nodes if n.op == "call_function" and isinstance(n.target, torch._ops.OpOverload)
                 and n.target is not torch.ops.aten.sym_size.int]
    assert share.nodes == len(computing) and share.backend_nodes == share.nodes - 1
    for shape in ((4, 3), (6, 8)):
        x = torch.randn(shape)
        assert torch.equal(compiled(x), Sorted()(x))


def test_a_size_read_from_values_stays_a_number_and_its_part_runs_on_the_reference(monkeypatch):
    _backend(monkeypatch)
    ep = _program(ReadBack(), torch.randn(6, 3), torch.tensor([1, 2]), dynamic_shapes=({0: Dim("a")}, None))
    compiled = backends.to_backend("onnx", ep, fallback="reference")
    left = {op: why for _, op, why in compiled.share.wrong}
    assert "takes tensors only" in left["aten::slice.Tensor"]  # (it slices by the number read)
    x, n = torch.randn(5, 3), torch.tensor([2, 2])
    assert torch.equal(compiled(x, n), ReadBack()(x, n))


def test_without_the_sizes_moved_the_backend_refuses_the_part_that_views(monkeypatch):
    """The part after the sort takes the product of sizes as a number, which the backend refuses: the
    reference runs the view too (what the split left before part_sizes)."""
    from exporter.backends import partition

    _backend(monkeypatch)
    monkeypatch.setattr(partition, "sizes_from_tensors", lambda split: None)
    ep = _program(Sorted(), torch.randn(4, 3), dynamic_shapes=({0: Dim("a"), 1: Dim("b")},))
    share = backends.to_backend("onnx", ep, fallback="reference").share
    assert share.on_reference == {"aten::sort.default": 1, "aten::view.default": 1}
    assert [(op, why.split(", not")[0]) for _, op, why in share.wrong] == [
        ("aten::view.default", "refused: takes tensors only")]


class SelectedOnTheReference(torch.nn.Module):
    """A select (which the backend lacks) between two runs of ops: the part after it takes the view and
    the tensor it views."""

    def forward(self, x):
        t = x * 2
        return t * (t.select(2, 3) + 1).view(t.shape[0], t.shape[1], 1)


def test_a_part_taking_a_view_is_traced_on_a_tensor_of_its_own(monkeypatch):
    """A part's input recorded in the reference's run may be a view (tapas's ids, selected on the
    reference): torch.export guarded its base's sizes (``select._base.size()``), which a retrace of the
    part (OpenVINO's table, any run_decompositions) has no base for: the part was refused ("'NoneType'
    object has no attribute 'size'") and its nodes went to the reference."""
    _backend(monkeypatch, hand_off=lambda ep: _tensors_only(ep.run_decompositions({})))
    ep = _program(SelectedOnTheReference(), torch.randn(2, 3, 5),
                  dynamic_shapes=({0: Dim("a"), 1: Dim("b"), 2: Dim("c", min=4)},))
    compiled = backends.to_backend("onnx", ep, fallback="reference")
    assert compiled.share.on_reference == {"aten::select.int": 1} and compiled.share.refused == ()
    x = torch.randn(5, 6, 7)
    assert torch.equal(compiled(x), SelectedOnTheReference()(x))


def _walks_in_order(refused, calls):
    """A backend whose converter walks a program's nodes in order and stops at the first one of op
    ``refused`` (which it lists: a converter failure, not a missing op), every hand-off counted in ``calls``."""
    def hand_off(ep, **options):
        calls.append(1)
        if any(n.target is refused for n in ep.graph.nodes):
            raise BackendHandOffError("the converter stopped at a node")  # (naming no op: ops_named finds none)
        return ep.module(), ep

    listed = ("aten::linear.default", "aten::gelu.default")
    return Backend("in_order", "1", listed, "", dict, hand_off,
                   lambda native, program, args, kwargs: native(*args, **kwargs))


def test_every_node_a_converter_stops_at_is_cut_out_in_a_counted_number_of_hand_offs(monkeypatch):
    """Eight GELUs the converter refuses although it lists them, between nine linears: a refused part is
    cut at its middle op and its halves handed over again, so every GELU is found (at most 2 log2(17)
    hand-offs each) and the nine linears go to the backend."""
    import math

    calls: list = []
    monkeypatch.setitem(backends._CACHE, "onnx", _walks_in_order(torch.ops.aten.gelu.default, calls))
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[m for _ in range(8) for m in (torch.nn.Linear(8, 8), torch.nn.GELU())],
                                torch.nn.Linear(8, 2)).eval()
    ep = _program(model, torch.randn(3, 8))
    compiled = backends.to_backend("onnx", ep, fallback="reference")
    share = compiled.share
    assert share.on_reference == {"aten::gelu.default": 8} and share.backend_nodes == 9
    assert {why for _, _, why in share.wrong} == {"refused: the converter stopped at a node"}
    assert len(calls) <= 1 + 8 * 2 * math.ceil(math.log2(17))
    x = torch.randn(3, 8)  # (a program of static shapes)
    torch.testing.assert_close(compiled(x), model(x), rtol=1e-6, atol=1e-6)


def test_no_cut_is_tried_back_once_the_hand_offs_are_spent(monkeypatch):
    """A cut found right goes back to the backend where the parts stay right; once MAX_PARTS hand-offs are
    spent, the parts a trial makes would not be handed over (they would run on the reference), so no trial
    is made: each had split and run the whole program again for nothing (hundreds on d_fine)."""
    from exporter.backends import partition

    calls, splits, split_once = [], [], partition._split_once
    monkeypatch.setitem(backends._CACHE, "onnx", _walks_in_order(torch.ops.aten.gelu.default, calls))
    monkeypatch.setattr(partition, "MAX_PARTS", 8)
    monkeypatch.setattr(partition, "_split_once", lambda *a, **k: splits.append(1) or split_once(*a, **k))
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[m for _ in range(8) for m in (torch.nn.Linear(8, 8), torch.nn.GELU())],
                                torch.nn.Linear(8, 2)).eval()
    compiled = backends.to_backend("onnx", _program(model, torch.randn(3, 8)), fallback="reference")
    assert len(calls) == 1 + 8  # (the whole program, then the parts)
    assert compiled.share.on_reference["aten::gelu.default"] == 8 and compiled.share.backend_nodes > 0
    assert len(splits) == len(compiled.share.wrong) + 1  # (one split per node cut out, and the last)
    x = torch.randn(3, 8)
    torch.testing.assert_close(compiled(x), model(x), rtol=1e-6, atol=1e-6)


def test_a_bool_a_part_returns_as_a_number_reaches_the_next_part_as_a_bool(monkeypatch):
    """A bool read from a tensor that a backend part returns, which its runtime gives back as 0 or 1 (IREE
    does), is a bool again for the next part: its ``sym_ite`` takes bools only ("expected SymBool or bool")."""
    from exporter.ops import op_name
    from tests.support.helpers import CheckedIds

    listed = ("aten::ge.Scalar", "aten::all.default", "aten::item.default")

    def hand_off(ep):
        if any(isinstance(n.target, torch._ops.OpOverload) and op_name(n.target) not in listed
               and "assert" not in op_name(n.target) for n in ep.graph.nodes):
            raise BackendHandOffError("converts only what it lists")
        return ep.module(), ep

    def run(native, program, args, kwargs):
        out = native(*args, **kwargs)
        as_ints = [int(o) if isinstance(o, bool) else o for o in (out if isinstance(out, (tuple, list)) else [out])]
        return as_ints if isinstance(out, (tuple, list)) else as_ints[0]

    monkeypatch.setitem(backends._CACHE, "onnx", Backend("ints", "1", listed, "", dict, hand_off, run))
    ep = _program(CheckedIds(), torch.randn(3), torch.tensor([1, 2]))
    compiled = backends.to_backend("onnx", ep, fallback="reference", validate=False)
    assert compiled.share.on_reference == {"aten::add.Tensor": 1, "aten::mul.Tensor": 1, "aten::sum.default": 1}
    for x, ids in ((torch.randn(3), torch.tensor([1, 2])), (torch.randn(3), torch.tensor([5, 0]))):
        assert torch.equal(compiled(x, ids), CheckedIds()(x, ids))


def test_an_integer_remainder_is_a_floor_division_for_backends_taking_ops_only():
    """``a % b`` of sizes becomes ``a - (a // b) * b`` (Python's identity for floor division), the same
    number for every size, negative operands included; a remainder of floats stays."""
    import operator

    from exporter.backends.sym_ops import ops_only

    class Remainders(torch.nn.Module):
        def forward(self, x):
            n = x.shape[0]
            return x * ((5 - n % 5) % 5), x + ((n - 7) % 3 + n % 2), x * (n * 0.5 % 1.5)

    ep = torch.export.export(Remainders(), (torch.randn(6),), dynamic_shapes=({0: Dim("n", min=2, max=64)},))
    made = ops_only(ep)
    assert operator.mod in {n.target for n in ep.graph.nodes}
    left = [n for n in made.graph.nodes if n.target is operator.mod]
    assert len(left) == 1 and isinstance(left[0].meta["val"], (float, torch.SymFloat))
    for n in (2, 3, 5, 6, 11, 64):
        x = torch.randn(n)
        for got, want in zip(made.module()(x), Remainders()(x)):
            assert got.shape == want.shape and torch.equal(got, want)


class _TiedRouter(torch.nn.Module):
    """A mixture-of-experts router whose gate is zero (every expert scores the same, as transformers'
    zero-initialized routers do): its topk picks among equal values."""

    def __init__(self):
        super().__init__()
        self.gate, self.experts = torch.nn.Linear(4, 6), torch.nn.Linear(4, 18)
        torch.nn.init.zeros_(self.gate.weight)
        torch.nn.init.zeros_(self.gate.bias)

    def forward(self, x):
        weights, picked = self.gate(x).softmax(-1).topk(2, dim=-1)
        out = self.experts(x).view(x.shape[0], 6, 3)
        return (out.gather(1, picked[..., None].expand(-1, -1, 3)) * weights[..., None]).sum(1)


def _picks_ties_otherwise(calls):
    """A backend that runs what it is given but breaks a topk's ties from the other end (as IREE breaks them
    otherwise than torch's CPU kernel), every hand-off counted in ``calls``."""
    from exporter._torch.dispatch import TorchDispatchMode

    class FromTheOtherEnd(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func is torch.ops.aten.topk.default:
                x, k, dim = args[0], args[1], args[2] if len(args) > 2 else -1
                values, at = func(x.flip(dim), k, dim, *args[3:], **(kwargs or {}))
                return values, x.shape[dim] - 1 - at
            return func(*args, **(kwargs or {}))

    def hand_off(ep, **options):
        calls.append(1)
        module = ep.module()

        def run(*args, **kwargs):
            with FromTheOtherEnd():
                return module(*args, **kwargs)
        return run, ep

    listed = ("aten::linear.default", "aten::softmax.int", "aten::topk.default", "aten::view.default",
              "aten::gather.default", "aten::expand.default", "aten::unsqueeze.default", "aten::mul.Tensor",
              "aten::sum.dim_IntList", "aten::_softmax.default", "aten::slice.Tensor")
    return Backend("ties", "1", listed, "", dict, hand_off,
                   lambda native, program, args, kwargs: native(*args, **kwargs))


def test_a_pick_among_equal_values_runs_on_the_reference_from_the_start(monkeypatch):
    """The backend computes the whole program wrong because its topk breaks ties otherwise: the split puts
    the picks that tie in the example run on the reference before any part is handed over
    (validation.tied_nodes), one hand-off per part; without, the part holding the topk is found wrong and
    cut down, hand-off by hand-off, to the same place."""
    from exporter.backends import validation

    calls: list = []
    monkeypatch.setitem(backends._CACHE, "onnx", _picks_ties_otherwise(calls))
    torch.manual_seed(0)
    model = _TiedRouter().eval()
    ep = _program(model, torch.randn(3, 4))
    with pytest.raises(BackendResultError):
        backends.to_backend("onnx", ep)
    calls.clear()
    compiled = backends.to_backend("onnx", ep, fallback="reference")
    share = compiled.share
    assert share.on_reference == {"aten::topk.default": 1}
    assert [(op, why) for _, op, why in share.wrong] == [
        ("aten::topk.default", "picks among equal values in the example run")]
    informed = len(calls)
    x = torch.randn(3, 4)
    torch.testing.assert_close(compiled(x), model(x), rtol=1e-6, atol=1e-6)
    monkeypatch.setattr(validation, "tied_nodes", lambda gm, inputs: frozenset())
    calls.clear()
    uninformed = backends.to_backend("onnx", ep, fallback="reference").share
    assert uninformed.on_reference == share.on_reference and len(calls) > informed
