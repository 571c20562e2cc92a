"""The hand-off check of a program that draws random numbers: the values computed from a draw are
compared by shape and dtype only (the backend's generator is not torch's, so two runs agree only by
chance); every other output is compared as always."""

import pytest
import torch

from exporter import backends
from exporter.backends import Backend, Compiled, validation
from exporter.errors import BackendResultError
from exporter.lowering.verdicts import WRONG_REL


class _Noisy(torch.nn.Module):
    """vit_mae's masking in small: a float and an integer output computed from a draw, one that is not."""

    def forward(self, x):
        noise = torch.rand_like(x)
        return x * 2 + 1, x + noise, (noise > 0.5).sum(-1)


def _backend(change):
    """A backend running the program itself (its own draws), its outputs passed through ``change``."""
    run = lambda native, program, args, kwargs: change(program.module()(*args, **kwargs))  # noqa: E731
    return Backend("changed", "1", (), "", dict, lambda ep: (None, ep), run)


def _ep():
    return torch.export.export(_Noisy(), (torch.randn(3, 16),))


def test_outputs_computed_from_draws_are_compared_by_shape_and_dtype_only():
    ep = _ep()
    got = validation.validated_hand_off(Compiled(_backend(lambda out: out), None, ep), ep, WRONG_REL)
    assert got.status == "passed" and got.outputs == 3
    assert got.random == ("output[1]", "output[2]") and got.draws == ("aten::rand_like.default",)
    assert "of them output[1], output[2] computed from random draws (aten::rand_like.default), compared by " \
           "shape and dtype only" in got.describe()


def test_an_output_no_draw_reaches_is_still_compared():
    ep = _ep()
    wrong = _backend(lambda out: (out[0] * 1.01, *out[1:]))
    with pytest.raises(BackendResultError, match=r"changed@1: output\[0\] \(torch.float32\) differs from the "
                                                 r"lowered program's by [0-9.e-]+ \(relative\), beyond 0.001"):
        validation.validated_hand_off(Compiled(wrong, None, ep), ep, WRONG_REL)


@pytest.mark.parametrize("change, what", [
    (lambda out: (out[0], out[1][:2], out[2]), r"output\[1\] is \(2, 16\) torch.float32 where the lowered "
                                               r"program gives \(3, 16\) torch.float32"),
    (lambda out: (out[0], out[1], out[2].int()), r"output\[2\] is \(3,\) torch.int32 where the lowered program "
                                                 r"gives \(3,\) torch.int64"),
])
def test_a_drawn_output_of_another_shape_or_dtype_is_caught(change, what):
    ep = _ep()
    with pytest.raises(BackendResultError, match=what):
        validation.validated_hand_off(Compiled(_backend(change), None, ep), ep, WRONG_REL)


def test_a_program_that_draws_runs_on_onnx_checked():
    """Before, the check compared ONNX Runtime's draws with torch's and refused the program as 'the
    backend computes something else' (vit_mae's random masking)."""
    pytest.importorskip("onnxruntime")
    ep = _ep()
    compiled = backends.to_backend("onnx", ep)
    assert compiled.validation.status == "passed" and compiled.validation.random == ("output[1]", "output[2]")
    x = torch.randn(3, 16)
    clean, noisy, count = compiled(x)
    assert torch.allclose(clean, x * 2 + 1)
    noise = noisy - x  # (ONNX Runtime's own draws, uniform on [0, 1) as torch's)
    assert noise.min() >= -1e-6 and noise.max() < 1 + 1e-6 and count.dtype == torch.int64
