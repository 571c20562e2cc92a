"""Views on the layout the program was exported with (exporter/functionalize.py: _tolerant_view).

gpt2's attention output is `attn.transpose(1, 2).reshape(...).contiguous()` and then `.view(-1, n)`:
on the fused attention kernel's layout the contiguous() is a no-op, so torch.export records no copy,
and the view is valid. scaled_dot_product_attention's math decomposition lays its result out
otherwise, and the view then fails inside torch's own run_decompositions (and failed in pt2b's
lowering, for gpt2, gpt-sw3 and glm5_next). pt2b views a contiguous copy there instead, when nothing
writes through the view; a view that is written through still fails, as in torch."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import exporter
from exporter.errors import LoweringError
from helpers import assert_close_to_eager
from runtime_ref import Runtime


class Attention(torch.nn.Module):
    """gpt2's attention block in miniature, with an additive mask (so the CPU math path is taken)."""

    def __init__(self, write_through_view=False):
        super().__init__()
        self.qkv = torch.nn.Linear(64, 192)
        self.proj = torch.nn.Linear(64, 64)
        self.write_through_view = write_through_view

    def forward(self, x, mask):
        b, n, _ = x.shape
        q, k, v = (t.view(b, n, 4, 16).transpose(1, 2) for t in self.qkv(x).split(64, dim=2))
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        out = out.transpose(1, 2).reshape(b, n, -1).contiguous()
        flat = out.view(-1, 64)
        if self.write_through_view:
            flat.mul_(2)
            return self.proj(out)
        return self.proj(flat).view(b, n, 64)


_N = torch.export.Dim("n", min=2, max=64)
DYNAMIC = ({1: _N}, {2: _N, 3: _N})


def _inputs(n=6):
    torch.manual_seed(1)
    return torch.randn(2, n, 64), torch.randn(2, 1, n, n)


def _model(**kw):
    torch.manual_seed(0)
    return Attention(**kw).eval()


@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
def test_torch_run_decompositions_fails_on_it(dynamic):
    ep = torch.export.export(_model(), _inputs(), dynamic_shapes=DYNAMIC if dynamic else None)
    with pytest.raises(Exception, match="Cannot view a tensor with shape"):
        ep.run_decompositions()


@pytest.mark.parametrize("preset", ["core", "max"])
@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
def test_pt2b_lowers_it_and_it_runs_close_to_eager(tmp_path, preset, dynamic):
    path = tmp_path / "m.pt2b"
    exporter.export_model(_model(), _inputs(), path, dynamic_shapes=DYNAMIC if dynamic else None)
    lowered = exporter.load_for_backend(path, preset, cache=False)
    assert lowered.validation.status == "passed"
    copies = {torch.ops.aten.clone.default, torch.ops.prims.clone.default}
    assert any(n.target in copies for n in lowered.exported_program().graph.nodes), \
        "the view's input is copied to a contiguous layout"
    rt = Runtime(lowered)
    for n in ([6, 3, 11] if dynamic else [6]):
        args = _inputs(n)
        assert_close_to_eager(rt(*args), _model()(*args), rtol=1e-5, atol=1e-5)


def test_a_view_written_through_is_not_copied(tmp_path):
    """A copy would not alias: the write would not reach `out`. pt2b fails there, as torch does."""
    path = tmp_path / "m.pt2b"
    exporter.export_model(_model(write_through_view=True), _inputs(), path)
    with pytest.raises(LoweringError, match="Cannot view a tensor with shape"):
        exporter.load_for_backend(path, "core", cache=False)
