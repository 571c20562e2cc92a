"""Fast unit tests of the real-model corpus builder (tools/corpus/transformers_zoo.py) itself: the config
shrinking rules keep the relations transformers' validators and modeling code rely on, the input recipes have
the shapes each family's forward takes, and make_case stays deterministic. The models themselves go through
the pipeline in tests/corpora/test_real_models.py."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

pytest.importorskip("transformers")

import torch  # noqa: E402

from tools.corpus import transformers_zoo as z  # noqa: E402


def _shrink(d: dict) -> dict:
    return z._shrink_level(d, d)


def test_mla_head_dim_keeps_its_relation():
    # DeepSeek: head_dim is the rotary part; Mistral 4: head_dim is the whole q/k head (nope + rope)
    ds = _shrink({"hidden_size": 4096, "num_attention_heads": 32, "kv_lora_rank": 512, "qk_rope_head_dim": 64,
                  "qk_nope_head_dim": 128, "head_dim": 64, "v_head_dim": 128})
    assert ds["head_dim"] == ds["qk_rope_head_dim"]
    m4 = _shrink({"hidden_size": 4096, "num_attention_heads": 32, "kv_lora_rank": 512, "qk_rope_head_dim": 64,
                  "qk_nope_head_dim": 64, "head_dim": 128, "v_head_dim": 128})
    assert m4["head_dim"] == m4["qk_rope_head_dim"] + m4["qk_nope_head_dim"]


def test_per_layer_overrides_are_shrunk_as_whole_layers():
    # a layer override holding only the fields that differ (Dots3's sliding layers): its head_dim relation holds
    d = {"hidden_size": 4096, "num_attention_heads": 32, "num_hidden_layers": 4, "kv_lora_rank": 512,
         "qk_rope_head_dim": 64, "qk_nope_head_dim": 128, "head_dim": 256, "v_head_dim": 128,
         "layer_types": ["full_attention", "sliding_attention", "full_attention", "sliding_attention"],
         "per_layer_config": {"01": {"qk_nope_head_dim": 192, "num_attention_heads": 16}}}
    s = _shrink(d)
    (layer,) = s["per_layer_config"].values()
    merged = {**s, **layer}
    assert merged["head_dim"] == merged["qk_nope_head_dim"] + merged["qk_rope_head_dim"]


def test_widths_tied_to_hidden_size_follow_it():
    s = _shrink({"hidden_size": 512, "num_attention_heads": 8, "upsample_groups": 512, "codebook_dim": 512,
                 "adapter_in_dim": 512, "max_position_embeddings": 512, "vocab_size": 512})
    assert s["upsample_groups"] == s["codebook_dim"] == s["adapter_in_dim"] == s["hidden_size"] == z.H
    assert s["max_position_embeddings"] == 512  # not a width


def test_layer_stack_parts_still_add_up():
    s = _shrink({"hidden_size": 512, "num_attention_heads": 8, "num_hidden_layers": 72, "n_input_layers": 16,
                 "n_recurrent_layers": 40, "n_output_layers": 16})
    assert s["n_input_layers"] + s["n_recurrent_layers"] + s["n_output_layers"] == s["num_hidden_layers"]


def test_backbone_keeps_one_layer_per_neck_input():
    d = {"model_type": "dpt", "neck_hidden_sizes": [96, 192, 384, 768],
         "backbone_config": {"model_type": "dinov2", "hidden_size": 384, "num_attention_heads": 6,
                             "num_hidden_layers": 12, "out_indices": [9, 10, 11, 12],
                             "out_features": ["stage9", "stage10", "stage11", "stage12"]}}
    bb = _shrink(d)["backbone_config"]
    assert bb["num_hidden_layers"] == 4 and bb["out_indices"] == [1, 2, 3, 4]
    top = _shrink({"model_type": "dinov2", "hidden_size": 384, "num_attention_heads": 6, "num_hidden_layers": 12,
                   "out_indices": [9, 10, 11, 12]})
    assert top["num_hidden_layers"] == z.L  # only backbones of another model keep the extra layers


def test_static_cache_fixups_size_the_cache_the_wrapper_allocates():
    mla = z._static_cache_fixups({"kv_lora_rank": 32, "qk_rope_head_dim": 8, "head_dim": 8,
                                  "num_key_value_heads": 4, "num_attention_heads": 4})
    assert mla["kv_lora_rank"] == mla["qk_rope_head_dim"] == mla["head_dim"]
    assert mla["num_key_value_heads"] == mla["num_attention_heads"] == 1  # no key/value repeat under tracing
    nested = z._static_cache_fixups({"text_config": {"kv_lora_rank": 32, "qk_rope_head_dim": 8, "head_dim": 8}})
    assert nested["text_config"]["kv_lora_rank"] == 8
    falcon = z._static_cache_fixups({"multi_query": True, "num_kv_heads": 4, "num_attention_heads": 4})
    assert falcon["multi_query"] is False


def test_forecasting_configs_get_a_horizon():
    d = z._validity_fixups({"prediction_length": None, "context_length": None, "lags_sequence": [1, 2, 3],
                            "num_time_features": 0, "label_length": 10, "feature_size": 9})
    assert d["prediction_length"] == 8 and d["context_length"] == 16 and d["label_length"] <= 16
    assert d["num_time_features"] > 0 and "feature_size" not in d  # recomputed by the config class


@pytest.mark.parametrize("params,cfg,shapes", [
    # TimesFM: (B, T) series plus a padding indicator and a frequency id
    ({"past_values", "past_values_padding", "freq"}, {"context_length": 64, "horizon_length": 16},
     {"past_values": (z.BATCH, 64), "past_values_padding": (z.BATCH, 64), "freq": (z.BATCH, 1)}),
    # PatchTST: (B, context_length, channels)
    ({"past_values", "past_observed_mask"}, {"context_length": 32, "num_input_channels": 3},
     {"past_values": (z.BATCH, 32, 3), "past_observed_mask": (z.BATCH, 32, 3)}),
    # TimeSeriesTransformer: context + largest lag steps, time features on both sides
    ({"past_values", "past_time_features", "future_time_features", "past_observed_mask", "future_values"},
     {"context_length": 16, "prediction_length": 8, "lags_sequence": [1, 7], "num_time_features": 2, "input_size": 1},
     {"past_values": (z.BATCH, 23), "past_time_features": (z.BATCH, 23, 2), "future_time_features": (z.BATCH, 8, 2),
      "future_values": (z.BATCH, 8)}),
])
def test_time_series_recipes(params, cfg, shapes):
    (desc, kw), = z._time_series_inputs(SimpleNamespace(**cfg), torch.Generator().manual_seed(0), params)
    for k, shape in shapes.items():
        assert tuple(kw[k].shape) == shape, (desc, k)


@pytest.mark.parametrize("name,inputs", [
    ("patchtst", "time-series(B,T,C)"),
    ("deepseek_v3/static-cache", "input_ids+cache_position"),
    ("detr", "pixel_values"),
])
def test_make_case_builds_deterministically(name, inputs):
    a, b = z.make_case(name), z.make_case(name)
    assert a.inputs == b.inputs == inputs
    assert z._n_params(a.model) <= z.MAX_PARAMS
    assert a.kwargs.keys() == b.kwargs.keys()
    for k in a.kwargs:
        assert torch.equal(a.kwargs[k], b.kwargs[k]), k
    for (n1, p1), (n2, p2) in zip(a.model.state_dict().items(), b.model.state_dict().items()):
        assert n1 == n2 and torch.equal(p1, p2), n1


def test_a_missing_optional_dependency_is_case_unavailable(monkeypatch):
    """transformers hands out a placeholder class when a model's dependency (torchaudio, ...) is
    missing; reading any attribute of it raises ImportError. The corpus reports that as
    CaseUnavailable (the sweep's "corpus" cause), never as a raw ImportError."""

    class Dummy(type):  # as transformers' DummyObject: every public attribute raises
        def __getattribute__(cls, name):
            if name.startswith("__"):
                return super().__getattribute__(name)
            raise ImportError(f"{cls.__name__} requires the torchaudio library")

    class NeedsTorchaudioModel(metaclass=Dummy):
        pass

    with pytest.raises(z.CaseUnavailable, match="construct .*ImportError: NeedsTorchaudioModel requires the torchaudio"):
        z._build_model(NeedsTorchaudioModel, SimpleNamespace(sub_configs={}))
