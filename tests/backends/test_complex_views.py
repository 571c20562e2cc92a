"""A view of a complex tensor handed to ONNX as the same view of its real pairs
(exporter/backends/complex_views.py): torch.onnx translates none of them for complex tensors, and the
rotary embeddings of DeepSeek-V2 and Llama 4 unsqueeze a complex tensor."""

from __future__ import annotations

import pytest
import torch

from exporter.backends.complex_views import complex_views_as_real


class Viewed(torch.nn.Module):
    """One view of a complex tensor made from the input's pairs, back to real pairs for the output."""

    def __init__(self, view):
        super().__init__()
        self.view = view

    def forward(self, x):
        return torch.view_as_real(self.view(torch.view_as_complex(x)).contiguous())


VIEWS = {
    "unsqueeze": lambda c: c.unsqueeze(1),
    "unsqueeze_negative": lambda c: c.unsqueeze(-1),
    "view": lambda c: c.view(3, -1),
    "reshape": lambda c: c.reshape(-1),
    "expand": lambda c: c.unsqueeze(0).expand(2, -1, -1, -1),
    "permute": lambda c: c.permute(2, 0, 1),
    "transpose": lambda c: c.transpose(-1, 0),
    "select": lambda c: c.select(-2, 1),
    "slice": lambda c: c[:, 1:3],
    "slice_step": lambda c: c[..., ::2],
    "squeeze": lambda c: c.unsqueeze(1).squeeze(1),
}


@pytest.mark.parametrize("name", sorted(VIEWS))
def test_each_view_of_real_pairs_gives_the_complex_views_elements(name):
    model, x = Viewed(VIEWS[name]), torch.randn(3, 4, 6, 2)
    ep = torch.export.export(model, (x,)).run_decompositions({})
    rewritten = complex_views_as_real(ep)
    assert rewritten is not ep
    viewed = [n for n in rewritten.graph.nodes if n.op == "call_function" and n.target not in (
        torch.ops.aten.view_as_real.default, torch.ops.aten.view_as_complex.default, torch.ops.aten.clone.default)]
    for node in viewed:  # (every view left takes real pairs)
        assert not any(isinstance(a, torch.fx.Node) and a.meta["val"].is_complex() for a in node.args), node
    for inputs in (x, torch.randn(3, 4, 6, 2)):
        assert torch.equal(rewritten.module()(inputs), model(inputs))
    assert any(n.target is torch.ops.aten.view_as_complex.default for n in ep.graph.nodes)  # (ep left as it was)


def test_a_program_without_complex_views_is_handed_over_as_it_is():
    ep = torch.export.export(Viewed(lambda c: c * 2), (torch.randn(3, 2),))
    assert complex_views_as_real(ep) is ep


class RotaryByPolar(torch.nn.Module):
    """DeepSeek-V2's rotary embedding: the query's pairs as complex numbers, times polar(1, angle)
    unsqueezed over batch and heads."""

    def forward(self, x, freqs):
        cis = torch.polar(torch.ones_like(freqs), freqs)
        xc = torch.view_as_complex(x.float().reshape(*x.shape[:-1], -1, 2))
        return torch.view_as_real(xc * cis.unsqueeze(0).unsqueeze(0)).flatten(3).type_as(x)


def test_a_rotary_embedding_by_complex_numbers_runs_on_onnxruntime(tmp_path, monkeypatch):
    pytest.importorskip("onnxruntime")
    pytest.importorskip("onnxscript")
    from exporter import backends, export_model, load_for_backend
    from exporter.backends import complex_views
    from exporter.errors import BackendHandOffError

    torch.manual_seed(0)
    model, args = RotaryByPolar(), (torch.randn(2, 4, 8, 16), torch.randn(8, 8))
    export_model(model, args, tmp_path / "rotary.pt2b")
    lowered = load_for_backend(tmp_path / "rotary.pt2b", backend="onnx", cache=False)
    with monkeypatch.context() as m:
        m.setattr(complex_views, "complex_views_as_real", lambda ep: ep)
        with pytest.raises(BackendHandOffError, match="complex-valued input"):
            backends.to_backend(lowered)
    compiled = backends.to_backend(lowered)
    for inputs in (args, (torch.randn(2, 4, 8, 16), torch.randn(8, 8) * 3)):
        torch.testing.assert_close(compiled(*inputs), model(*inputs), rtol=1e-5, atol=1e-5)
