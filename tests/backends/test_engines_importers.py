"""Every lowering engine's program is taken by every installed backend's importer wherever torch's own
run_decompositions output is: the program each engine makes (node by node, the whole-program retrace,
repeated layers lowered once) handed to each backend installed here, checked against the lowered
program's run. The backends pt2b knows that are not installed are skipped: this file runs in each
backend's own venv too (.ci/run)."""

from __future__ import annotations

import pytest
import torch

from exporter import backends, export_model, load_for_backend
from exporter.errors import BackendHandOffError, BackendUnavailableError
from tests.support.helpers import ENGINES, LayerStack, force_engine

pytestmark = pytest.mark.backends  # (run in each backend's venv by .ci/run, and by the main suite)

SLOW = {"inductor"}  # (an AOTInductor compile per engine: its own tests cover it)


def _installed() -> list[str]:
    found = []
    for name in backends.names():
        try:
            backends.get(name)
        except BackendUnavailableError:
            continue
        found.append(name)
    return found


@pytest.fixture(scope="module")
def artifact(tmp_path_factory):
    torch.manual_seed(0)
    model, x = LayerStack().eval(), torch.randn(3, 16)
    path = tmp_path_factory.mktemp("engines") / "stack.pt2b"
    export_model(model, (x,), path)
    return path, model, x


@pytest.mark.parametrize("backend", [b for b in _installed() if b not in SLOW])
@pytest.mark.parametrize("engine", ENGINES)
def test_each_engines_program_is_taken_where_torchs_is(artifact, monkeypatch, engine, backend):
    path, model, x = artifact
    torch_program = torch.export.export(model, (x,)).run_decompositions(backends.get(backend).decompositions())
    theirs = backends.to_backend(backend, torch_program, validate=False)  # torch's own: the importer takes it
    force_engine(engine, monkeypatch)
    lowered = load_for_backend(path, backend=backend, cache=False)
    assert (lowered.reused is not None) == (engine == "reuse")
    ours = backends.to_backend(lowered)
    assert ours.validation.status in ("passed", "skipped")  # (skipped: a backend that does not run here)
    if ours.backend.runs_here:
        with torch.no_grad():
            want = model(x)
        torch.testing.assert_close(ours(x), want, rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(theirs(x), want, rtol=1e-4, atol=1e-4)


class _SizesBeside(torch.nn.Module):
    """Hidden states with Python numbers beside them (the spatial sizes MaskFormer's Swin backbone
    returns), which torch.export records as constant outputs."""

    def forward(self, x):
        h, w = x.shape[-2:]
        return {"hidden": x.flatten(2).relu(), "sizes": ((h, w), (h // 2, w // 2)), "scale": 0.5,
                "pooled": x.mean((2, 3))}


# litert-torch's converter fails on such a program with the numbers as without them (its view-to-reshape
# retrace leaves a lambda in the graph its verifier then refuses; before, its MLIR return refused the
# numbers: "Operand 1 of operation func.return must be a Value")
_REFUSES_THE_PROGRAM = {"litert"}


@pytest.mark.parametrize("backend", [pytest.param(b, marks=pytest.mark.xfail(
    raises=BackendHandOffError, strict=True, reason="litert-torch's converter")) if b in _REFUSES_THE_PROGRAM else b
    for b in _installed()])
def test_a_program_returning_numbers_is_handed_over_without_them_and_gets_them_back(tmp_path, backend):
    """No backend is handed a constant output (torch.onnx and OpenVINO refused them); every backend's
    run gives the numbers back at their places, beside the values it computed."""
    x = torch.randn(2, 3, 4, 6)
    export_model(_SizesBeside(), (x,), tmp_path / "sizes.pt2b")
    lowered = load_for_backend(tmp_path / "sizes.pt2b", backend=backend, cache=False)
    compiled = backends.to_backend(lowered)
    assert compiled.validation.status in ("passed", "skipped")  # (skipped: a backend that does not run here)
    if compiled.backend.runs_here:
        got, want = compiled(x), _SizesBeside()(x)
        assert list(got) == list(want) and got["sizes"] == ((4, 6), (2, 3)) and got["scale"] == 0.5
        torch.testing.assert_close(got["hidden"], want["hidden"])
        torch.testing.assert_close(got["pooled"], want["pooled"])
