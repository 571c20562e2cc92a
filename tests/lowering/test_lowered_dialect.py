"""A lowered program is what torch's run_decompositions output is to any ExportedProgram consumer,
whichever engine lowered it: the ATen dialect and its verifier (coremltools refuses "TRAINING"),
and ``meta["tensor_meta"]`` on every call that makes a tensor (StableHLO exporters read it)."""

from __future__ import annotations

import pytest
import torch

from exporter import export_model, load_for_backend
from tests.support.helpers import ENGINES, LayerStack, force_engine


@pytest.mark.parametrize("engine", ENGINES)
def test_each_engine_lowers_to_the_aten_dialect_with_tensor_metadata(tmp_path, monkeypatch, engine):
    torch.manual_seed(0)
    model, x = LayerStack().eval(), torch.randn(3, 16)
    ep = torch.export.export(model, (x,))
    export_model(ep, path=tmp_path / "m.pt2b")
    force_engine(engine, monkeypatch)
    lowered = load_for_backend(tmp_path / "m.pt2b", "core", cache=False)
    assert (lowered.reused is not None) == (engine == "reuse")
    ours, theirs = lowered.exported_program(), ep.run_decompositions()
    assert ours.dialect == theirs.dialect == "ATEN"
    assert [type(v) for v in ours.verifiers] == [type(v) for v in theirs.verifiers]
    ours.validate()  # torch's ATen verifier accepts the program
    missing = [n.name for n in ours.graph.nodes if n.op in ("placeholder", "call_function")
               and isinstance(n.meta.get("val"), torch.Tensor) and "tensor_meta" not in n.meta]
    assert not missing
    torch.testing.assert_close(lowered(x), theirs.module()(x), rtol=0, atol=0)


def test_a_lowering_served_from_the_cache_says_the_same(tmp_path, monkeypatch):
    monkeypatch.setenv("PT2B_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("PT2B_CACHE", raising=False)  # (the suite turns the cache off)
    export_model(LayerStack(2).eval(), (torch.randn(3, 16),), tmp_path / "m.pt2b")
    load_for_backend(tmp_path / "m.pt2b", "core")
    hit = load_for_backend(tmp_path / "m.pt2b", "core")
    assert hit.from_cache and hit.exported_program().dialect == "ATEN"
    assert all("tensor_meta" in n.meta for n in hit.exported_program().graph.nodes
               if n.op == "call_function" and isinstance(n.meta.get("val"), torch.Tensor))


@pytest.mark.parametrize("name", ["cnn_bn", "transformer_encoder", "buffer_mutation", "kwargs_only"])
def test_state_and_signature_are_laid_out_as_torchs_lowering_lays_them_out(tmp_path, name):
    """The same state_dict and constants, the same inputs by kind, as run_decompositions gives."""
    from tools.corpus.zoo import make_case

    case = make_case(name)
    ep = torch.export.export(case.model, case.args, kwargs=case.kwargs, dynamic_shapes=case.dynamic_shapes)
    export_model(ep, path=tmp_path / "m.pt2b", keep_unused_weights=True)
    ours = load_for_backend(tmp_path / "m.pt2b", "core", cache=False).exported_program()
    theirs = ep.run_decompositions()
    assert set(ours.state_dict) == set(theirs.state_dict) and set(ours.constants) == set(theirs.constants)
    assert [(s.kind, s.target) for s in ours.graph_signature.input_specs] == \
        [(s.kind, s.target) for s in theirs.graph_signature.input_specs]
    assert [(s.kind, s.target) for s in ours.graph_signature.output_specs] == \
        [(s.kind, s.target) for s in theirs.graph_signature.output_specs]
