"""Complex arithmetic handed to a backend as arithmetic on real pairs (exporter/backends/complex_pairs.py):
OpenVINO's converter has no polar and no cat or copy of a complex tensor, and DeepSeek-V2's rotary
embedding multiplies the queries viewed as complex numbers by polar(1, freqs)."""

from __future__ import annotations

import pytest
import torch
from torch.export import Dim

from exporter.backends.complex_pairs import complex_as_real_pairs


class Rotary(torch.nn.Module):
    """DeepSeek-V2's rotary embedding, scaled, and more of what a graph does with complex numbers: their
    concatenation, a sum of two, a real part and a conversion."""

    def __init__(self):
        super().__init__()
        self.register_buffer("inv_freq", 1.0 / (10000 ** (torch.arange(0, 8, 2).float() / 8)), persistent=False)
        self.q = torch.nn.Linear(8, 8)

    def forward(self, x):
        t = torch.arange(x.shape[1], dtype=torch.float32)
        cis = torch.polar(torch.ones_like(t)[:, None] * 0.5, torch.outer(t, self.inv_freq)) * 2
        q = self.q(x)
        qc = torch.view_as_complex(q.float().reshape(*q.shape[:-1], -1, 2))
        turned = qc * cis.unsqueeze(0)
        both = torch.cat([turned, turned + qc], dim=-1).to(torch.complex128)
        return torch.view_as_real(both).flatten(2) + 1, turned.real * 2, torch.view_as_real(torch.complex(x, -x))


def _complex_nodes(ep):
    return [n for n in ep.graph.nodes if n.op == "call_function" and any(
        isinstance(v.meta.get("val"), torch.Tensor) and v.meta["val"].is_complex() for v in (n, *n.all_input_nodes))]


def test_the_graph_computes_on_real_pairs_the_values_it_computed_on_complex_numbers():
    torch.manual_seed(0)
    model = Rotary()
    ep = torch.export.export(model, (torch.randn(2, 5, 8),), dynamic_shapes=({1: Dim("s", min=2, max=64)},))
    pairs = complex_as_real_pairs(ep)
    assert _complex_nodes(ep) and pairs is not ep
    assert not _complex_nodes(pairs)
    for n in (5, 9, 2):  # other lengths than the example's
        x = torch.randn(2, n, 8)
        got, want = pairs.module()(x), model(x)
        for g, w in zip(got, want):
            assert g.dtype == w.dtype and g.shape == w.shape
            torch.testing.assert_close(g, w, rtol=1e-6, atol=1e-6)
    assert _complex_nodes(ep)  # (ep left as it was)


def test_a_complex_input_and_output_stay_complex_at_the_graph_s_edge():
    class Scaled(torch.nn.Module):
        def forward(self, z, angle):
            turned = z * torch.polar(torch.ones_like(angle), angle)
            return torch.view_as_real(turned), turned * 2

    ep = torch.export.export(Scaled(), (torch.randn(3, 4, dtype=torch.complex64), torch.randn(3, 4)))
    pairs = complex_as_real_pairs(ep)
    edge = [n.target for n in _complex_nodes(pairs)]
    assert sorted(map(str, edge)) == ["aten.view_as_complex.default", "aten.view_as_real.default"], edge
    z, angle = torch.randn(3, 4, dtype=torch.complex64), torch.randn(3, 4)
    for got, want in zip(pairs.module()(z, angle), Scaled()(z, angle)):
        torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)


def test_a_graph_doing_what_no_rule_covers_with_complex_numbers_is_handed_over_as_it_is():
    class Spectrum(torch.nn.Module):
        def forward(self, x):
            return torch.view_as_real(torch.view_as_complex(x) * torch.fft.fft(x[..., 0]))

    ep = torch.export.export(Spectrum(), (torch.randn(3, 4, 2),))
    assert complex_as_real_pairs(ep) is ep
    plain = torch.export.export(torch.nn.Linear(2, 2), (torch.randn(3, 2),))
    assert complex_as_real_pairs(plain) is plain


def test_a_rotary_embedding_by_polar_runs_on_openvino(tmp_path, monkeypatch):
    pytest.importorskip("openvino")
    from exporter import backends, export_model, load_for_backend
    from exporter.backends import openvino
    from exporter.errors import BackendHandOffError

    torch.manual_seed(0)
    model = Rotary().eval()
    export_model(model, (torch.randn(2, 5, 8),), tmp_path / "rotary.pt2b",
                 dynamic_shapes=({1: Dim("s", min=2, max=64)},))
    lowered = load_for_backend(tmp_path / "rotary.pt2b", backend="openvino", cache=False)
    with monkeypatch.context() as m:  # without the pairs: OpenVINO's converter refuses polar
        m.setattr(openvino, "complex_as_real_pairs", lambda ep: ep)
        with pytest.raises(BackendHandOffError, match="polar"):
            backends.to_backend("openvino", lowered)
    compiled = backends.to_backend("openvino", lowered)
    assert compiled.validation.status == "passed"
    for n in (5, 11):
        x = torch.randn(2, n, 8)
        for got, want in zip(compiled(x), model(x)):
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
