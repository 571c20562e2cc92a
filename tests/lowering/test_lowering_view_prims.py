"""Preset "max" where a decomposition writes in place and others emit PrimTorch views.

adaptive_avg_pool2d's CompositeImplicitAutograd kernel restrides its result with as_strided_ when
the input suggests channels-last (Swin's pooler: transpose then adaptive_avg_pool1d; ConvNeXt's:
NHWC permuted to NCHW then adaptive_avg_pool2d). torch's run_decompositions applies that kernel
above functionalization and the rest of the table (aten.view -> prims.collapse_view, aten.expand
-> prims.broadcast_in_dim, aten.transpose -> prims.transpose, ...) below it. pt2b's retrace
(exporter/lowering/decompose.py) applies the table below functionalization, so the in-place write
reaches the graph; its second try used to apply the whole table before functionalizing, leaving
the PrimTorch views for functionalization, which refuses them ("Found a custom (non-ATen) operator
whose output has alias annotations: prims::collapse_view ..."). These programs lower with
max/core/none, run on runtime_ref close to eager, and have torch's op counts with the same table.
"""

from __future__ import annotations

import copy

import pytest
import torch

from exporter import export_model, load, load_for_backend
from exporter.lowering import tables
from exporter.lowering.engines import run_decompositions
from exporter.graph_walk import op_counts
from tests.support.helpers import assert_close_to_eager
from runtime_ref import Runtime


class SwinPooler(torch.nn.Module):
    """donut-swin's head: LayerNorm, then (B, L, C) -> (B, C, L) -> adaptive_avg_pool1d -> flatten."""

    def __init__(self):
        super().__init__()
        self.norm = torch.nn.LayerNorm(8)

    def forward(self, x):
        return torch.flatten(torch.nn.functional.adaptive_avg_pool1d(self.norm(x).transpose(1, 2), 1), 1)


class ConvNextPooler(torch.nn.Module):
    """dinov3_convnext's head: an NHWC activation permuted to NCHW, adaptive_avg_pool2d, flatten."""

    def forward(self, x):
        return torch.flatten(torch.nn.functional.adaptive_avg_pool2d(x.permute(0, 3, 1, 2), 1), 1)


class SwinWindows(torch.nn.Module):
    """Swin's window partition (view/permute/contiguous/view), window attention-ish mixing, the
    reverse, then the pooler."""

    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(4, 4)

    def forward(self, x):  # (B, H, W, C)
        b, h, w, c = x.shape
        win = x.view(b, h // 2, 2, w // 2, 2, c).permute(0, 1, 3, 2, 4, 5).contiguous().view(-1, 4, c)
        win = torch.softmax(win @ win.transpose(1, 2), -1) @ self.proj(win)
        x = win.view(b, h // 2, w // 2, 2, 2, c).permute(0, 1, 3, 2, 4, 5).contiguous().view(b, h * w, c)
        return torch.flatten(torch.nn.functional.adaptive_avg_pool1d(x.transpose(1, 2), 1), 1)


class ViewsOnly(torch.nn.Module):
    """flatten/unflatten/expand and a contiguous adaptive_avg_pool1d: no decomposition writes in
    place, the single-trace path."""

    def forward(self, x):
        y = torch.flatten(x, 1).unflatten(1, (4, 3))[:, None].expand(2, 3, 4, 3) + 1
        return torch.nn.functional.adaptive_avg_pool1d(y.reshape(2, 12, 3), 1)


CASES = {
    "swin_pooler": (SwinPooler, lambda: (torch.randn(2, 6, 8),)),
    "convnext_pooler": (ConvNextPooler, lambda: (torch.randn(2, 3, 3, 8),)),
    "swin_windows": (SwinWindows, lambda: (torch.randn(2, 4, 4, 4),)),
    "views_only": (ViewsOnly, lambda: (torch.randn(2, 3, 4),)),
}
WRITES_IN_PLACE = ("swin_pooler", "convnext_pooler", "swin_windows")
VIEW_PRIMS = {"prims::collapse_view.default", "prims::broadcast_in_dim.default", "prims::transpose.default",
              "prims::split_dim.default", "prims::squeeze.default"}


def _table(preset: str) -> dict:
    return {"max": tables.available_decompositions(), "core": tables.torch_default_table(), "none": {}}[preset]


def _program(name):
    cls, make_args = CASES[name]
    torch.manual_seed(0)
    model, args = cls().eval(), make_args()
    return model, args, torch.export.export(model, args)


@pytest.mark.parametrize("name", WRITES_IN_PLACE)
def test_adaptive_pool_writes_in_place_under_max(name):
    """With the whole table applied below functionalization, the trace is not functional (the
    channels-last as_strided_ of adaptive_avg_pool2d's CIA kernel); pt2b's single trace applies the
    CIA decompositions above functionalization, as torch does, and is functional at once: torch's
    graph and pt2b's hold the functionalized as_strided, and no second trace runs."""
    from torch._functorch.aot_autograd import aot_export_module

    from exporter import functionalize
    from exporter._torch import compat as torch_compat
    from exporter.lowering.decompose import trace_table

    if not torch_compat.functional_mode_decides_per_object():
        pytest.skip("this torch's functionalization cannot be told to decompose a C++ CIA kernel (2.11): "
                    "the retrace takes two steps there (test_lowers_like_torch_and_runs)")

    _, _, ep = _program(name)
    gm = ep.graph_module
    phs = [n for n in gm.graph.nodes if n.op == "placeholder"]
    table = trace_table(_table("max"))
    fake_mode, args = functionalize._fake_inputs(gm, phs)
    with fake_mode, torch.no_grad(), pytest.raises(AssertionError, match="as_strided_"):
        aot_export_module(gm, args, decompositions=table, trace_joint=False, pre_dispatch=True)
    assert torch.ops.aten.adaptive_avg_pool2d.default in functionalize._WRITERS  # so the retrace takes that path
    ours, _ = functionalize._trace(gm, phs, table, above=True)
    assert "aten::as_strided.default" in op_counts(ours)
    assert not [n for n in ours.graph.nodes if isinstance(n.target, torch._ops.OpOverload) and n.target._schema.is_mutable]
    assert "aten::as_strided.default" in op_counts(ep.run_decompositions(_table("max")).graph_module)


@pytest.mark.parametrize("name", ["swin_pooler", "convnext_pooler"])
def test_a_write_found_while_tracing_sends_the_trace_above_functionalization(monkeypatch, name):
    """With no op known to write, the fast trace (whole table below functionalization) meets
    adaptive_avg_pool2d's as_strided_: the watch stops it there, remembers the op, and the retrace
    applies the CIA decompositions above functionalization: torch's op counts, no mutation left."""
    from exporter import functionalize

    monkeypatch.setattr(functionalize, "_WRITERS", set())
    _, _, ep = _program(name)
    ours = run_decompositions(ep, dict(_table("max")))
    assert torch.ops.aten.adaptive_avg_pool2d.default in functionalize._WRITERS
    assert op_counts(ours.graph_module) == op_counts(ep.run_decompositions(_table("max")).graph_module)
    assert not [n for n in ours.graph_module.graph.nodes
                if isinstance(n.target, torch._ops.OpOverload) and n.target._schema.is_mutable]


@pytest.mark.parametrize("preset", ["max", "core", "none"])
@pytest.mark.parametrize("name", list(CASES))
def test_lowers_like_torch_and_runs(tmp_path, name, preset):
    model, args, ep = _program(name)
    theirs = ep.run_decompositions(dict(_table(preset)))
    ours = run_decompositions(ep, dict(_table(preset)))
    assert op_counts(ours.graph_module) == op_counts(theirs.graph_module)
    if preset == "max":  # the PrimTorch views that functionalization refuses are in the result
        assert VIEW_PRIMS & set(op_counts(ours.graph_module))

    path = tmp_path / f"{name}.pt2b"
    export_model(copy.deepcopy(model), args, path)
    lowered = load_for_backend(path, preset, cache=False)
    if preset != "none":  # "none" only functionalizes (flatten stays; torch's retrace would inline it)
        theirs = load(path).exported_program().run_decompositions(dict(lowered.table))
        assert lowered.ops() == op_counts(theirs.graph_module)
    with torch.no_grad():
        eager = model(*copy.deepcopy(args))
    out = Runtime(lowered, device="cpu")(*copy.deepcopy(args))
    assert_close_to_eager(out, eager, rtol=1e-5, atol=1e-5)


def test_decomposition_torch_cannot_functionalize_still_lowers():
    """torch._refs.polar (and the aten.complex it calls) set ``result.real``: a write torch's
    retrace leaves below functionalization, where it fails; pt2b applies those decompositions above
    functionalization as well (deepseek_v2's rotary embedding), and the result runs like eager."""
    class Rotary(torch.nn.Module):
        def forward(self, x, freqs):
            rot = torch.polar(torch.ones_like(freqs), freqs)
            return torch.view_as_real(torch.view_as_complex(x) * rot).flatten(2)

    from tests.lowering.test_decompose import global_state

    x, freqs = torch.randn(2, 3, 4, 2), torch.randn(3, 4)
    ep = torch.export.export(Rotary(), (x, freqs))
    try:
        theirs = op_counts(ep.run_decompositions(dict(_table("max"))).graph_module)
    except AssertionError:  # torch 2.13: "n=copy__1, n.args[0]=select_1, ...": the graph is not functional
        theirs = None
    before = global_state()
    ours = run_decompositions(ep, dict(_table("max")))
    assert global_state() == before  # the extra traces leave py_kernels, fake rules and flags alone
    counts = op_counts(ours.graph_module)
    if theirs is not None:  # a torch that lowers it: the same counts
        assert counts == theirs
    assert not {"aten::polar.default", "aten::complex.default"} & set(counts)
    assert not [n for n in ours.graph_module.graph.nodes
                if isinstance(n.target, torch._ops.OpOverload) and n.target._schema.is_mutable]
    torch.testing.assert_close(Runtime(ours, device="cpu")(x, freqs), Rotary()(x, freqs), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name, preset", [("donut-swin", "max"), ("swin", "core")])
def test_transformers_swin_lowers(tmp_path, name, preset):
    """donut-swin (Swin windows + pooler), the model the bug was seen on; swin, whose attention
    output goes through torch's sdpa decomposition (another layout than the kernel's) and then
    transpose().contiguous().view(): the contiguous must be decomposed where that layout is seen, in
    the one functionalizing trace, together with the pooler's decomposition that writes in place."""
    pytest.importorskip("transformers")
    from tools.corpus.transformers_zoo import make_case

    case = make_case(name)
    path = tmp_path / f"{name}.pt2b"
    export_model(case.model, copy.deepcopy(case.args), path, kwargs=copy.deepcopy(case.kwargs),
                 dynamic_shapes=case.dynamic_shapes, strict=case.strict)
    lowered = load_for_backend(path, preset, cache=False)
    theirs = load(path).exported_program().run_decompositions(dict(lowered.table))
    assert lowered.ops() == op_counts(theirs.graph_module)
    with torch.no_grad():
        eager = case.model(*copy.deepcopy(case.args), **copy.deepcopy(case.kwargs or {}))
    out = Runtime(lowered, device="cpu")(*copy.deepcopy(case.args), **copy.deepcopy(case.kwargs or {}))
    assert_close_to_eager(out, eager, rtol=case.rtol, atol=case.atol)
