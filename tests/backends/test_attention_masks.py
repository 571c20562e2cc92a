"""Attention under a boolean mask handed over as an additive one (exporter.backends.attention): torch's
values, rows that attend to nothing included, on the backends whose hand-offs use it (OpenVINO always,
ONNX with its fusions, tests/backends/test_onnx_fusions.py)."""

from __future__ import annotations

import pytest
import torch

from exporter import backends, export_model, load_for_backend
from exporter.errors import BackendResultError


@pytest.mark.parametrize("mask_shape", [(5, 7), (2, 1, 5, 7), (2, 3, 5, 7), (1, 1, 1, 7)])
def test_a_boolean_mask_given_as_an_additive_one_gives_torchs_values(mask_shape):
    """Rows that attend to nothing included: torch's boolean attention gives them zeros, and so does the
    additive form (a plain additive mask would average them)."""
    from exporter.backends.attention import sdpa_with_additive_mask

    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 3, n, 8, generator=g) for n in (5, 7, 7))
    mask = torch.rand(mask_shape, generator=g) > 0.4
    mask[..., -1, :] = False  # the last query row attends to nothing
    want = torch.nn.functional.scaled_dot_product_attention(q, k, v, mask)
    got = sdpa_with_additive_mask(q, k, v, mask)
    assert not want[..., -1, :].any() and not got[..., -1, :].any()
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)
    assert sdpa_with_additive_mask(q, k, v, mask.float()) is NotImplemented
    assert sdpa_with_additive_mask(q, k, v) is NotImplemented


class Attention(torch.nn.Module):
    def forward(self, q, k, v, mask):
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, mask)


@pytest.fixture(scope="module")
def padded(tmp_path_factory):
    """An attention whose mask leaves its last query row attending to nothing (a left-padded row), lowered
    for OpenVINO keeping the attention whole."""
    pytest.importorskip("openvino")
    g = torch.Generator().manual_seed(0)
    inputs = *(torch.randn(1, 2, n, 8, generator=g) for n in (5, 7, 7)), torch.rand(1, 1, 5, 7, generator=g) > 0.4
    inputs[3][..., -1, :] = False
    path = tmp_path_factory.mktemp("attention") / "m.pt2b"
    export_model(Attention(), inputs, path)
    lowered = load_for_backend(path, backend="openvino", cache=False)
    assert lowered.ops() == {"aten::scaled_dot_product_attention.default": 1}
    return lowered, inputs


def test_openvino_runs_a_row_that_attends_to_nothing_as_torch_does(padded):
    lowered, inputs = padded
    compiled = backends.to_backend(lowered)
    assert compiled.validation.status == "passed"
    got, want = compiled(*inputs), Attention()(*inputs)
    assert not want[..., -1, :].any() and not got[..., -1, :].any()
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


def test_without_the_additive_mask_openvinos_nan_is_caught_by_the_hand_off_check(padded, monkeypatch):
    """Why OpenVINO's hand-off rewrites boolean masks: its attention gives NaN on such a row."""
    from exporter.backends import attention

    lowered, _ = padded
    monkeypatch.setattr(attention, "additive_masks",
                        lambda ep, table=None, base=None: ep if base is None else ep.run_decompositions(base))
    with pytest.raises(BackendResultError, match="output has NaN or infinite values where the lowered program's "
                                                 "does not"):
        backends.to_backend(lowered)


def test_a_program_torch_cannot_retrace_is_handed_over_as_it_is(padded, monkeypatch):
    """The rewrite is for the backend's sake: where torch's retrace fails, the program goes as it is (and the
    hand-off check judges what the backend makes of it)."""
    from exporter.backends import attention

    _, inputs = padded
    ep = torch.export.export(Attention(), inputs)
    assert attention.boolean_masks(ep)
    monkeypatch.setattr(type(ep), "run_decompositions", lambda self, table: (_ for _ in ()).throw(
        RuntimeError("cannot retrace")))
    assert attention.additive_masks(ep) is ep
