"""Every lowering engine's program is taken by every installed backend's importer wherever torch's own
run_decompositions output is: the program each engine makes (node by node, the whole-program retrace,
repeated layers lowered once) handed to each backend installed here, checked against the lowered
program's run. The backends pt2b knows that are not installed are skipped: this file runs in each
backend's own venv too (.ci/run)."""

from __future__ import annotations

import pytest
import torch

from exporter import backends, export_model, load_for_backend
from exporter.errors import BackendUnavailableError
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
