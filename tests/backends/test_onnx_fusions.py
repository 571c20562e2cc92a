"""The ONNX hand-off's ``fusions`` option: the graph fused into ONNX Runtime's own ops (attention, rotary
embeddings, skip norms) for a provider, by transformers' fusions where installed and onnxscript's where
they are missing or fail, with the tokens and the state of the unfused form and the hand-off check run
on the fused model."""

from __future__ import annotations

import collections
import subprocess
import sys
import warnings

import pytest
import torch

from exporter import backends, export_model, load_for_backend
from exporter.errors import BackendHandOffError, LibraryTableWarning
from tools.corpus.methods import decoder_case

pytest.importorskip("onnxruntime")
pytest.importorskip("onnxscript")

# ops of ONNX Runtime's own domain that a Llama's fusions make: only a fused graph holds them
FUSED = {"MultiHeadAttention", "GroupQueryAttention", "RotaryEmbedding", "SkipSimplifiedLayerNormalization",
         "SimplifiedLayerNormalization"}


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    case = decoder_case()
    path = tmp_path_factory.mktemp("onnxfusions") / "llama.pt2b"
    export_model({name: case.export(name) for name in case.methods}, path)
    return case, path, load_for_backend(path, backend="onnx", cache=False)


def _ops(compiled) -> collections.Counter:
    return collections.Counter((n.domain, n.op_type) for n in compiled.native.model.graph)


def _fused_ops(compiled) -> set[str]:
    return {op for domain, op in _ops(compiled) if domain == "com.microsoft" and op in FUSED}


def _tokens(case, compiled) -> list[int]:
    return case.generate(lambda name, args, kwargs: compiled[name](*args, **kwargs))


def test_fused_decoder_gives_the_unfused_tokens_with_ort_ops_and_fewer_nodes(llama):
    case, _, lowered = llama
    plain, fused = backends.to_backend_methods(lowered), backends.to_backend_methods(lowered, fusions="cpu")
    decode, fused_decode = plain["decode"], fused["decode"]
    assert not _fused_ops(decode)
    # the attention over the static cache, its rotary embedding folded in: ONNX Runtime's grouped-query attention
    assert {"GroupQueryAttention", "SkipSimplifiedLayerNormalization"} <= _fused_ops(fused_decode)
    assert sum(_ops(fused_decode).values()) < 0.75 * sum(_ops(decode).values())
    # the hand-off check ran on the fused model and its held state
    assert fused_decode.validation.status == "passed" and fused_decode.validation.state == 6
    assert fused_decode.plan.holder is not None
    want = case.eager_tokens()
    assert _tokens(case, fused) == want == _tokens(case, plain) and len(set(want)) > 1
    for name in decode.state:
        assert torch.allclose(fused_decode.state[name].float(), decode.state[name].float(), rtol=1e-4, atol=1e-5), name


def test_onnxscript_fuses_where_transformers_fusions_are_missing(llama, monkeypatch):
    from exporter.backends import library_tables

    case, _, lowered = llama
    monkeypatch.setattr(library_tables, "transformers_ort_fusions", lambda: None)
    fused = backends.to_backend_methods(lowered, fusions="cpu")
    # onnxscript's own fusions (its norms); the grouped-query attention over a cache is transformers' alone
    assert "SkipSimplifiedLayerNormalization" in _fused_ops(fused["decode"])
    assert "GroupQueryAttention" not in _fused_ops(fused["decode"])
    assert _tokens(case, fused) == case.eager_tokens()


def test_a_failing_transformers_fusion_falls_back_on_a_fresh_export_with_a_warning(llama, monkeypatch):
    """transformers' fusions edit the model in place: one that fails halfway (here after removing the graph's
    nodes' names) leaves a model nothing should run, so the fallback fuses a fresh export."""
    from exporter.backends import library_tables

    case, _, lowered = llama

    def broken(model, provider):
        assert provider == "cpu"
        model.graph.remove(next(iter(model.graph)), safe=False)  # half done: a node gone
        raise KeyError("a private name this transformers lacks")

    monkeypatch.setattr(library_tables, "transformers_ort_fusions", lambda: broken)
    with pytest.warns(LibraryTableWarning, match=r"onnx: transformers' ONNX Runtime fusions failed on this program "
                                                 r"\(KeyError: 'a private name this transformers lacks'\); fused "
                                                 r"with onnxscript's optimize_for_ort instead"):
        fused = backends.to_backend_methods(lowered, fusions="cpu")
    assert fused["decode"].validation.status == "passed"
    assert "SkipSimplifiedLayerNormalization" in _fused_ops(fused["decode"])
    assert _tokens(case, fused) == case.eager_tokens()


def test_without_fusions_nothing_warns_and_the_graph_is_torch_onnxs(llama, monkeypatch):
    from exporter.backends import library_tables

    _, _, lowered = llama
    monkeypatch.setattr(library_tables, "transformers_ort_fusions", lambda: pytest.fail("fusions asked for"))
    with warnings.catch_warnings():
        warnings.simplefilter("error", LibraryTableWarning)
        compiled = backends.to_backend(lowered.methods["decode"])
    assert not _fused_ops(compiled)


@pytest.mark.parametrize("options, message", [
    ({"fusions": "tpu"}, "onnx: fusions='tpu' names no ONNX Runtime provider pt2b fuses for; pass one of cpu, "
                         "cuda, webgpu, dml, or leave fusions out"),
    ({"fusions": "cpu", "optimize": False}, "onnx: fusions need torch.onnx's optimized graph (they match its "
                                            "forms); drop optimize=False or leave fusions out"),
])
def test_fusions_that_cannot_be_made_are_a_typed_error_naming_what_to_pass(llama, options, message):
    _, _, lowered = llama
    with pytest.raises(BackendHandOffError) as raised:
        backends.to_backend(lowered.methods["prefill"], **options)
    assert message in str(raised.value)


def test_pt2b_lower_writes_a_fused_onnx_file_onnxruntime_runs_alone(llama, tmp_path):
    """``pt2b lower --to onnx --option fusions=cpu``: a file of ORT's own ops that onnxruntime loads and runs in
    a fresh process with no pt2b imported (ORT's contrib ops are its own: no custom library to register)."""
    _, path, _ = llama
    out = tmp_path / "decode.onnx"
    from tests.support.cli_run import run_cli

    code, _, err = run_cli("lower", path, "--method", "decode", "--to", "onnx", "--option", "fusions=cpu", "-o", out,
                           "--no-cache")
    assert code == 0, err
    script = (
        "import sys, numpy as np, onnx, onnxruntime as ort\n"
        "m = onnx.load(sys.argv[1])\n"
        "assert any(n.domain == 'com.microsoft' and n.op_type == 'GroupQueryAttention' for n in m.graph.node)\n"
        "s = ort.InferenceSession(sys.argv[1], providers=['CPUExecutionProvider'])\n"
        "types = {'tensor(int64)': np.int64, 'tensor(float)': np.float32, 'tensor(bool)': bool}\n"
        "feed = {i.name: np.zeros([d if isinstance(d, int) else 1 for d in i.shape], types[i.type])"
        " for i in s.get_inputs()}\n"
        "outs = s.run(None, feed)\n"
        "assert 'exporter' not in sys.modules and all(np.isfinite(o).all() for o in outs if o.dtype == np.float32)\n"
        "print(len(outs))\n")
    done = subprocess.run([sys.executable, "-c", script, str(out)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert int(done.stdout) >= 1


def test_without_the_additive_mask_transformers_fusions_find_no_grouped_query_attention(llama, monkeypatch):
    """Why the fused hand-off rewrites boolean masks: torchlib's boolean attention is a form ONNX Runtime's
    attention fusions do not match."""
    from exporter.backends import attention

    _, _, lowered = llama
    monkeypatch.setattr(attention, "additive_masks",
                        lambda ep, table=None, base=None: ep if base is None else ep.run_decompositions(base))
    fused = backends.to_backend(lowered.methods["decode"], fusions="cpu")
    assert "GroupQueryAttention" not in _fused_ops(fused)
