"""OpenVINO's stateful form: a program's floating state held in the compiled model's variables (its infer
request), so no call passes the KV cache in or out, with the Compiled's state contract kept: the same
tokens and state as the lifted form, reset, one state shared by an artifact's methods, a saved IR that
starts from the program's values."""

from __future__ import annotations

import pytest
import torch

from exporter import backends, export_model, load_for_backend
from exporter.errors import BackendHandOffError
from tools.corpus.methods import decoder_case

pytest.importorskip("openvino")


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    case = decoder_case()
    path = tmp_path_factory.mktemp("ovstate") / "llama.pt2b"
    export_model({name: case.export(name) for name in case.methods}, path)
    return case, load_for_backend(path, backend="openvino", cache=False)


def _call(compiled):
    return lambda name, args, kwargs: compiled[name](*args, **kwargs)


def test_the_stateful_form_holds_the_cache_in_variables_and_generates_what_eager_does(llama):
    case, lowered = llama
    compiled = backends.to_backend_methods(lowered)
    lifted = backends.to_backend_methods(lowered, stateful=False)
    decode = compiled["decode"]
    # the cache lives in the request: its variables, and no cache port in or out
    held = {v.name for v in decode.plan.request.query_state()}
    assert held == {f"state.{n}state_out.{n}" for n in ("key_cache_0", "value_cache_0", "key_cache_1", "value_cache_1")}
    ports = lambda c: (len(c.native.inputs), len(c.native.outputs))  # noqa: E731
    assert ports(lifted["decode"]) == (8, 7) and ports(decode) == (4, 3)  # ids, position, 2 lengths; logits, 2 lengths
    # (the int64 cumulative lengths stay inputs and outputs: the CPU plugin keeps no i64 variable)
    assert decode.validation.state == 6 and compiled["prefill"].state is decode.state
    want = case.eager_tokens()
    assert case.generate(_call(compiled)) == want == case.generate(_call(lifted)) and len(set(want)) > 1
    # the state after the same calls equals the lifted form's
    assert set(decode.state) == set(lifted["decode"].state)
    for name in decode.state:
        torch.testing.assert_close(decode.state[name], lifted["decode"].state[name], rtol=1e-5, atol=1e-6)
    assert decode.state["key_cache_0"][0, :, :case.prompt.shape[1] + case.n_new - 1].abs().sum(-1).all()
    assert not decode.state["key_cache_0"][0, :, case.prompt.shape[1] + case.n_new - 1:].any()
    decode.reset_state()  # a new sequence for both methods, the request's variables included
    assert not compiled["prefill"].state["key_cache_0"].any()
    assert case.generate(_call(compiled)) == want


def test_reading_the_state_between_calls_changes_nothing(llama):
    """A read pulls the variables back; the next call pushes them again: the logits are the same as
    when nothing is read, and a method switch moves the state once."""
    case, lowered = llama
    quiet, read = backends.to_backend_methods(lowered), backends.to_backend_methods(lowered)
    logits = {}
    for compiled, peek in ((quiet, False), (read, True)):
        def call(name, args, kwargs, compiled=compiled, peek=peek):
            out = compiled[name](*args, **kwargs)
            if peek:
                dict(compiled[name].state)
            logits.setdefault(id(compiled), []).append(out)
            return out
        case.generate(call)
    for a, b in zip(logits[id(quiet)], logits[id(read)]):
        assert torch.equal(a, b)


def test_the_saved_ir_is_stateful_and_starts_from_the_programs_values(llama, tmp_path):
    import numpy as np
    import openvino

    case, lowered = llama
    compiled = backends.to_backend_methods(lowered)
    compiled["decode"].save(tmp_path / "decode.xml")
    model = openvino.Core().read_model(tmp_path / "decode.xml")
    assert len(model.get_variables()) == 4
    request = openvino.Core().compile_model(model, "CPU", {"INFERENCE_PRECISION_HINT": "f32"}).create_infer_request()
    request.reset_state()
    assert all(not np.asarray(s.state.data).any() for s in request.query_state())  # the program's empty cache


def test_stateful_false_and_frozen_state_keep_their_forms(llama):
    _, lowered = llama
    lifted = backends.to_backend(lowered.methods["decode"], stateful=False)
    assert lifted.plan.request is None and len(lifted.native.inputs) == 8  # ids, position, six buffers
    frozen = backends.to_backend(lowered.methods["decode"], frozen_state=True)
    assert frozen.state is None and frozen.plan.request is None and len(frozen.native.inputs) == 2
    with pytest.raises(BackendHandOffError, match="takes no option 'carry'"):
        backends.to_backend(lowered.methods["decode"], carry=None)


def _runtime_layers(compiled) -> set[str]:
    return {op.get_rt_info()["layerType"].astype(str) for op in compiled.native.get_runtime_model().get_ops()}


def test_the_rotary_embedding_reaches_openvino_in_the_form_its_cpu_plugin_fuses(llama, monkeypatch):
    """``neg`` handed over as a product with -1: OpenVINO's CPU plugin then fuses each layer's rotary
    embedding into its own RoPE; from ``neg`` as its converter makes it, it does not. The tokens stay
    eager's either way."""
    from exporter.backends import openvino

    case, lowered = llama
    fused = backends.to_backend_methods(lowered)
    assert "RoPE" in _runtime_layers(fused["decode"])
    assert case.generate(_call(fused)) == case.eager_tokens()
    monkeypatch.setattr(openvino, "_REWRITES", {})
    assert "RoPE" not in _runtime_layers(backends.to_backend_methods(lowered)["decode"])


def test_each_variable_has_its_buffers_static_shape(llama):
    """The converter makes every input dynamic; a variable is a buffer, whose shape is fixed, and a static
    variable is one OpenVINO's CPU plugin updates where it is."""
    import openvino

    case, lowered = llama
    decode = backends.to_backend_methods(lowered)["decode"]
    shapes = {v.get_info().variable_id: v.get_info().data_shape for v in decode.plan.model.get_variables()}
    state = decode.state
    assert len(shapes) == 4
    for name in ("key_cache_0", "value_cache_0", "key_cache_1", "value_cache_1"):
        assert shapes[f"state.{name}state_out.{name}"] == openvino.PartialShape(list(state[name].shape)), name
