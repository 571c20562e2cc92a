"""A refused op of values the program fixes, computed at lowering and given as a ``full``
(exporter/lowering/fold.py): Gemma 3n's ``Normal(0, 1).icdf`` of a constant, an ``erf_inv`` that no
decomposition reaches."""

from __future__ import annotations

import pytest
import torch

from exporter import export_model, load_for_backend
from exporter.errors import OpsetError
from exporter.lowering.presets import load as load_preset

# the core opset without erfinv: its decomposition ends in prims::erf_inv, which nothing decomposes
WITHOUT_ERFINV = sorted(name for name in load_preset("core").opset if "erfinv" not in name)


class Sparsity(torch.nn.Module):
    """Gemma 3n's activation sparsity: a cutoff at the mean plus the normal quantile of a constant target
    times the standard deviation."""

    def __init__(self, target=0.95):
        super().__init__()
        self.target = target

    def forward(self, x):
        std = torch.distributions.normal.Normal(0, 1).icdf(torch.tensor(self.target, dtype=torch.float32))
        return torch.relu(x - (x.mean(-1, keepdim=True) + x.std(-1, keepdim=True) * std))


def _calls(lowered) -> set[str]:
    return {str(n.target) for n in lowered.exported_program().graph.nodes if n.op == "call_function"}


def test_a_refused_op_of_constants_is_computed_at_lowering(tmp_path):
    torch.manual_seed(0)
    x = torch.randn(3, 16)
    export_model(Sparsity(), (x,), tmp_path / "sparse.pt2b")
    lowered = load_for_backend(tmp_path / "sparse.pt2b", supported_ops=WITHOUT_ERFINV, cache=False)
    assert "prims.erf_inv.default" not in _calls(lowered) and "aten.full.default" in _calls(lowered)
    assert lowered.validation.status == "passed"
    for inputs in (x, torch.randn(3, 16) * 3):
        torch.testing.assert_close(lowered(inputs), Sparsity()(inputs), rtol=1e-6, atol=1e-6)


class OfTheInput(torch.nn.Module):
    def forward(self, x):
        return torch.special.erfinv(torch.tanh(x) * 0.5)


class Drawn(torch.nn.Module):
    """A seeded random op of literals: each run draws anew, so its value is never the program's."""

    def forward(self, x):
        return x + torch.special.erfinv(torch.rand(4) - 0.5)


class Uneven(torch.nn.Module):
    """A constant whose elements differ: no one ``full`` makes it."""

    def forward(self, x):
        return x + torch.special.erfinv(torch.tensor([0.1, 0.2, 0.3, 0.4]))


@pytest.mark.parametrize("model", [OfTheInput, Drawn, Uneven])
def test_what_the_program_does_not_fix_or_one_full_cannot_make_stays_refused(tmp_path, model):
    export_model(model(), (torch.randn(4),), tmp_path / "m.pt2b")
    with pytest.raises(OpsetError, match=r"prims::erf_inv.default \(1 call sites\)"):
        load_for_backend(tmp_path / "m.pt2b", supported_ops=WITHOUT_ERFINV, cache=False)
