"""Multi-method artifacts of real transformers models: a tiny Llama in transformers' static-cache
export wrapper (prefill + decode over one KV cache) and a tiny T5 (encode + decode), each written as
ONE artifact; greedy generation over the loaded artifact, and over its core lowering on runtime_ref,
gives the eager model's tokens."""

from __future__ import annotations

import pytest

pytest.importorskip("transformers")

from exporter import export_model, load, load_for_backend  # noqa: E402
from exporter.serialize import reader  # noqa: E402
from tools.corpus.methods import decoder_case, seq2seq_case  # noqa: E402
from runtime_ref import runtimes  # noqa: E402


@pytest.fixture(scope="module", params=[decoder_case, seq2seq_case], ids=["llama_prefill_decode", "t5_encode_decode"])
def case_and_artifact(request, tmp_path_factory):
    case = request.param()
    expected = case.eager_tokens()
    assert len(set(expected)) > 1, "random weights that generate one token prove little"
    path = tmp_path_factory.mktemp("m") / "model.pt2b"
    dynamic = {k: v for k, v in case.dynamic_shapes.items() if v is not None}
    export_model(case.methods, path, dynamic_shapes=dynamic, strict=case.strict)
    first = next(iter(case.methods))  # the same model written with its first method only
    export_model({first: case.methods[first]}, path.with_name("one.pt2b"),
                 dynamic_shapes={k: v for k, v in dynamic.items() if k == first}, strict=case.strict)
    return case, expected, path


def call_with(get):
    return lambda name, args, kwargs: get(name)(*args, **(kwargs or {}))


def test_generation_over_the_loaded_artifact_matches_eager(case_and_artifact):
    case, expected, path = case_and_artifact
    prog = load(path)
    assert list(prog.methods) == list(case.methods)
    assert case.generate(call_with(prog.__getitem__)) == expected


def test_generation_on_runtime_ref_matches_eager(case_and_artifact):
    case, expected, path = case_and_artifact
    lowered = load_for_backend(path, "core")
    assert all(low.validation.status == "passed" for low in lowered.methods.values())
    rts = runtimes(lowered)
    assert case.generate(call_with(rts.__getitem__)) == expected
    again = runtimes(load_for_backend(path, "core"))  # a fresh state: the same tokens again
    assert case.generate(call_with(again.__getitem__)) == expected


def test_the_weights_are_stored_once(case_and_artifact):
    case, _, path = case_and_artifact
    art, one = reader.open_artifact(path), reader.open_artifact(path.with_name("one.pt2b"))
    state = [{r.name: r.segment for r in reader.method(art, n).program.tensors if r.kind != 3}
             for n in art.method_names]
    assert state[0] == state[1] and len(state[0]) > 10  # every method's weights and buffers: the same segments

    def weight_bytes(a):
        example = {r.segment for n in a.method_names for r in reader.method(a, n).program.tensors if r.kind == 3}
        return sum(int(s.nbytes) for i, s in enumerate(a.program.segments) if i not in example)

    assert weight_bytes(art) == weight_bytes(one)
