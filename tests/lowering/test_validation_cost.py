"""What keeps validation's cost below the lowering's without weakening it (exporter/lowering/validate.py):
dynamic dims validated at a small size (the lowered graph is one graph for every size in range), and a
half-precision bound that grows with the rounding depth of the program, so that a right lowering of a
deep bfloat16 model passes without the diagnosis that would prove it."""

from __future__ import annotations

import math

import pytest
import torch
from torch.export import Dim

from exporter import export_model, load, load_for_backend
from exporter.errors import OpsetError
from exporter.lowering import validate as V


class _Gather(torch.nn.Module):
    """Indices into the sequence dim, given as an input: cut, the stored indices point past its end."""

    def forward(self, x, idx):
        return torch.nn.functional.silu(x).index_select(1, idx)


class _Pair(torch.nn.Module):
    def forward(self, x, y):
        return torch.nn.functional.silu(x[:, 1:]) + y.softmax(-1)


def _ep(tmp_path, model, args, dynamic_shapes):
    path = tmp_path / "m.pt2b"
    export_model(model, args, path, dynamic_shapes=dynamic_shapes)
    return path, load(path).exported_program()


def test_dynamic_dims_are_cut_and_derived_dims_follow(tmp_path):
    batch, seq = Dim("batch", max=64), Dim("seq", max=256)
    x, y = torch.randn(12, 40), torch.randn(12, 39)
    path, ep = _ep(tmp_path, _Pair(), (x, y), {"x": {0: batch, 1: seq + 1}, "y": {0: batch, 1: seq}})
    cut_x, cut_y = V.smaller_inputs(ep)[0]
    assert (cut_x.shape, cut_y.shape) == ((8, 9), (8, 8))   # seq + 1 follows seq
    assert torch.equal(cut_x, x[:8, :9]) and torch.equal(cut_y, y[:8, :8])   # the stored values, their first
    runs = V.SourceRuns(ep)
    assert runs.result(0)[0] == "ok" and runs.inputs[0] is runs.cut
    lp = load_for_backend(path, "core", cache=False)
    assert lp.validation.status == "passed" and lp.validation.inputs == 2


def test_a_cut_input_outside_the_program_s_domain_validates_on_the_stored_one(tmp_path):
    x, idx = torch.randn(3, 20), torch.tensor([0, 7, 19])
    _, ep = _ep(tmp_path, _Gather(), (x, idx), {"x": {1: Dim("seq", max=64)}, "idx": None})
    assert V.smaller_inputs(ep)[0][0].shape == (3, 8)
    runs = V.SourceRuns(ep)
    assert runs.result(0)[0] == "ok"
    assert runs.cut is None and runs.inputs[0] is ep.example_inputs   # index 19 is past a cut of 8


def test_static_or_small_inputs_are_not_cut(tmp_path):
    _, ep = _ep(tmp_path, _Pair(), (torch.randn(4, 9), torch.randn(4, 8)), None)
    assert V.smaller_inputs(ep) is None
    _, ep = _ep(tmp_path, _Pair(), (torch.randn(4, 9), torch.randn(4, 8)),
                {"x": {1: Dim("seq", max=64) + 1}, "y": {1: Dim("seq", max=64)}})
    assert V.smaller_inputs(ep) is None   # seq is 8 already


def _no_silu(x):  # a decomposition that computes something else
    return x


def test_a_wrong_decomposition_is_found_on_cut_inputs(tmp_path):
    path, ep = _ep(tmp_path, _Pair(), (torch.randn(12, 40), torch.randn(12, 39)),
                   {"x": {1: Dim("seq", max=256) + 1}, "y": {1: Dim("seq", max=256)}})
    assert V.smaller_inputs(ep) is not None
    with pytest.raises(OpsetError, match=r"the decomposition of aten::silu\.default \(.*_no_silu\) makes the "
                                         r"program wrong at node silu: on the stored example inputs"):
        load_for_backend(path, "core", cache=False, decompositions={torch.ops.aten.silu.default: _no_silu})


class _Chain(torch.nn.Module):
    """n linears in bfloat16 with a view between each and a float32 step in the middle."""

    def __init__(self, n):
        super().__init__()
        self.layers = torch.nn.ModuleList(torch.nn.Linear(8, 8) for _ in range(n))

    def forward(self, x):
        for i, layer in enumerate(self.layers):
            x = layer(x).reshape(2, 2, 8).reshape(4, 8)    # views: no rounding
            if i == len(self.layers) // 2:
                x = (x.float() * 1.5).to(torch.bfloat16)    # float32: passes the roundings on
        return x


def test_the_half_precision_bound_follows_the_rounding_depth(tmp_path):
    n = 60   # sqrt(61) bfloat16 epsilons: 0.061, above the audit's 0.05
    model = _Chain(n).to(torch.bfloat16).eval()
    _, ep = _ep(tmp_path, model, (torch.randn(4, 8, dtype=torch.bfloat16),), None)
    depth = V.rounding_depths(ep.graph)[torch.bfloat16]
    # each linear rounds once in bfloat16 (its decomposition's steps are the lowering's, not the source's);
    # the float32 multiply does not round in bfloat16, its conversion back does
    assert depth == n + 1
    bounds = V.bounds_for([], ep)
    assert bounds[torch.bfloat16] == pytest.approx(math.sqrt(n + 1) * torch.finfo(torch.bfloat16).eps)
    assert bounds[torch.float32] == 1e-3   # a float32 output's bound is not the half-precision one
    shallow = _Chain(2).to(torch.bfloat16).eval()
    _, ep = _ep(tmp_path, shallow, (torch.randn(4, 8, dtype=torch.bfloat16),), None)
    assert V.bounds_for([], ep)[torch.bfloat16] == 5e-2   # the audit's line, where depth gives less


class _AttentionRounding(torch.nn.Module):
    """gain * (attention with equal scores - the mean it computes): nothing but attention's rounding in
    bfloat16, amplified; its decomposition (matmuls and a softmax, each rounding) is right, and moves the
    outputs past the bound."""

    def forward(self, q, v):
        return 100.0 * (torch.nn.functional.scaled_dot_product_attention(q, q, v) - v.mean(dim=-2, keepdim=True))


def _attention_artifact(tmp_path):
    g = torch.Generator().manual_seed(0)
    q = (0.01 * torch.randn(1, 2, 16, 8, generator=g)).to(torch.bfloat16)
    v = torch.randn(1, 2, 16, 8, generator=g).to(torch.bfloat16)
    path = tmp_path / "attention.pt2b"
    export_model(_AttentionRounding(), (q, v), path)
    return (q, v), path


def test_rounding_told_by_a_widened_run_needs_no_second_lowering(tmp_path, monkeypatch):
    """The decomposed attention right where it runs, the outputs past the bound: a float32 run of the
    program says both programs are as far from the exact values, so the lowering passes without the
    lowering that keeps every decomposed op (counted: none)."""
    from exporter.lowering import repair as R

    kept = []
    monkeypatch.setattr(R, "_validates_keeping", lambda *a: kept.append(a) or False)
    _, path = _attention_artifact(tmp_path)
    v = load_for_backend(path, "core", cache=False).validation
    assert (v.status, v.verdict, kept) == ("passed", "lossy", []) and v.max_rel > v.bound, v.describe()
    assert list(v.amplified) == ["aten::scaled_dot_product_attention.default"]


def test_a_widened_run_computes_nearer_the_exact_values_and_refuses_an_output_farther_off(tmp_path):
    from types import SimpleNamespace

    (q, v), path = _attention_artifact(tmp_path)
    ep = load(path).exported_program()
    inputs = ((q, v), {})
    [wide] = V.widened_run(ep, inputs)
    assert wide.dtype == torch.float32
    with torch.no_grad():
        exact = _AttentionRounding()(q.double(), v.double())
        [want] = V._Runner(ep)(inputs)
    assert (wide - exact).abs().max() < (want.double() - exact).abs().max() / 10

    def explains(got, wanted=want):
        return V.rounding_explains(ep, SimpleNamespace(failed_on=(inputs, [wanted]), failed_got=[got]))

    assert not explains(want + 1.0)   # farther from the exact values than rounding takes it
    assert explains(wide.to(torch.bfloat16))   # nearer
    assert not explains(wide, want.float())   # float32 outputs are not asked (their reference: a float64 run)
