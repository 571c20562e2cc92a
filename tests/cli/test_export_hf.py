"""`pt2b export --hf SOURCE --task TASK` and exporter.hf.export_hf: a transformers model built offline from a
model type, a config.json or a folder, exported for optimum-cli's task names; the file computes what the model does."""

from __future__ import annotations

import re
import warnings

import pytest
import torch

transformers = pytest.importorskip("transformers")

from exporter import load, load_for_backend  # noqa: E402
from exporter.cli import main as cli  # noqa: E402
from exporter.errors import ExportError  # noqa: E402
from exporter.hf import TASKS, export_hf  # noqa: E402
from runtime_ref import runtimes  # noqa: E402

SMALL = dict(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
             max_position_embeddings=64)
LLAMA = dict(SMALL, num_key_value_heads=2)
VIT = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, image_size=32, patch_size=8)
T5 = dict(vocab_size=64, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_decoder_layers=2, num_heads=4)


@pytest.fixture(autouse=True)
def offline(monkeypatch):
    """Nothing may be downloaded: the hub is off for every test here."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("TRANSFORMERS_OFFLINE", "1")


def reference(model_type: str, task: str, seed: int = 0, **overrides):
    """The model export_hf builds without weights: the task's auto class from the config, after manual_seed."""
    config = transformers.AutoConfig.for_model(model_type, **overrides)
    config.use_cache = task == "text-generation"   # as export_hf sets it
    torch.manual_seed(seed)
    return getattr(transformers, TASKS[task][0]).from_config(config).eval()


def exported(model_type, task, path, **overrides):
    with pytest.warns(UserWarning, match=re.escape(f"{model_type} holds no weights (no *.safetensors): the model's "
                                                   f"weights are random, {TASKS[task][0]}.from_config after "
                                                   "torch.manual_seed(0)")):
        return export_hf(model_type, task, path, **overrides)


@pytest.mark.parametrize("model_type, task, overrides, output", [
    ("bert", "feature-extraction", SMALL, "last_hidden_state"),
    ("bert", "text-classification", SMALL, "logits"),
    ("bert", "fill-mask", SMALL, "logits"),
    ("llama", "text-generation-no-cache", LLAMA, "logits"),
])
def test_text_tasks_match_the_model_at_other_sizes(tmp_path, model_type, task, overrides, output):
    prog = exported(model_type, task, tmp_path / "m.pt2b", **overrides)
    model = reference(model_type, task, **overrides)
    assert prog.metadata["transformers"] == {"task": task, "model_type": model_type, "class": type(model).__name__}
    assert {v for k, v in prog.provenance.items() if k.startswith("dim:")} == {"batch", "sequence"}
    for b, s in ((3, 7), (1, 5)):   # not the example's sizes (2, 4): batch and sequence are dynamic
        ids = torch.randint(0, 64, (b, s), generator=torch.Generator().manual_seed(b))
        mask = torch.ones_like(ids)
        mask[0, -1] = 0   # a padded position: the mask is an input, not a constant
        with torch.no_grad():
            want = getattr(model(input_ids=ids, attention_mask=mask), output)
        got = getattr(prog(input_ids=ids, attention_mask=mask), output)
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_image_classification_has_a_dynamic_batch(tmp_path):
    prog = exported("vit", "image-classification", tmp_path / "vit.pt2b", **VIT)
    model = reference("vit", "image-classification", **VIT)
    assert {v for k, v in prog.provenance.items() if k.startswith("dim:")} == {"batch"}
    pixels = torch.randn(3, 3, 32, 32, generator=torch.Generator().manual_seed(1))   # the config's image size
    with torch.no_grad():
        want = model(pixel_values=pixels).logits
    torch.testing.assert_close(prog(pixel_values=pixels).logits, want, rtol=1e-5, atol=1e-5)


def test_text_generation_is_prefill_and_decode_token_exact(tmp_path):
    prog = exported("llama", "text-generation", tmp_path / "gen.pt2b", max_cache_len=16, **LLAMA)
    assert list(prog.methods) == ["prefill", "decode"]
    lowered = load_for_backend(tmp_path / "gen.pt2b", "core", cache=False)
    model = reference("llama", "text-generation", **LLAMA)
    for prompt in (torch.tensor([[5, 17, 42, 9, 3, 60]]), torch.tensor([[7, 1]])):   # the prompt's length is dynamic
        rt, n = runtimes(lowered), prompt.shape[1]
        tokens = [int(rt["prefill"](input_ids=prompt, cache_position=torch.arange(n))[0, -1].argmax())]
        for pos in range(n, n + 3):
            logits = rt["decode"](input_ids=torch.tensor([[tokens[-1]]]), cache_position=torch.tensor([pos]))
            tokens.append(int(logits[0, -1].argmax()))
        want = model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=4, do_sample=False,
                              cache_implementation="static")
        assert tokens == want[0, n:].tolist()


def test_text2text_generation_is_encode_and_decode(tmp_path):
    prog = exported("t5", "text2text-generation", tmp_path / "t5.pt2b", **T5)
    assert list(prog.methods) == ["encode", "decode"]
    model = reference("t5", "text2text-generation", **T5)
    ids = torch.randint(0, 64, (3, 5), generator=torch.Generator().manual_seed(2))
    dec = torch.tensor([[0, 4], [0, 9], [0, 1]])
    with torch.no_grad():
        hidden = model.get_encoder()(input_ids=ids).last_hidden_state
        want = model(input_ids=ids, decoder_input_ids=dec, use_cache=False).logits[:, -1]
    got_hidden = prog["encode"](ids)
    torch.testing.assert_close(got_hidden, hidden, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(prog["decode"](dec, got_hidden), want, rtol=1e-5, atol=1e-5)


def test_a_folder_with_weights_loads_them(tmp_path):
    torch.manual_seed(123)   # not export_hf's seed: equal outputs mean the saved weights were loaded
    config = transformers.AutoConfig.for_model("bert", **SMALL)
    model = transformers.AutoModelForMaskedLM.from_config(config).eval()
    model.save_pretrained(tmp_path / "tiny")
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*holds no weights")
        assert cli(["--quiet", "export", "--hf", str(tmp_path / "tiny"), "--task", "fill-mask",
                    "-o", str(tmp_path / "m.pt2b")]) == 0
    ids = torch.randint(0, 64, (2, 9), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        want = model(input_ids=ids, attention_mask=torch.ones_like(ids)).logits
    got = load(tmp_path / "m.pt2b")(input_ids=ids, attention_mask=torch.ones_like(ids)).logits
    assert torch.equal(got, want)


def test_cli_dtype_batch_and_seq(tmp_path, capsys):
    """--dtype sets the weights' dtype, --batch and --seq the stored example's sizes; the file runs at others."""
    out, cfg = tmp_path / "m.pt2b", tmp_path / "cfg" / "config.json"
    transformers.AutoConfig.for_model("llama", **LLAMA).save_pretrained(cfg.parent)
    with pytest.warns(UserWarning, match="holds no weights"):
        assert cli(["--quiet", "export", "--hf", str(cfg), "--task", "text-generation-no-cache", "--dtype", "bfloat16",
                    "--batch", "3", "--seq", "5", "-o", str(out)]) == 0
    prog = load(out)
    ep = prog.exported_program()
    assert {t.dtype for t in ep.state_dict.values()} == {torch.bfloat16}
    assert ep.example_inputs[1]["input_ids"].shape == (3, 5)
    model = reference("llama", "text-generation-no-cache", **LLAMA).to(torch.bfloat16)
    ids = torch.randint(0, 64, (2, 7), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        want = model(input_ids=ids, attention_mask=torch.ones_like(ids)).logits
    torch.testing.assert_close(prog(input_ids=ids, attention_mask=torch.ones_like(ids)).logits, want,
                               rtol=1.6e-2, atol=1e-2)
    with pytest.warns(UserWarning, match="holds no weights"):
        assert cli(["export", "--hf", str(cfg), "--task", "text-generation-no-cache", "--batch", "1",
                    "-o", str(tmp_path / "b.pt2b")]) == 2
    assert "batch=1, seq=4: the example's sizes must be 2 or more" in capsys.readouterr().err
    assert not (tmp_path / "b.pt2b").exists()


def test_a_config_json_with_overrides(tmp_path):
    transformers.AutoConfig.for_model("bert", **SMALL).save_pretrained(tmp_path / "cfg")
    with pytest.warns(UserWarning, match="config.json holds no weights"):
        prog = export_hf(tmp_path / "cfg" / "config.json", "feature-extraction", tmp_path / "m.pt2b",
                         num_hidden_layers=1)
    model = reference("bert", "feature-extraction", **{**SMALL, "num_hidden_layers": 1})
    ids = torch.randint(0, 64, (2, 6), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        want = model(input_ids=ids, attention_mask=torch.ones_like(ids)).last_hidden_state
    torch.testing.assert_close(prog(input_ids=ids, attention_mask=torch.ones_like(ids)).last_hidden_state, want,
                               rtol=1e-5, atol=1e-5)


def test_a_task_the_model_has_no_class_for(tmp_path):
    with pytest.raises(ExportError, match=re.escape(
            "transformers has no text2text-generation model for model type 'bert' (AutoModelForSeq2SeqLM builds "
            "none); pt2b exports it for: feature-extraction, text-classification, fill-mask, text-generation, "
            "text-generation-no-cache.")):
        export_hf("bert", "text2text-generation", tmp_path / "m.pt2b", **SMALL)
    assert not (tmp_path / "m.pt2b").exists()


def test_bad_requests_fail_before_any_model_is_built(tmp_path, capsys):
    with pytest.raises(ExportError, match=re.escape("unknown task 'text-generaton'; Did you mean 'text-generation'? "
                                                    "pt2b exports transformers models for feature-extraction")):
        export_hf("llama", "text-generaton", tmp_path / "m.pt2b")
    with pytest.raises(SystemExit):
        cli(["export", "--hf", "llama", "--task", "text-generaton", "-o", str(tmp_path / "m.pt2b")])
    assert "Did you mean 'text-generation'?" in capsys.readouterr().err
    with pytest.raises(ExportError, match=r"'lama' is no folder, file or model type transformers .* knows; "
                                          r"Did you mean 'llama'\?"):
        export_hf("lama", "text-generation", tmp_path / "m.pt2b")
    with pytest.raises(ExportError, match=re.escape("'meta-llama/Llama-3.2-1B' does not exist; --hf takes a model "
                                                    "folder")):   # a hub name: nothing is downloaded
        export_hf("meta-llama/Llama-3.2-1B", "text-generation", tmp_path / "m.pt2b")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ExportError, match="is a folder without config.json"):
        export_hf(tmp_path / "empty", "fill-mask", tmp_path / "m.pt2b")
    for argv, message in ((["mypkg:make", "--hf", "llama", "--task", "fill-mask", "-o", "m.pt2b"],
                           "export either a transformers model (--hf SOURCE --task TASK) or what MODULE:CALLABLE "
                           "builds, not both"),
                          (["--hf", "llama", "-o", "m.pt2b"], "--hf needs --task, one of feature-extraction"),
                          (["mypkg:make", "m.pt2b", "--task", "fill-mask"], "--task, --max-cache-len, --dtype, --batch and --seq go "
                           "with --hf"),
                          (["mypkg:make", "m.pt2b", "--dtype", "bfloat16"], "--dtype, --batch and --seq go with --hf"),
                          (["--hf", "llama", "--task", "fill-mask"], "name the .pt2b to write"),
                          (["--hf", "bert", "--task", "fill-mask", "--max-cache-len", "8", "-o", "m.pt2b"],
                           "--max-cache-len is the KV cache's length of --task text-generation; fill-mask has no cache.")):
        assert cli(["export", *argv]) == 2
        assert message in capsys.readouterr().err
    assert not (tmp_path / "m.pt2b").exists()
