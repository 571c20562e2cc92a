"""The backend matrix's cases routed to where each backend is installed: one case per model for the
backends of this interpreter, one per model and backend named with --python (that venv's python; on
Ray, the nodes offering its resource), their records merged into the model's."""

from __future__ import annotations

import pytest

from exporter.errors import SweepError
from tools import backend_matrix, real_models


def test_backends_of_other_venvs_get_cases_of_their_own():
    cases, model_of = real_models.routed_cases(["m1", "m2"], None, ["onnx", "executorch"],
                                               {"executorch": "/venvs/et/bin/python"}, ray=None)
    assert [c.id for c in cases] == ["m1", "m1@executorch", "m2", "m2@executorch"]
    assert model_of == {"m1": "m1", "m1@executorch": "m1", "m2": "m2", "m2@executorch": "m2"}
    here, there = cases[0], cases[1]
    assert (here.kwargs, here.interpreter, here.backend, here.resources) == ({"backends": ["onnx"]}, None, None, None)
    assert (there.kwargs, there.interpreter, there.backend) == ({"backends": ["executorch"]}, "/venvs/et/bin/python",
                                                                 "executorch")
    assert there.args == here.args and there.resources is None  # (one machine: the interpreter says where)
    on_ray, _ = real_models.routed_cases(["m1"], None, ["executorch"], {"executorch": "/venvs/et/bin/python"}, "auto")
    assert [c.id for c in on_ray] == ["m1@executorch"]  # every backend elsewhere: no case here
    assert on_ray[0].resources == {"backend_executorch": real_models.ROUTE_AMOUNT}
    corpus, _ = real_models.routed_cases(["m1"], "capture", None, None, None)
    assert [(c.id, c.kwargs) for c in corpus] == [("m1", {})]


def test_a_place_for_a_backend_the_sweep_does_not_run_is_refused():
    with pytest.raises(SweepError, match=r"--python names backends the sweep does not run \(iree\)"):
        real_models.routed_cases(["m1"], None, ["onnx"], {"iree": "/venvs/iree/bin/python"}, None)
    with pytest.raises(SystemExit, match="give BACKEND=PYTHON"):
        backend_matrix._place("/venvs/iree/bin/python")


def test_a_models_records_from_two_cases_are_one():
    here = {"name": "m1", "stages": {"build": {"status": "ok"}, "lower:onnx": {"status": "ok"}},
            "owner": {"onnx": "pt2b"}, "pt2b": "v1"}
    there = {"name": "m1", "stages": {"build": {"status": "error"}, "lower:executorch": {"status": "ok"}},
             "owner": {"executorch": "backend"}, "pt2b": "v2"}
    got = real_models.merge_record(here, there)
    assert got["stages"] == {"build": {"status": "ok"}, "lower:onnx": {"status": "ok"}, "lower:executorch": {"status": "ok"}}
    assert got["owner"] == {"onnx": "pt2b", "executorch": "backend"} and got["pt2b"] == "v1, v2"
    assert here["stages"] == {"build": {"status": "ok"}, "lower:onnx": {"status": "ok"}}  # (neither changed)


def test_a_case_named_to_run_again_runs_again_in_the_backends_venv_too(tmp_path, monkeypatch):
    """--again names models; a model's case in another venv has the id "model@backend", and runs again too."""
    from exporter import sweep

    seen = {}

    def iterate(cases, journal, *, redo, **kw):
        seen.update({c.id: redo({"id": c.id}) for c in cases})
        return iter(())

    monkeypatch.setattr(sweep, "iterate", iterate)
    real_models.sweep(["m1", "m2"], workers=1, timeout=1.0, stop_after=None, out_path=str(tmp_path / "out.json"),
                      log_dir=str(tmp_path), progress=False, backends=["onnx", "executorch"], redo={"m1"},
                      places={"executorch": "/venvs/et/bin/python"})
    assert seen == {"m1": True, "m1@executorch": True, "m2": False, "m2@executorch": False}
