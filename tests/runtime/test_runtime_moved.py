"""A program recorded on one device type run on another (runtime_ref/graphs.py): what the recording says
that the other device's kernels need not keep. On CPU-only machines the other device type is simulated
by recording the program's inputs on the meta device; tests/runtime/test_runtime_ref.py and
test_runtime_grad_modes.py run the zoo and autocast regions on CUDA where it is present."""

from __future__ import annotations

import copy

import pytest
import torch

from runtime_ref import Runtime
from runtime_ref.bindings import TensorSpec
from runtime_ref.graphs import moved_call, reads_cpu_scalars, retarget_devices, with_device_scalars
from runtime_ref.nodes import TableNode

VIEW, RESHAPE = torch.ops.aten.view.default, torch.ops.aten.reshape.default
ASSERT = torch.ops.aten._assert_tensor_metadata.default


class ScaleThenFlatten(torch.nn.Module):
    """A view of an op's output: possible on the layout the recording's kernel gave it (contiguous)."""

    def forward(self, x):
        return (x * 2.0).view(-1) + 1.0


def _recorded_elsewhere(ep: torch.export.ExportedProgram) -> torch.export.ExportedProgram:
    """ep with its inputs' recorded values on the meta device: for the runtime, recorded on another device type."""
    ep = copy.deepcopy(ep)
    for node in ep.graph.nodes:
        val = node.meta.get("val")
        if node.op == "placeholder" and isinstance(val, torch.Tensor):
            node.meta["val"] = torch.empty_strided(val.shape, val.stride(), dtype=val.dtype, device="meta")
    return ep


def test_a_view_the_moved_layout_does_not_allow_runs_as_a_reshape():
    x = torch.randn(4, 6)
    ep = torch.export.export(ScaleThenFlatten(), (x,)).run_decompositions()
    assert VIEW in {n.target for n in ep.graph.nodes}
    column_major = x.t().contiguous().t()  # the same values, another layout: as another device's kernel may give
    # recorded on this device type: the recorded layout is a promise, and the view fails as torch's own would
    with pytest.raises(RuntimeError, match="view size is not compatible"):
        Runtime(ep)(column_major)
    with pytest.raises(RuntimeError, match="view size is not compatible"):
        ep.module()(column_major)
    out = Runtime(_recorded_elsewhere(ep))(column_major)
    assert torch.equal(out, ScaleThenFlatten()(x))
    # where the layout allows it, the reshape is the view it was: no copy
    rt = Runtime(_recorded_elsewhere(ep))
    assert torch.equal(rt(x), ScaleThenFlatten()(x))


def test_moved_call_loosens_only_what_another_device_type_changes():
    args, kwargs = ("t", None, None, torch.bfloat16), {"device": torch.device("cpu"), "layout": torch.strided}
    same = moved_call(ASSERT, args, kwargs, other_device=True, autocast_moved=False)
    assert same == (ASSERT, args, kwargs)  # the dtypes hold where no autocast region moved
    target, a, kw = moved_call(ASSERT, args, {**kwargs, "dtype": torch.bfloat16}, other_device=True, autocast_moved=True)
    assert (target, a, kw) == (ASSERT, ("t", None, None, None), kwargs)  # device and layout still checked
    assert moved_call(VIEW, ("t", [6]), {}, other_device=True, autocast_moved=False) == (RESHAPE, ("t", [6]), {})
    assert moved_call(VIEW, ("t", [6]), {}, other_device=False, autocast_moved=False) == (VIEW, ("t", [6]), {})
    add = torch.ops.aten.add.Tensor
    assert moved_call(add, ("a", "b"), {}, other_device=True, autocast_moved=True) == (add, ("a", "b"), {})


def test_a_subgraph_recorded_elsewhere_is_retargeted_with_its_views():
    gm = torch.fx.symbolic_trace(torch.nn.Identity())  # a graph with no device, no view: returned as it is
    assert retarget_devices(gm, torch.device("cpu"), frozenset({"meta"})) is gm

    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    graph.output(graph.call_function(VIEW, (graph.call_function(torch.ops.aten.mul.Tensor, (x, 2.0)), [-1])))
    sub = torch.fx.GraphModule(torch.nn.Module(), graph)
    assert retarget_devices(sub, torch.device("cpu"), frozenset({"cpu"})) is sub  # same device type: kept
    moved = retarget_devices(sub, torch.device("cpu"), frozenset({"meta"}))
    assert moved is not sub and RESHAPE in {n.target for n in moved.graph.nodes}
    assert VIEW in {n.target for n in sub.graph.nodes}  # the program's own graph is left as it was
    x = torch.randn(4, 6).t().contiguous().t()
    assert torch.equal(moved(x), (x * 2.0).reshape(-1))


class ReluPlusSum(torch.nn.Module):
    def forward(self, x):
        return torch.relu(x) + x.sum()


def test_a_cpu_scalar_a_prim_reads_is_expanded_off_the_cpu(tmp_path):
    """max decomposes relu to prims.where(pred, scalar_tensor(0), x) and `x + x.sum()` to prims.add(x, <0-dim>):
    prims take a 0-dim CPU tensor beside a tensor of any shape and device, not a 0-dim tensor elsewhere."""
    from exporter import export_model, load_for_backend

    export_model(ReluPlusSum(), (torch.randn(2, 5),), tmp_path / "m.pt2b")
    gm = load_for_backend(tmp_path / "m.pt2b", "max", cache=False).exported_program().graph_module
    readers = {n.target for n in gm.graph.nodes if reads_cpu_scalars(n)}
    assert {torch.ops.prims.where.default, torch.ops.prims.add.default} <= readers
    # the same reading of a table's nodes (a lowered artifact load() returned is planned from its table)
    scalar_node = TableNode("s", "call_function", torch.ops.aten.scalar_tensor.default, (0,),
                            val=TensorSpec(torch.float32, (), ()))
    where = TableNode("w", "call_function", torch.ops.prims.where.default, (None, scalar_node, None))
    assert reads_cpu_scalars(where)
    assert not reads_cpu_scalars(TableNode("a", "call_function", torch.ops.aten.add.Tensor, (scalar_node, None)))
    # off the CPU (the meta device here): the raw prim refuses the 0-dim tensor, the expanded call runs
    pred, x = torch.ones(2, 5, dtype=torch.bool, device="meta"), torch.ones(2, 5, device="meta")
    scalar = torch.zeros((), device="meta")
    with pytest.raises(RuntimeError, match=r"Shape torch.Size\(\[\]\) is not the expected shape"):
        torch.ops.prims.where.default(pred, scalar, x)
    assert with_device_scalars(torch.ops.prims.where.default)(pred, scalar, x).shape == (2, 5)
    # a CPU scalar stays one: expanded it would be a CPU tensor beside the other device's
    out = with_device_scalars(torch.ops.prims.add.default)(torch.ones(2, 5), torch.tensor(2.0))
    assert torch.equal(out, torch.full((2, 5), 3.0))
    # recorded on the device it runs on, the plan keeps the prims as they are
    lowered = load_for_backend(tmp_path / "m.pt2b", "max", cache=False)
    x = torch.randn(2, 5)
    assert torch.equal(Runtime(lowered)(x), ReluPlusSum()(x))
    # recorded elsewhere, the plan wraps the prims that read a CPU scalar, and runs as before
    moved = Runtime(_recorded_elsewhere(lowered.exported_program()))
    assert sum("call" in getattr(fn, "__qualname__", "") for fn, *_ in moved.plan.steps) >= 2
    assert torch.equal(moved(x), ReluPlusSum()(x))
