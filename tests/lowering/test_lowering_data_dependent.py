"""Lowering programs with data-dependent values: unbacked sizes (nonzero, boolean masks, item()),
their runtime asserts, and non-strict export's tensor-metadata assertions.

Wherever torch's run_decompositions lowers such a program, load_for_backend lowers it too (presets
none/core/max), runtime_ref's result equals eager, and the op counts equal torch's. Where torch's
retrace hits a data-dependent guard inside a decomposition (ExportDB's assume_constant_result under
"max": slice's decomposition asks whether an unbounded item() is negative), pt2b's decomposition
declines that call and the op stays, as ``keep`` would make it.

A program without tensor inputs used to be retraced in a fresh FakeTensorMode and ShapeEnv (pt2b
found the program's mode from its placeholders only): the fresh env named its own unbacked sizes u0
again and the trace died on "u0 possible memo disaster". It is now retraced in the program's own
mode, found as torch finds it (placeholders, then the other nodes' values).
"""

from __future__ import annotations

import copy

import pytest
import torch
from torch._export.db.examples import all_examples

from exporter import export_model, load, load_for_backend
from exporter.errors import LoweringError
from exporter.lowering import tables
from exporter.lowering.engines import run_decompositions
from exporter.graph_walk import op_counts
from tests.support.helpers import assert_close_to_eager
from runtime_ref import Runtime
from tests.lowering.test_decompose import global_state

PRESETS = ["none", "core", "max"]


# ---- programs without tensor inputs (the mode is found from the graph's other values) ----

class MaskNoInputs(torch.nn.Module):
    def forward(self):
        x = torch.arange(8.0)
        m = x[x > 2.5]  # nonzero: an unbacked size
        return m * 2, m.sum(), torch.softmax(m, 0)


class ItemNoInputs(torch.nn.Module):
    def forward(self):
        x = torch.arange(8)
        k = (x > 4).sum().item()
        torch._check(k >= 0)
        torch._check(k <= 8)
        return torch.ones(8)[:k] * 3, torch.zeros(k, 2)


class IntInput(torch.nn.Module):
    def forward(self, n: int):
        x = torch.arange(8.0)
        return x[x > n].sum() + n


class InPlaceNoInputs(torch.nn.Module):
    """An in-place op: "none" functionalizes, through the same retrace."""

    def forward(self):
        x = torch.arange(6.0)
        x.add_(1)
        return x[x > 3].mean()


# ---- programs with tensor inputs (already lowered as torch lowers them: kept as a regression) ----

class ItemSlice(torch.nn.Module):
    def forward(self, x, y):
        n = y.item()
        torch._check(n >= 0)
        torch._check(n <= x.shape[0])
        return x[:n] * 2


class NonzeroRows(torch.nn.Module):
    def forward(self, x):
        rows = x[x.sum(1) > 0]
        idx = torch.nonzero(x > 0)
        return torch.softmax(rows, -1), rows.var(0), idx.float().mean(0)


class SplitTolist(torch.nn.Module):
    def forward(self, x, sizes):
        a, b = sizes.tolist()
        torch._check(a >= 0)
        torch._check(b >= 0)
        torch._check(a + b == x.shape[0])
        p, q = torch.split(x, [a, b])
        return p.sum(0), q.mean(0)


class ToDtypes(torch.nn.Module):
    """Non-strict export records aten._assert_tensor_metadata for each .to()."""

    def forward(self, x):
        return (x.to(torch.float16).float() * 2).to(dtype=torch.float64).type_as(x), x.double().sum().to(torch.float32)


def _exportdb(name):
    case = all_examples()[name]
    return copy.deepcopy(case.model), case.example_args, case.example_kwargs or {}, case.dynamic_shapes


_B = torch.export.Dim("B", min=2, max=64)
PROGRAMS = {
    # ExportDB's example as the issue exported it (non-strict: get_item is data-dependent) and as
    # ExportDB documents it (strict: assume_constant_result makes it a constant)
    "assume_constant_result:nonstrict": (lambda: _exportdb("assume_constant_result"), False),
    "assume_constant_result:strict": (lambda: _exportdb("assume_constant_result"), True),
    "mask_no_inputs": (lambda: (MaskNoInputs(), (), {}, None), False),
    "mask_no_inputs:strict": (lambda: (MaskNoInputs(), (), {}, None), True),
    "item_no_inputs": (lambda: (ItemNoInputs(), (), {}, None), False),
    "int_input": (lambda: (IntInput(), (3,), {}, None), False),
    "inplace_no_inputs": (lambda: (InPlaceNoInputs(), (), {}, None), False),
    "item_slice": (lambda: (ItemSlice(), (torch.randn(6, 3), torch.tensor(4)), {}, None), False),
    "nonzero_rows": (lambda: (NonzeroRows(), (torch.randn(7, 4),), {}, None), False),
    "split_tolist": (lambda: (SplitTolist(), (torch.randn(7, 3), torch.tensor([3, 4])), {}, None), False),
    "to_dtypes:dynamic": (lambda: (ToDtypes(), (torch.randn(4, 3),), {}, ({0: _B},)), False),
}
# torch's own retrace cannot decompose these (the same GuardOnDataDependentSymNode): see below
TORCH_FAILS = {("assume_constant_result:nonstrict", "max")}


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory):
    made = {}

    def get(name):
        if name not in made:
            torch.manual_seed(0)
            make, strict = PROGRAMS[name]
            model, args, kwargs, dyn = make()
            ep = torch.export.export(copy.deepcopy(model), args, kwargs, dynamic_shapes=dyn, strict=strict)
            path = tmp_path_factory.mktemp("dd") / f"{name.replace(':', '_')}.pt2b"
            export_model(ep, path=path)
            with torch.no_grad():
                eager = copy.deepcopy(model)(*copy.deepcopy(args), **copy.deepcopy(kwargs))
            made[name] = path, args, kwargs, eager
        return made[name]

    return get


def _torchs(path, preset, lowered):
    """torch's run_decompositions of the same loaded program with the same table ("none": both
    retraces with an empty table, which is what pt2b's functionalization runs)."""
    ep = load(path).exported_program()
    if preset == "none":
        return op_counts(run_decompositions(ep, {}).graph_module), op_counts(ep.run_decompositions({}).graph_module)
    table = tables.torch_default_table() if preset == "core" else lowered.table
    return lowered.ops(), op_counts(ep.run_decompositions(dict(table)).graph_module)


@pytest.mark.parametrize("preset", PRESETS)
@pytest.mark.parametrize("name", list(PROGRAMS))
def test_lowers_runs_and_matches_torch(artifacts, name, preset):
    path, args, kwargs, eager = artifacts(name)
    lowered = load_for_backend(path, preset, cache=False)
    custom = [op for op in lowered.ops() if not op.startswith(("aten::", "prims::", "higher_order::"))]
    out = Runtime(lowered, device="cpu", extra_ops=custom)(*copy.deepcopy(args), **copy.deepcopy(kwargs))
    assert_close_to_eager(out, eager, rtol=1e-5, atol=1e-5)
    if (name, preset) in TORCH_FAILS:  # test_a_decomposition_that_would_guard_on_data_declines
        return
    ours, theirs = _torchs(path, preset, lowered)
    assert ours == theirs


def test_assume_constant_result_keeps_its_runtime_asserts_and_metadata_check(artifacts):
    """The issue's program under "core": torch's op counts (above), and the checks it carries."""
    path, args, _, _ = artifacts("assume_constant_result:nonstrict")
    ops = load_for_backend(path, "core", cache=False).ops()
    assert ops["aten::_assert_tensor_metadata.default"] == 1
    assert ops["aten::_assert_scalar.default"] == 2  # 0 <= u1 <= 3 on the slice's length
    x = args[0]
    lowered = load_for_backend(path, "core", cache=False)
    for n in (0, 1, 3, 7, -1):  # the item() is data: every value slices as eager does
        y = torch.tensor(n)
        assert torch.equal(Runtime(lowered, device="cpu")(x, y), x[:n])


def test_a_decomposition_that_would_guard_on_data_declines(artifacts):
    """ExportDB's assume_constant_result exported non-strict, under "max": slice's decomposition
    asks ``end < 0`` of an item() nothing bounds (u0 in [-oo, oo]); torch's run_decompositions with
    the same table fails there. pt2b's decomposition declines that call: slice.Tensor stays, and the
    lowering is what ``keep=["aten::slice.Tensor"]`` gives (which torch lowers too), for every value."""
    from torch.fx.experimental.symbolic_shapes import GuardOnDataDependentSymNode

    from exporter.lowering.plan import plan_lowering

    path, args, kwargs, eager = artifacts("assume_constant_result:nonstrict")
    with pytest.raises(GuardOnDataDependentSymNode, match=r"u0 < 0"):
        load(path).exported_program().run_decompositions(dict(plan_lowering("max").table))
    lowered = load_for_backend(path, "max", cache=False)
    kept = load_for_backend(path, "max", keep=["aten::slice.Tensor"], cache=False)
    assert lowered.ops()["aten::slice.Tensor"] == 1 and lowered.ops() == kept.ops()
    assert lowered.ops() == op_counts(load(path).exported_program().run_decompositions(dict(kept.table)).graph_module)
    assert lowered.validation.status == "passed"
    assert "the decomposition declined these calls" in lowered.explain("aten::slice.Tensor")
    x = args[0]
    for n in (0, 1, 3, 7, -1):
        assert torch.equal(Runtime(lowered, device="cpu")(x, torch.tensor(n)), x[:n])


def test_program_without_tensor_inputs_is_retraced_in_its_own_shape_env():
    from exporter.functionalize import program_fake_mode

    model = ItemNoInputs()
    ep = torch.export.export(model, ())
    unbacked = next(n.meta["val"] for n in ep.graph.nodes if isinstance(n.meta.get("val"), torch.SymInt))
    assert program_fake_mode(ep.graph_module).shape_env is unbacked.node.shape_env
    before = global_state()
    ours = run_decompositions(ep, tables.torch_default_table())
    assert global_state() == before  # still nothing process-wide
    theirs = ep.run_decompositions()
    assert op_counts(ours.graph_module) == op_counts(theirs.graph_module)
    assert {str(k): v for k, v in ours.range_constraints.items()} == \
        {str(k): v for k, v in theirs.range_constraints.items()}
    a, b = ours.module()(), model()
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
