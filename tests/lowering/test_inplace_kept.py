"""Keeping an in-place op keeps its functional variant, which the lowering decomposes in its place
(``silu_`` -> ``silu``): for keep= and for validation's proof that a program amplifies right
decompositions' rounding; and nn.Sequential's input (named ``input``) keeps its name in every engine."""

from __future__ import annotations

import torch

from exporter import export_model, load_for_backend
from exporter.lowering.plan import plan_lowering

aten = torch.ops.aten


class _FiniteDifference(torch.nn.Sequential):
    """gain * (silu(x + step) - silu(x)) with an in-place SiLU (timm's activation layers): the program
    amplifies an ulp of silu's rounding by ``gain``, so that silu computed as x * sigmoid(x) (what core
    decomposes it to) moves the outputs past float32's bound, while being right on every value."""

    def __init__(self, n: int = 64, step: float = 1e-4, gain: float = 1e5):
        eye = torch.eye(n)
        first, last = torch.nn.Linear(n, 2 * n), torch.nn.Linear(2 * n, n, bias=False)
        with torch.no_grad():
            first.weight.copy_(torch.cat([eye, eye]))
            first.bias.copy_(torch.cat([torch.zeros(n), torch.full((n,), step)]))
            last.weight.copy_(torch.cat([-eye, eye], 1) * gain)
        super().__init__(first, torch.nn.SiLU(inplace=True), last)


def _artifact(tmp_path):
    model = _FiniteDifference().eval()
    x = torch.randn(4, 64, generator=torch.Generator().manual_seed(0))
    path = tmp_path / "fd.pt2b"
    export_model(model, (x,), path)
    return model, x, path


def _relative(got, want) -> float:
    return ((got - want).abs() / want.abs().clamp_min(1)).max().item()


def test_a_right_lowering_of_an_in_place_op_passes_where_the_program_amplifies_its_rounding(tmp_path):
    model, x, path = _artifact(tmp_path)
    lowered = load_for_backend(path, "core", cache=False)
    v = lowered.validation
    assert (v.status, v.verdict) == ("passed", "lossy"), v.describe()
    assert v.max_rel > v.bound == 1e-3  # the outputs do differ past float32's bound
    assert list(v.amplified) == ["aten::silu_.default"] and v.amplified["aten::silu_.default"] < 1e-6
    with torch.no_grad():
        want = model(x.clone())
        h = model[0](x)
        decomposed = model[2](h * torch.sigmoid(h))  # eager, with silu as core decomposes it
        got = lowered(x.clone())
    assert torch.equal(got, decomposed)  # the lowering computes exactly what its decomposition says
    assert _relative(got, want) > 1e-3


def test_keep_naming_an_in_place_op_keeps_its_functional_variant(tmp_path):
    model, x, path = _artifact(tmp_path)
    with torch.no_grad():
        want = model(x.clone())
    for keep in ("aten::silu_.default", "aten::silu.default"):
        lowered = load_for_backend(path, "core", keep=[keep], cache=False)
        assert lowered.ops().get("aten::silu.default") == 1 and "aten::sigmoid.default" not in lowered.ops(), keep
        assert lowered.unused_keep() == []  # the program's silu_ is what either name keeps
        assert (lowered.validation.status, lowered.validation.verdict) == ("passed", "exact")
        with torch.no_grad():
            assert torch.equal(lowered(x.clone()), want)


def test_a_plan_without_an_in_place_op_is_without_its_functional_variant():
    plan = plan_lowering("core")
    assert aten.silu.default in plan.table and aten.silu_.default in plan.table
    without = plan.without([aten.silu_.default]).table
    assert set(plan.table) - set(without) == {aten.silu.default, aten.silu_.default}


def _block():
    return torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.LayerNorm(8))


def test_a_sequential_lowers_node_by_node_and_by_repeated_layers(tmp_path):
    """nn.Sequential names its input ``input``, a name fx gives a copied node only as ``input_1``: each
    engine's copy keeps the program's input name (the signature's), so the lowering does not fail."""
    torch.manual_seed(0)
    x = torch.randn(2, 8)
    cases = {"dropout": (torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Dropout(0.1, inplace=True),
                                             torch.nn.SiLU(inplace=True)), False),
             "repeated": (torch.nn.Sequential(*(_block() for _ in range(4))), True)}
    for name, (model, reused) in cases.items():
        model.eval()
        with torch.no_grad():
            want = model(x.clone())
        export_model(model, (x,), tmp_path / f"{name}.pt2b")
        for preset in ("none", "core"):
            lowered = load_for_backend(tmp_path / f"{name}.pt2b", preset, cache=False)
            assert (lowered.reused is not None) == (reused and preset == "core"), (name, preset)
            with torch.no_grad():
                torch.testing.assert_close(lowered(x.clone()), want, rtol=1e-6, atol=1e-6)
