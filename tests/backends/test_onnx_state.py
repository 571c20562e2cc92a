"""ONNX Runtime holding a lifted program's state between calls (onnx's ``stateful``, the default): the
KV cache stays in its own values from call to call, with the Compiled's state contract kept: the same
tokens and state as the form that passes it through torch, reads that change nothing, reset, one
state shared by an artifact's methods, a saved file that still takes and returns the state by name."""

from __future__ import annotations

import pytest
import torch

from exporter import backends, export_model, load_for_backend
from tools.corpus.methods import decoder_case

pytest.importorskip("onnxruntime")
pytest.importorskip("onnxscript")

CACHES = ("key_cache_0", "value_cache_0", "key_cache_1", "value_cache_1")


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    case = decoder_case()
    path = tmp_path_factory.mktemp("onnxstate") / "llama.pt2b"
    export_model({name: case.export(name) for name in case.methods}, path)
    return case, load_for_backend(path, backend="onnx", cache=False)


def _call(compiled, seen=None):
    def call(name, args, kwargs):
        out = compiled[name](*args, **kwargs)
        if seen is not None:
            seen.append(out)
        return out
    return call


def test_the_tiny_llama_generates_what_transformers_generates(tmp_path):
    from tests.support.helpers import generates_what_transformers_generates

    generates_what_transformers_generates(("onnx",), tmp_path)


def test_onnx_runtime_holds_the_cache_and_the_state_equals_the_form_without_it(llama):
    case, lowered = llama
    held, lifted = backends.to_backend_methods(lowered), backends.to_backend_methods(lowered, stateful=False)
    decode = held["decode"]
    # the floating caches are held; the int64 lengths the program also writes are held too (ORT keeps any dtype)
    assert set(CACHES) <= decode.plan.holder.names and lifted["decode"].plan.holder is None
    assert decode.validation.state == 6 and held["prefill"].state is decode.state
    want = case.eager_tokens()
    assert case.generate(_call(held)) == want == case.generate(_call(lifted)) and len(set(want)) > 1
    assert decode.plan.holder.values  # the last call's values stay in ONNX Runtime until read
    assert set(decode.state) == set(lifted["decode"].state)
    for name in decode.state:
        assert torch.equal(decode.state[name], lifted["decode"].state[name]), name
    assert not decode.plan.holder.values  # read: pulled back to torch
    filled = case.prompt.shape[1] + case.n_new - 1
    assert decode.state["key_cache_0"][0, :, :filled].abs().sum(-1).all()
    assert not decode.state["key_cache_0"][0, :, filled:].any()


def test_reading_the_state_between_calls_changes_nothing(llama):
    """A read pulls the held values back; the next call pushes them again: the logits are bitwise those
    of the run where nothing is read, and the state after it too."""
    case, lowered = llama
    quiet, read = backends.to_backend_methods(lowered), backends.to_backend_methods(lowered)
    plain, peeked = [], []
    case.generate(_call(quiet, plain))

    def call(name, args, kwargs):
        out = read[name](*args, **kwargs)
        dict(read[name].state)
        peeked.append(out)
        return out
    case.generate(call)
    assert len(plain) == len(peeked) > 2
    for a, b in zip(plain, peeked):
        assert torch.equal(a, b)
    for name in quiet["decode"].state:
        assert torch.equal(quiet["decode"].state[name], read["decode"].state[name]), name


def test_reset_starts_a_new_sequence_for_both_methods(llama):
    case, lowered = llama
    compiled = backends.to_backend_methods(lowered)
    first = []
    want = case.generate(_call(compiled, first))
    assert compiled["decode"].plan.holder.values  # held when reset comes: what it holds is dropped
    compiled["decode"].reset_state()
    assert not compiled["prefill"].state["key_cache_0"].any()
    again = []
    assert case.generate(_call(compiled, again)) == want
    for a, b in zip(first, again):
        assert torch.equal(a, b)


def test_a_wrong_state_from_onnx_runtime_is_caught(llama, monkeypatch):
    """The hand-off check reads the state the holder holds: a holder that hands back something else is a
    BackendResultError naming the buffer."""
    from exporter.backends import onnx
    from exporter.errors import BackendResultError

    _, lowered = llama
    pull = onnx.Held.pull
    monkeypatch.setattr(onnx.Held, "pull", lambda self: {n: v * 1.01 if v.is_floating_point() else v
                                                           for n, v in pull(self).items()})
    with pytest.raises(BackendResultError, match=r"onnx@.*: state\['key_cache_0'\] \(torch.float32\) differs from "
                                                 r"the lowered program's by [0-9.e-]+ \(relative\), beyond 0.001"):
        backends.to_backend(lowered.methods["prefill"])
