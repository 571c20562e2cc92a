"""Real-model corpus: every transformers model type buildable offline from its config, shrunk, with random weights.
Owns RealCase, CaseUnavailable, case_names (enumerated from transformers' auto registry) and make_case."""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import functools
import inspect
import re
import warnings

import torch

__all__ = ["RealCase", "CaseUnavailable", "case_names", "make_case", "TASKS", "DEFAULT_TASKS"]

MAX_PARAMS = 30_000_000  # a case bigger than this after shrinking is refused (CaseUnavailable)
BATCH, SEQ, DEC_SEQ = 2, 12, 6  # text inputs: (BATCH, SEQ); seq2seq decoder inputs: (BATCH, DEC_SEQ)
CACHE_SEQ, CACHE_LEN = 4, 16  # static-cache cases: prefill of CACHE_SEQ tokens into a cache of CACHE_LEN


@dataclasses.dataclass
class RealCase:
    name: str  # "llama", "llama/causal-lm", "t5/seq2seq", "vit/image-classification", "llama/static-cache"
    model_type: str  # transformers config model_type
    task: str  # "base", "causal-lm", "seq2seq", "static-cache", or another auto-mapping task
    model: torch.nn.Module  # eval mode, seeded random weights
    args: tuple
    kwargs: dict | None
    dynamic_shapes: object  # None, or a dynamic_shapes spec for torch.export (over args+kwargs names)
    rtol: float = 1e-4
    atol: float = 1e-4
    # torch.export strict mode: False except for static-cache cases, which transformers exports strict (its
    # cache tensors live outside the module tree; non-strict export lifts them as mutated constants)
    strict: bool = False
    model_class: str = ""  # the transformers class built
    attn_implementation: str | None = None  # "sdpa" / "eager" / None (model has no attention switch)
    inputs: str = ""  # which input recipe was used (e.g. "input_ids", "input_ids+pixel_values", "text-only")
    notes: str = ""


class CaseUnavailable(Exception):
    """the case cannot be built offline (reason in message)"""

    def __init__(self, msg: str = "", retry: bool = True):
        super().__init__(msg)
        self.retry = retry  # False: another shrinking mode cannot help (no such class, missing dependency)


# ------------------------------------------------------------------------------------------------
# Enumeration
# ------------------------------------------------------------------------------------------------

# task name -> auto mapping; order = preference when a model type has no base model
_NAMED_TASKS = {
    "base": "MODEL_MAPPING_NAMES",
    "causal-lm": "MODEL_FOR_CAUSAL_LM_MAPPING_NAMES",
    "seq2seq": "MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES",
    "masked-lm": "MODEL_FOR_MASKED_LM_MAPPING_NAMES",
    "image-classification": "MODEL_FOR_IMAGE_CLASSIFICATION_MAPPING_NAMES",
    "audio": "MODEL_FOR_AUDIO_CLASSIFICATION_MAPPING_NAMES",
    "ctc": "MODEL_FOR_CTC_MAPPING_NAMES",
    "speech-seq2seq": "MODEL_FOR_SPEECH_SEQ_2_SEQ_MAPPING_NAMES",
    "image-text-to-text": "MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES",
}
STATIC_CACHE = "static-cache"
# Default sweep: every model type once (its base model, else its first task model), causal-LM heads of
# decoders, seq2seq heads of encoder-decoders, and transformers' static-cache export recipe for decoders.
DEFAULT_TASKS = ("base", "causal-lm", "seq2seq", STATIC_CACHE)


@functools.lru_cache(maxsize=None)
def _mappings() -> dict[str, dict[str, object]]:
    """task -> {model_type: class name(s)}, named tasks first, then every other auto mapping."""
    from transformers.models.auto import modeling_auto

    out = {task: dict(getattr(modeling_auto, attr)) for task, attr in _NAMED_TASKS.items()}
    named = set(_NAMED_TASKS.values())
    for attr in sorted(dir(modeling_auto)):
        if attr.startswith("MODEL_FOR_") and attr.endswith("_MAPPING_NAMES") and attr not in named:
            task = attr[len("MODEL_FOR_"):-len("_MAPPING_NAMES")].lower().replace("_", "-")
            out[task] = dict(getattr(modeling_auto, attr))
    return out


TASKS = None  # filled lazily by _all_tasks(); kept for discoverability


def _all_tasks() -> list[str]:
    return list(_mappings()) + [STATIC_CACHE]


@functools.lru_cache(maxsize=None)
def _decoder_types() -> frozenset[str]:
    """Model types with a causal-LM head that are decoders (not also masked-LM encoders or seq2seq)."""
    m = _mappings()
    return frozenset(set(m["causal-lm"]) - set(m["masked-lm"]) - set(m["seq2seq"]) - {"encoder-decoder"})


@functools.lru_cache(maxsize=None)
def _fallback_task() -> dict[str, str]:
    """model_type without a base model -> the first task (in _mappings order) that has a model for it."""
    from transformers.models.auto import configuration_auto

    m = _mappings()
    out = {}
    for t in configuration_auto.CONFIG_MAPPING_NAMES:
        if t in m["base"]:
            continue
        for task, mp in m.items():
            if t in mp:
                out[t] = task
                break
    return out


def _case_name(model_type: str, task: str) -> str:
    return model_type if task == "base" else f"{model_type}/{task}"


def case_names(tasks=None) -> list[str]:
    """Case names enumerated from transformers' auto registry, sorted.

    tasks=None: DEFAULT_TASKS plus, for model types without a base model, their first task model.
    Otherwise the given tasks ("base", "causal-lm" (decoders only), "seq2seq", "static-cache"
    (decoders), "masked-lm", "image-classification", "audio", "ctc", ... any auto mapping's task).
    """
    if isinstance(tasks, str):
        tasks = [t for t in tasks.split(",") if t]
    m = _mappings()
    names = set()
    if tasks is None:
        for t, task in _fallback_task().items():
            names.add(_case_name(t, task))
        tasks = DEFAULT_TASKS
    for task in tasks:
        if task == STATIC_CACHE:
            names.update(_case_name(t, STATIC_CACHE) for t in _decoder_types())
        elif task == "causal-lm":
            names.update(_case_name(t, task) for t in _decoder_types())
        elif task in m:
            names.update(_case_name(t, task) for t in m[task])
        else:
            raise ValueError(f"unknown task {task!r}; known: {', '.join(_all_tasks())}")
    return sorted(names)


def _parse(name: str) -> tuple[str, str]:
    model_type, _, task = name.partition("/")
    return model_type, task or "base"


# ------------------------------------------------------------------------------------------------
# Config shrinking (on the config's dict: derived fields are recomputed when it is rebuilt)
# ------------------------------------------------------------------------------------------------

H, I, NH, L, V = 64, 128, 4, 2, 512  # hidden, intermediate, heads, layers, vocab
HD = H // NH
IMG, PATCH = 32, 8
SPECIAL_ID_BAND = 48  # special token ids live in [V - SPECIAL_ID_BAND, V); random text ids below

_HIDDEN_KEYS = {
    "hidden_size", "d_model", "n_embd", "model_dim", "hidden_dim", "emb_dim", "word_embed_proj_dim", "projection_dim",
    "proj_dim", "text_hidden_size", "encoder_hidden_size", "decoder_hidden_size", "out_hidden_size",
    "vision_hidden_size", "audio_hidden_size", "cross_hidden_size", "hidden_size_global", "output_hidden_size",
    "projector_hidden_size", "text_embed_dim", "vision_embed_dim", "image_text_hidden_size", "project_dim",
    "embedding_dim", "pooler_hidden_size", "fusion_hidden_size", "backbone_hidden_size", "d_embed", "n_embed",
    "encoder_hidden_dim", "lm_hidden_size", "mm_hidden_size", "vision_output_dim", "adapter_out_dim",
    "memory_attention_hidden_size", "memory_encoder_hidden_size", "fpn_hidden_size", "reassemble_hidden_size",
    "classifier_proj_size", "xvector_output_dim", "codevector_dim", "proj_codevector_dim", "text_proj_dim",
    "attention_hidden_size", "hidden_size_per_layer_input", "speech_decoder_postnet_units", "projection_size",
    "pooler_output_size", "mit_hidden_size", "pred_hidden_size", "output_dim",
}
_INTERMEDIATE_RE = re.compile(r"(intermediate|ffn_dim$|^d_ff$|^n_inner$|^mlp_dim$|linear_units$|ffn_hidden_size$|"
                              r"^decoder_intermediate_size$)")
_LAYER_KEYS = {
    "num_hidden_layers", "num_layers", "n_layer", "n_layers", "encoder_layers", "decoder_layers", "num_encoder_layers",
    "num_decoder_layers", "decoder_num_hidden_layers", "encoder_num_hidden_layers", "depth", "layers",
    "num_text_layers", "num_vision_layers", "text_num_hidden_layers", "vision_num_hidden_layers",
    "memory_attention_num_layers", "memory_fuser_num_layers", "num_mel_attn_blocks", "resampler_depth",
    "aligner_num_add_layers", "num_lstm_layers", "num_single_layers", "num_cross_layers", "pred_num_hidden_layers",
}
_HEAD_KEYS = {
    "num_attention_heads", "n_head", "n_heads", "num_heads", "encoder_attention_heads", "decoder_attention_heads",
    "attention_heads", "decoder_num_attention_heads", "encoder_num_attention_heads", "cross_num_attention_heads",
    "resampler_n_heads", "resampler_heads", "swa_num_attention_heads", "text_num_attention_heads",
    "vision_num_attention_heads", "index_n_heads", "pred_num_attention_heads",
}
_KV_HEAD_KEYS = {"num_key_value_heads", "n_kv_heads", "num_kv_heads", "multi_query_group_num",
                 "cross_num_key_value_heads", "swa_num_key_value_heads", "n_head_kv", "num_kv_heads_per_layer"}
_HEAD_DIM_KEYS = {"head_dim", "attention_head_dim", "d_kv", "dim_head", "cross_head_dim", "resampler_head_dim",
                  "resampler_dim_head", "swa_head_dim", "attention_head_size", "kv_channels", "index_head_dim",
                  "d_head"}
_EXPERT_KEYS = {"num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts", "num_routed_experts",
                "n_experts"}
_TOPK_KEYS = {"num_experts_per_tok", "moe_topk", "moe_k", "num_experts_per_token", "top_k", "n_activated_experts",
              "num_selected_experts", "router_topk", "moe_top_k"}
_SHARED_EXPERT_KEYS = {"n_shared_experts", "num_shared_experts", "moe_num_shared_experts", "shared_experts"}
_POS_KEYS = {"max_position_embeddings", "n_positions", "max_target_positions", "n_ctx", "max_seq_len",
             "max_sequence_length", "seq_length", "max_seq_length", "model_max_length", "block_size",
             "max_text_positions", "position_embedding_size"}
_BASIC_TOKEN_KEYS = {"pad_token_id", "bos_token_id", "eos_token_id", "decoder_start_token_id", "sep_token_id",
                     "cls_token_id", "mask_token_id", "unk_token_id", "forced_eos_token_id", "forced_bos_token_id"}
_TOKEN_KEY_RE = re.compile(r"(token_id|token_index|_token$|token_ids$|^image_token|^video_token|^audio_token)")
_LAYER_INDEX_KEY_RE = re.compile(r"(idx|index|indexes|indices|idxs|_layers?_ids?|layers_block_type|"
                                 r"^deepstack_visual_indexes$|^full_attn|^global_attn|_layer_ids$)")


def _is_cfg_dict(key: str, value) -> bool:
    return isinstance(value, dict) and (key.endswith("config") or "model_type" in value) and \
        key not in ("id2label", "label2id", "rope_parameters", "rope_scaling", "quantization_config")


def _layer_count_keys(d: dict) -> dict[str, int]:
    return {k: v for k, v in d.items() if k in _LAYER_KEYS and isinstance(v, int) and not isinstance(v, bool)}


def _pick_layer_indices(d: dict, old_n: int, n: int) -> list[int]:
    """Which of the old layers to keep: one of each distinct kind first (layer_types, per-layer flags)."""
    kinds = None
    for k in ("layer_types", "layers_block_type", "hybrid_override_pattern", "attn_layer_types", "block_types"):
        v = d.get(k)
        if isinstance(v, list) and len(v) == old_n:
            kinds = [repr(x) for x in v]
            break
    if kinds is None:
        return list(range(min(n, old_n)))
    out, seen = [], set()
    for i, kind in enumerate(kinds):
        if kind not in seen:
            seen.add(kind)
            out.append(i)
    out = out[:n]
    for i in range(old_n):
        if len(out) >= n:
            break
        if i not in out:
            out.append(i)
    return sorted(out)


_MROPE_TYPES = re.compile(r"(_vl|vl_|omni|glm4v|glm_image|glm_ocr|compass|qwen3_5|qwen4|cosmos3|paddleocr)")


def _shrink_rope(rp: dict, old_hd, new_hd, model_type: str = "") -> dict:
    rp = dict(rp)
    if "mrope_section" not in rp and rp and _MROPE_TYPES.search(model_type or "") and \
            "vision" not in model_type.split("|")[0]:  # (an empty dict is filled in by the config class)
        rp["mrope_section"] = [16, 24, 24]  # modeling code's default, rescaled below
    if "mrope_section" in rp and isinstance(rp["mrope_section"], list):
        sec = rp["mrope_section"]
        prf = rp.get("partial_rotary_factor", 1.0) or 1.0
        total = max(len(sec), int(new_hd * prf) // 2)
        scaled = [max(1, round(s * total / max(1, sum(sec)))) for s in sec]
        scaled[-1] += total - sum(scaled)
        if scaled[-1] < 1:
            scaled = [total - (len(sec) - 1)] + [1] * (len(sec) - 1)
        rp["mrope_section"] = scaled
    for k in ("short_factor", "long_factor"):
        if isinstance(rp.get(k), list) and old_hd:
            rp[k] = rp[k][: max(1, len(rp[k]) * new_hd // old_hd)]
    if isinstance(rp.get("original_max_position_embeddings"), int):
        rp["original_max_position_embeddings"] = min(rp["original_max_position_embeddings"], 256)
    return rp


_WIDTH_RE = re.compile(r"(hidden|_dim$|^dim$|_dims$|^d_|channel|embed|intermediate|ffn|n_inner|width|_units$|_size$|"
                       r"_sizes$|lora_rank|^d_kv$|^d_ff$)")
_NOT_WIDTH_RE = re.compile(r"(vocab|image|patch|kernel|stride|window|position|max_|^num_|^n_|batch|pool|chunk|sampling|"
                           r"hop|_rate|ratio|eps|scale|factor|state_size|conv_l|bucket|length|frames|shape|bins|mel|"
                           r"^block_size$|segment|input_size|^embed_dim_per_stage$|group|codebook_size|receptive|"
                           r"sample|context|tokens|num_)")


def _round_filters(cfg: dict, channels: int) -> int:
    """EfficientNet's channel rounding (modeling_efficientnet.round_filters) on a config dict."""
    divisor = cfg.get("depth_divisor", 8)
    channels *= cfg["width_coefficient"]
    new = max(divisor, int(channels + divisor / 2) // divisor * divisor)
    return int(new + divisor if new < 0.9 * channels else new)


_TIED_WIDTH_RE = re.compile(r"(_dim$|hidden|adapter|_width$|input_size$|_features$)")


def _scale_width(v, f):
    if isinstance(v, bool):
        return v
    if isinstance(v, int):
        return v if v <= 4 else max(1, v // f)
    if isinstance(v, list) and v and all(isinstance(x, int) and not isinstance(x, bool) for x in v):
        return [_scale_width(x, f) for x in v]
    return v


def _moe_size(k: str, v):
    """The small value of a mixture-of-experts count in both modes (4 experts, top-2, one expert group),
    or None when ``k`` names no such count or ``v`` is kept."""
    if k in _EXPERT_KEYS and isinstance(v, int) and v > 1:
        return 4
    if k in _TOPK_KEYS and isinstance(v, int) and v > 1:
        return 2
    if k in ("n_group", "topk_group", "num_expert_group") and isinstance(v, int):
        return 1
    return None


def _shrink_level(d: dict, top: dict, mode: str = "small", f: int = 8) -> dict:
    """Shrink one config level (sub-config dicts are shrunk recursively first).

    mode "small": widths set to absolute small values (H, I, NH, HD), equal across sub-configs so that
    cross-config widths stay consistent. mode "scaled" (the fallback): every width divided by ``f``, heads
    and image/audio sizes kept, so that proportions between widths survive.
    """
    nested = d is not top
    d = dict(d)
    for k, v in list(d.items()):
        if _is_cfg_dict(k, v):
            d[k] = _shrink_level(v, top, mode, f)
        elif isinstance(v, list) and v and all(_is_cfg_dict(k, x) for x in v) and k.endswith("configs"):
            d[k] = [_shrink_level(x, top, mode, f) for x in v]
    if mode == "scaled":
        return _scale_level(d, top, f)
    d0 = dict(d)

    old_layers = _layer_count_keys(d)
    old_heads = next((d[k] for k in ("num_attention_heads", "n_head", "n_heads", "num_heads", "encoder_attention_heads")
                      if isinstance(d.get(k), int)), None)
    old_hidden = next((d[k] for k in ("hidden_size", "d_model", "n_embd") if isinstance(d.get(k), int)), None)
    old_hd = d.get("head_dim") if isinstance(d.get("head_dim"), int) else (
        old_hidden // old_heads if old_hidden and old_heads else None)
    has_stages = isinstance(d.get("depths"), list) or isinstance(d.get("hidden_sizes"), list)

    def setint(k, fn):
        v = d.get(k)
        if isinstance(v, int) and not isinstance(v, bool):
            d[k] = fn(v)

    for k in list(d):
        v = d[k]
        if isinstance(v, bool) or v is None:
            continue
        if k in _HIDDEN_KEYS and isinstance(v, int):
            d[k] = H if v > 0 else v
        elif k == "embed_dim" and isinstance(v, int):
            d[k] = 32 if has_stages else H
        elif k == "dim" and isinstance(v, int) and v >= 64:
            d[k] = H
        elif k in ("embedding_size",) and isinstance(v, int) and v > 1:
            d[k] = 32 if not has_stages else 16
        elif _INTERMEDIATE_RE.search(k) and isinstance(v, int) and not k.startswith("num_"):
            d[k] = min(v, I if "moe" not in k and "expert" not in k else H) if v > 0 else v
        elif k in _LAYER_KEYS and isinstance(v, int) and v > 0:
            if not (has_stages and k in ("num_layers", "num_stages")):  # swin-like: num_layers == len(depths)
                d[k] = min(v, L)
        elif k in _HEAD_KEYS:
            if isinstance(v, int) and v > 0:
                d[k] = NH if v >= NH else v
            elif isinstance(v, list) and v and all(isinstance(x, int) for x in v):
                d[k] = [min(x, NH) for x in v]
        elif (moe := _moe_size(k, v)) is not None:
            d[k] = moe
        elif k in _SHARED_EXPERT_KEYS and isinstance(v, int) and v > 1:
            d[k] = 1
        elif k == "vocab_size" and isinstance(v, int):
            d[k] = min(v, V)
        elif k in ("input_vocab_size", "output_vocab_size", "text_vocab_size", "vocab_size_per_layer_input",
                   "target_vocab_size", "src_vocab_size", "tgt_vocab_size", "char_vocab_size") and isinstance(v, int):
            d[k] = min(v, V)
        elif k in _POS_KEYS and isinstance(v, int) and v > 0:
            d[k] = min(v, 512)
        elif k == "frames_per_clip" and isinstance(v, int):  # V-JEPA 2: (a multiple of tubelet_size)
            d[k] = min(v, 4)
        elif k == "crop_size" and isinstance(v, int) and v > IMG:
            d[k] = IMG
        elif k == "max_source_positions" and isinstance(v, int):
            d[k] = min(v, 32)
        elif k == "max_length" and isinstance(v, int) and "num_mel_bins" in d:  # AST: frames per spectrogram
            d[k] = min(v, 64)
        elif k == "sliding_window" and isinstance(v, int) and v > 0:
            d[k] = min(v, 8)
        elif k == "attention_window":
            d[k] = [4] * len(v) if isinstance(v, list) else 4
        elif k == "image_size":
            if isinstance(v, int) and v > IMG:
                d[k] = IMG if isinstance(d.get("patch_size"), int) else 64
            elif isinstance(v, (list, tuple)) and len(v) == 2 and all(isinstance(x, int) for x in v) and v[0] > IMG:
                d[k] = [IMG, IMG] if d.get("patch_size") is not None else [64, 64]
        elif k == "patch_size":
            if isinstance(v, int) and v > PATCH:
                d[k] = PATCH
            elif isinstance(v, list) and len(v) == 2 and all(isinstance(x, int) for x in v):
                d[k] = [min(x, PATCH) for x in v]
        elif k in ("hidden_sizes", "embed_dim_per_stage", "neck_hidden_sizes", "encoder_hidden_sizes",
                   "backbone_channel_list", "post_process_channels") and isinstance(v, list) and v and \
                all(isinstance(x, int) for x in v):
            inc = v == sorted(v)
            base = [min(256, 16 * 2 ** i) for i in range(len(v))]
            d[k] = base if inc else base[::-1]
        elif k in ("depths", "blocks_per_stage", "stage_num_blocks", "num_block_repeats") and isinstance(v, list) \
                and all(isinstance(x, int) for x in v):
            d[k] = [min(x, 2 if k == "depths" else 1) for x in v]
        elif k in ("conv_dim", "tdnn_dim") and isinstance(v, list):
            d[k] = [32] * len(v)
        elif k == "num_conv_pos_embeddings" and isinstance(v, int):
            d[k] = min(v, 16)
        elif k == "num_conv_pos_embedding_groups" and isinstance(v, int):
            d[k] = min(v, 4)
        elif k == "num_codevectors_per_group" and isinstance(v, int):
            d[k] = min(v, 16)
        elif k in ("state_size", "mamba_d_state", "ssm_state_size", "d_state") and isinstance(v, int):
            d[k] = min(v, 8)
        elif k in ("time_step_rank",) and isinstance(v, int):
            d[k] = min(v, 8)
        elif k in ("n_groups", "mamba_n_groups") and isinstance(v, int):
            d[k] = 1
        elif k in ("chunk_size", "mamba_chunk_size") and isinstance(v, int) and v > 8 and \
                any(x in d for x in ("state_size", "mamba_d_state", "ssm_state_size")):
            d[k] = 8
        elif k in ("linear_num_key_heads",) and isinstance(v, int):
            d[k] = min(v, 2)
        elif k in ("linear_num_value_heads", "linear_num_heads") and isinstance(v, int):
            d[k] = min(v, NH)
        elif k in ("linear_key_head_dim", "linear_value_head_dim", "linear_head_dim") and isinstance(v, int):
            d[k] = min(v, HD)
        elif k in ("kv_lora_rank", "q_lora_rank") and isinstance(v, int) and v > 0:
            d[k] = 32
        elif k in ("num_queries", "num_query_tokens", "resampler_n_latents", "resampler_num_latents",
                   "num_latents") and isinstance(v, int):
            d[k] = min(v, 16)
        elif k in ("num_labels", "num_classes") and isinstance(v, int):
            d[k] = min(v, 4)
        elif k == "first_k_dense_replace" and isinstance(v, int):
            d[k] = min(v, 1)
        elif k == "rotary_dim" and isinstance(v, int) and v > 0:
            d[k] = HD // 2 if old_hd and v < old_hd else HD
        elif k in ("num_codebooks", "num_quantizers", "n_codebooks") and isinstance(v, int):
            d[k] = min(v, 4)
        elif k in ("codebook_size",) and isinstance(v, int):
            d[k] = min(v, 128)
        elif k in ("num_kv_shared_layers",) and isinstance(v, int):
            d[k] = 0
        elif k in ("num_nextn_predict_layers", "num_mtp_layers") and isinstance(v, int):
            d[k] = min(v, 1)
        elif "vocab" in k and isinstance(v, int) and v > V and "offset" not in k:
            d[k] = V
        elif k in ("d_latents",) and isinstance(v, int):
            d[k] = H
        elif re.search(r"(embed|latent|emb)_?(dim|size)$", k) and isinstance(v, int) and v > H:
            d[k] = H
        elif re.search(r"^num_self_attends|^num_blocks$|_num_blocks$|^num_res_blocks$", k) and isinstance(v, int):
            d[k] = min(v, 1)
        elif k in ("width_coefficient",) and isinstance(v, (int, float)):
            d[k] = min(v, 0.2)  # EfficientNet: last stage 320 * 0.2 = 64 channels (ALIGN's image embedding == H)
        elif k in ("depth_coefficient",) and isinstance(v, (int, float)):
            d[k] = min(v, 0.5)
        elif re.search(r"(base_channels|upsample_initial_channel|initial_channel|_channels)$", k) and \
                isinstance(v, int) and v > 64:
            d[k] = 32
        elif k in ("num_embeddings",) and isinstance(v, int) and v > 256:
            d[k] = 128
        elif k == "num_filters" and isinstance(v, int):  # SEANet codecs: channels double at every stage
            d[k] = min(v, 8)
        elif k in ("prompt_length", "prompt_types") and isinstance(v, int):  # cpmant: learned prompt tokens
            d[k] = min(v, 4)
        elif k in ("prediction_length", "horizon_length") and isinstance(v, int):  # time series
            d[k] = min(v, 16)
        elif k == "context_length" and isinstance(v, int) and \
                any(x in d for x in ("prediction_length", "horizon_length")):
            d[k] = min(v, 64)

    # widths tied to a shrunk width follow it: depthwise groups (Mimi's upsampler), codec codebooks without
    # projections (EnCodec, WavTokenizer: codebook_dim == hidden_size), adapters' input widths (checked by
    # validators), ZoeDepth's bottleneck_features == fusion_hidden_size
    tie = {}
    for k in ("hidden_size", "d_model", "n_embd", *sorted(_HIDDEN_KEYS)):
        if isinstance(d0.get(k), int) and not isinstance(d0[k], bool) and isinstance(d.get(k), int) and d[k] != d0[k]:
            tie.setdefault(d0[k], d[k])
    for k, v in list(d.items()):
        if isinstance(v, bool) or not isinstance(v, int) or v not in tie or d0.get(k) != v:
            continue
        if k.endswith("groups") or k == "codebook_dim" or (
                _TIED_WIDTH_RE.search(k) and not re.search(r"(head|vocab|position|max_|num_)", k)):
            d[k] = tie[v]
    for lk in ("embed_dim_per_stage", "hidden_sizes"):  # hidden_size naming a stage's width (Hiera: the first)
        if isinstance(d0.get(lk), list) and d0[lk] and isinstance(d.get(lk), list) and \
                isinstance(d0.get("hidden_size"), int) and d0["hidden_size"] in (d0[lk][0], d0[lk][-1]):
            d["hidden_size"] = d[lk][0] if d0["hidden_size"] == d0[lk][0] else d[lk][-1]
    if all(isinstance(d0.get(k), int) for k in ("image_embedding_size", "image_size", "patch_size")) and \
            d0["image_embedding_size"] == d0["image_size"] // d0["patch_size"]:
        d["image_embedding_size"] = d["image_size"] // d["patch_size"]  # SAM prompt encoder: the patch grid
    if isinstance(d.get("downsampling_ratios"), list) and isinstance(d.get("encoder_hidden_size"), int):
        d["encoder_hidden_size"] = 8  # DAC: channels double at every downsampling stage (x16 for 4 stages)
    if isinstance(d0.get("attention_hidden_size"), int) and isinstance(d0.get("hidden_size"), int) and \
            d0["attention_hidden_size"] == 2 * d0["hidden_size"]:  # Zamba: attention over [hidden, embeddings]
        d["attention_hidden_size"] = 2 * d["hidden_size"]
    if isinstance(d.get("width_coefficient"), (int, float)) and isinstance(d0.get("hidden_dim"), int) and \
            d0["hidden_dim"] == _round_filters(d0, 1280):  # EfficientNet's top conv: hidden_dim channels
        d["hidden_dim"] = _round_filters(d, 1280)
    heads = next((d[k] for k in ("num_attention_heads", "n_head", "n_heads", "num_heads") if isinstance(d.get(k), int)),
                 None)
    for k in _KV_HEAD_KEYS:
        v = d.get(k)
        if isinstance(v, int) and not isinstance(v, bool) and v > 0:
            if v == 1:
                d[k] = 1
            elif old_heads is not None and v >= old_heads:
                d[k] = heads or NH
            else:
                d[k] = 2 if (heads or NH) % 2 == 0 else 1
    for k in _HEAD_DIM_KEYS:
        if isinstance(d.get(k), int) and d[k] > 0:
            d[k] = HD
    if isinstance(d.get("v_head_dim"), int) and d["v_head_dim"] > HD:  # value head width (MLA resets it below)
        d["v_head_dim"] = HD
    if any(isinstance(d.get(k), int) and d[k] > 1 for k in _EXPERT_KEYS):
        for k in _TOPK_KEYS:
            if k in d and d[k] is None:
                d[k] = 2
    if "num_key_value_heads" in d and d["num_key_value_heads"] is None and heads:
        d["num_key_value_heads"] = heads
    if "head_dim" in d and d["head_dim"] is None and heads and isinstance(d.get("hidden_size"), int):
        d["head_dim"] = d["hidden_size"] // heads  # some modeling code reads head_dim without a fallback
    if "kv_lora_rank" in d and isinstance(d.get("qk_rope_head_dim"), int):  # multi-head latent attention
        d.update(qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=HD)
        if "qk_head_dim" in d:
            d["qk_head_dim"] = 16
        if "head_dim" in d:  # keep the original relation: the rotary part (DeepSeek) or the whole q/k head
            whole = d0.get("head_dim") == (d0.get("qk_nope_head_dim") or 0) + d0["qk_rope_head_dim"]
            d["head_dim"] = 16 if whole and isinstance(d0.get("head_dim"), int) else 8
    # mamba-style: heads * head_dim == expand * hidden
    expand = d.get("mamba_expand", d.get("expand"))
    if isinstance(expand, (int, float)) and not isinstance(expand, bool):
        inner = int(expand * H)
        for nk, hk in (("mamba_n_heads", "mamba_d_head"), ("mamba_num_heads", "mamba_head_dim"),
                       ("num_heads", "head_dim"), ("n_mamba_heads", "mamba_headdim")):
            if isinstance(d.get(nk), int) and isinstance(d.get(hk), int) and "state_size" in d or \
                    ("mamba" in nk and isinstance(d.get(nk), int) and isinstance(d.get(hk), int)):
                d[nk] = 4
                d[hk] = inner // 4
    # rope
    for rk in ("rope_parameters", "rope_scaling"):
        if isinstance(d.get(rk), dict):
            d[rk] = _shrink_rope(d[rk], old_hd, d.get("head_dim") if isinstance(d.get("head_dim"), int) else HD,
                                 str(d.get("model_type", "")) + "|" + str(top.get("model_type", "")))
    # layer stacks split in parts (Dory: n_input_layers + n_recurrent_layers + n_output_layers == num_hidden_layers)
    parts = [k for k, v in d0.items() if re.fullmatch(r"n_\w+_layers", k) and isinstance(v, int) and v > 0]
    for lk, old_n in old_layers.items():
        if len(parts) > 1 and sum(d0[k] for k in parts) == old_n:
            per = 2 if all(d0[k] % 2 == 0 for k in parts) else 1  # (Dory counts attention and mlp blocks)
            d.update({k: per for k in parts})
            d[lk] = per * len(parts)
    # a single-stage backbone (ViT-like) feeding a multi-scale neck (DPT, Depth Anything, ZoeDepth) keeps one
    # layer per output index, so the neck still receives as many feature maps as it has stages
    oi = d0.get("out_indices")
    new_oi = None
    if nested and not has_stages and "num_hidden_layers" in old_layers and isinstance(oi, list) and oi and \
            all(isinstance(x, int) and not isinstance(x, bool) and x > 0 for x in oi):
        d["num_hidden_layers"] = max(d["num_hidden_layers"], min(len(oi), old_layers["num_hidden_layers"]))
        n = d["num_hidden_layers"]
        new_oi = list(range(n - len(oi) + 1, n + 1))
    _follow_layer_counts(d, old_layers, skip=("depths", "hidden_sizes", "conv_dim", "conv_kernel", "conv_stride"),
                         layer=lambda k, sub: _shrink_layer_diff(sub, d0, d, k, top) if isinstance(sub, dict) else sub,
                         drop_stages=not has_stages, out_indices=new_oi)
    return d


def _follow_layer_counts(d: dict, old_layers: dict[str, int], skip: tuple[str, ...], layer=lambda k, sub: sub,
                         drop_stages: bool = True, out_indices: list | None = None) -> None:
    """After a level's layer counts changed (``old_layers``: the counts before), its per-layer lists,
    per-layer config dicts ({"05": {...}}, each kept entry passed through ``layer``) and layer-index lists
    follow each new count, in place, but for the keys in ``skip``; then the stage names and out
    indices/features are dropped (``drop_stages``) and ``out_indices``, when given, set."""
    new_layers = _layer_count_keys(d)
    for lk, old_n in old_layers.items():
        new_n = new_layers[lk]
        if new_n == old_n:
            continue
        keep = _pick_layer_indices(d, old_n, new_n)
        for k, v in list(d.items()):
            if k in skip:
                continue
            if isinstance(v, dict) and v and all(str(x).isdigit() for x in v):
                d[k] = {str(keep.index(int(x))): layer(k, sub) for x, sub in v.items() if int(x) in keep}
            elif not isinstance(v, list):
                continue
            elif len(v) == old_n and old_n > 1:
                d[k] = [v[i] for i in keep] if len(keep) == new_n else [v[i % len(v)] for i in range(new_n)]
            elif _LAYER_INDEX_KEY_RE.search(k) and v and all(isinstance(x, int) and not isinstance(x, bool)
                                                              for x in v) and max(v) < old_n + 1 and \
                    k != "out_indices":
                d[k] = sorted({(keep.index(x) if x in keep else min(x, new_n - 1)) if x >= 0 else x for x in v})
        if drop_stages:
            for k in ("stage_names", "out_indices", "out_features"):
                d.pop(k, None)
        if out_indices is not None:
            d["out_indices"] = out_indices


def _shrink_layer_diff(sub: dict, base0: dict, base: dict, key: str, top: dict) -> dict:
    """A per-layer override (only the fields that differ from the base config) shrunk as a whole layer: the
    base merged with it is shrunk, and the fields that then differ from the shrunk base are kept, so that
    relations between fields (head_dim == qk_nope_head_dim + qk_rope_head_dim) hold in the layer."""
    scalar = (int, float, str, type(None))
    merged0 = {k: v for k, v in base0.items() if k != key and (isinstance(v, scalar) or k in sub)}
    merged = _shrink_level({**merged0, **sub}, top)
    return {k: v for k, v in merged.items()
            if k in sub or (isinstance(v, scalar) and k in base and v != base[k])}


def _scale_level(d: dict, top: dict, f: int) -> dict:
    old_layers = _layer_count_keys(d)
    for k in list(d):
        v = d[k]
        if v is None or isinstance(v, bool):
            continue
        kl = k.lower()
        if _WIDTH_RE.search(kl) and not _NOT_WIDTH_RE.search(kl):
            d[k] = _scale_width(v, f)
        elif k in ("num_groups", "norm_num_groups", "num_norm_groups", "upsample_groups") and isinstance(v, int):
            d[k] = max(1, v // f)
        elif k in _LAYER_KEYS and isinstance(v, int) and v > 0 and not isinstance(d.get("depths"), list):
            d[k] = min(v, L)
        elif (moe := _moe_size(k, v)) is not None:
            d[k] = moe
        elif "vocab" in k and isinstance(v, int) and v > V and "offset" not in k:
            d[k] = V
        elif k in ("num_embeddings",) and isinstance(v, int) and v > 256:
            d[k] = 128
        elif k in ("depths", "stage_num_blocks", "num_block_repeats") and isinstance(v, list):
            d[k] = [min(x, 1) if isinstance(x, int) else x for x in v]
        elif re.search(r"^num_self_attends|^num_res_blocks$", k) and isinstance(v, int):
            d[k] = min(v, 1)
    for rk in ("rope_parameters", "rope_scaling"):
        rp = d.get(rk)
        if isinstance(rp, dict):
            rp = dict(rp)
            if "mrope_section" not in rp and rp and "vision" not in str(d.get("model_type", "")) and \
                    _MROPE_TYPES.search(str(d.get("model_type", "")) + "|" + str(top.get("model_type", ""))):
                rp["mrope_section"] = [16, 24, 24]
            if isinstance(rp.get("mrope_section"), list):
                rp["mrope_section"] = [max(1, x // f) for x in rp["mrope_section"]]
            d[rk] = rp
    _follow_layer_counts(d, old_layers, skip=("depths", "hidden_sizes"))
    return d


def _remap_special_ids(d: dict, vocab: int, counter: list) -> dict:
    """Token-id fields: basic ones (pad/bos/eos...) kept when inside the new vocab, every other
    special id (image/video/audio/...) moved into the reserved band at the top of the vocab."""
    d = dict(d)
    for k, v in list(d.items()):
        if _is_cfg_dict(k, v):
            sub_vocab = v.get("vocab_size") if isinstance(v.get("vocab_size"), int) else vocab
            d[k] = _remap_special_ids(v, sub_vocab, counter)
            continue
        if not (_TOKEN_KEY_RE.search(k) or k in _BASIC_TOKEN_KEYS):
            continue
        if "length" in k or "num" in k or k.startswith("n_"):
            continue

        def remap(x):
            if not isinstance(x, int) or isinstance(x, bool) or x < 0:
                return x
            if k in _BASIC_TOKEN_KEYS and x < vocab - SPECIAL_ID_BAND:
                return x
            key = (k, x)
            for kk, new in counter:
                if kk == key:
                    return new
            new = vocab - 1 - len(counter) % SPECIAL_ID_BAND
            counter.append((key, new))
            return new

        if isinstance(v, list):
            d[k] = [remap(x) for x in v]
        else:
            d[k] = remap(v)
    for k in ("suppress_tokens", "begin_suppress_tokens", "forced_decoder_ids", "bad_words_ids"):
        if k in d:
            d[k] = None
    return d


def _set_everywhere(d: dict, **kv) -> dict:
    d = dict(d)
    for k, v in list(d.items()):
        if _is_cfg_dict(k, v):
            d[k] = _set_everywhere(v, **kv)
    for k, v in kv.items():
        if k in d:
            d[k] = v
    return d


# per-model fix-ups applied on the shrunk dict, where the generic rules are not enough
def _ov_whisper_like(d):
    d["max_source_positions"] = 32
    return d


def _ov_update(**kv):
    def f(d):
        d.update(kv)
        return d
    return f


def _ov_gemma3(d):
    d["mm_tokens_per_image"] = (IMG // PATCH) ** 2 // 4  # pooled 2x2 from the IMG/PATCH grid
    return d


def _ov_sub(sub, **kv):
    def f(d):
        if isinstance(d.get(sub), dict):
            d[sub] = {**d[sub], **kv}
        return d
    return f


_QWEN4_INDEXER = dict(indexer_n_heads=4, indexer_kv_heads=1, indexer_head_dim=16, indexer_budget=8,
                      indexer_compress_ratio=4)


def _ov_per_layer_type_rope(sub=None, theta=10000.0):
    """Configs whose rope_parameters default to {} but whose modeling reads one entry per layer type (with an
    M-RoPE section over the rotary half of head_dim)."""
    def f(d):
        t = d[sub] if sub else d
        if not isinstance(t, dict) or t.get("rope_parameters"):
            return d
        half = (t.get("head_dim") or HD) // 2
        sec = [half - 2 * (half // 3), half // 3, half // 3]
        rp = {"rope_type": "default", "rope_theta": theta, "mrope_section": sec}
        t = {**t, "rope_parameters": {"full_attention": dict(rp), "sliding_attention": dict(rp)}}
        return {**d, sub: t} if sub else t
    return f


_OVERRIDES: dict[str, callable] = {
    "dots1": _ov_update(n_shared_experts=1, n_routed_experts=4, num_experts_per_tok=2),
    "esm": _ov_update(vocab_size=33, mask_token_id=32, pad_token_id=1, emb_layer_norm_before=False),
    "lfm2_moe": _ov_update(layer_types=["conv", "full_attention"]),
    "diffusion_gemma": _ov_sub("text_config", num_experts=4, top_k_experts=2, moe_intermediate_size=H,
                               use_bidirectional_attention="all"),
    "gemma3": _ov_gemma3,
    # the classifier reads the logits of the "Yes" / "No" tokens (ids 10784 / 3771 in the real vocabulary)
    "shieldgemma2": lambda d: _ov_update(yes_token_index=100, no_token_index=101)(_ov_gemma3(d)),
    "whisper": _ov_whisper_like,
    "reformer": _ov_update(axial_pos_shape=[4, 4], axial_pos_embds_dim=[32, 32], lsh_attn_chunk_length=4,
                           local_attn_chunk_length=4, num_buckets=4, max_position_embeddings=16,
                           attn_layers=["local", "lsh"], num_hidden_layers=2),
    # the default attn_config lacks fields DBRX's modeling reads unconditionally; values of databricks/dbrx-base
    "dbrx": _ov_sub("attn_config", rope_theta=500000.0, clip_qkv=8.0),
    # the query-sparse-attention indexer has no defaults (None) and no published checkpoint: small values
    "qwen4_exp": _ov_sub("text_config", **_QWEN4_INDEXER),
    "qwen4_exp_text": _ov_update(**_QWEN4_INDEXER),
    "cohere_compass": _ov_per_layer_type_rope("text_config"),
    "cohere_compass_text": _ov_per_layer_type_rope(),
    # Dory's config.json lists (attention, mlp) block pairs; three layers (input, recurrent, output parts)
    "dory": _ov_update(layer_types=["sliding_attention", "mlp", "full_attention", "mlp", "sliding_attention", "mlp"]),
    "bros": _ov_update(dim_bbox_projection=HD),  # the box bias is added per attention head: head width
    # the shared attention block is weight-tied across hybrid layers: keep two of them (one alone has nothing to
    # tie to, and transformers refuses the tying spec)
    "zamba": _ov_update(num_hidden_layers=3, layers_block_type=["linear_attention", "hybrid", "hybrid"]),
    # SAM: the vision neck's output channels are the prompt encoder's / mask decoder's width (and SAM-HQ's
    # mask decoder reads the ViT's width), widths the per-config shrinking sets independently
    "sam": _ov_sub("vision_config", output_channels=H, num_pos_feats=H // 2),
    "sam_hq": lambda d: _ov_sub("mask_decoder_config", vit_dim=H)(
        _ov_sub("vision_config", output_channels=H, num_pos_feats=H // 2)(d)),
    # SAM2: the Hiera backbone sees 64x64 images (strides 4, 8, 16 give these feature maps); the prompt encoder's
    # image / patch size must describe the same image and the 16x-downsampled embedding grid
    "sam2": lambda d: _ov_sub("prompt_encoder_config", image_size=64, patch_size=16)(
        _ov_sub("vision_config", backbone_feature_sizes=[[16, 16], [8, 8], [4, 4]])(d)),
    # the prompt/query features merge before the first encoder output taken (merge_index < output indices); the
    # model sees prompt and input stacked vertically (image_size is 2:1, like the released 896x448)
    "seggpt": _ov_update(num_hidden_layers=5, intermediate_hidden_state_indices=[1, 2, 3, 4], merge_index=0,
                         image_size=[2 * IMG, IMG]),
    # the spatial embedding concatenates 4 coordinate and 2 shape embeddings: 4 * 12 + 2 * 8 == H; the patch
    # embedding's position grid is input_size / patch_size
    "layoutlmv3": _ov_update(coordinate_size=12, shape_size=8, input_size=64),
    "big_bird": _ov_update(attention_type="original_full"),
    "bigbird_pegasus": _ov_update(attention_type="original_full"),
}


def _max_width(d: dict) -> int:
    best = 0
    for k, v in d.items():
        if _is_cfg_dict(k, v):
            best = max(best, _max_width(v))
        elif k in ("hidden_size", "d_model", "n_embd", "embed_dim", "hidden_dim") and isinstance(v, int):
            best = max(best, v)
    return best


def _static_cache_fixups(d: dict) -> dict:
    """Shapes transformers' static-cache export wrapper can hold (TorchExportableModuleWithStaticCache sizes
    every layer's key and value cache alike, (num_key_value_heads, head_dim), from the text config)."""
    text_key = next((k for k in ("text_config", "language_config", "llm_config") if isinstance(d.get(k), dict)), None)
    t = dict(d[text_key]) if text_key else d
    if isinstance(t.get("kv_lora_rank"), int) and isinstance(t.get("qk_rope_head_dim"), int):
        # multi-head latent attention caches one shared latent "head": keys (kv_lora_rank wide) and the rotary
        # key (qk_rope_head_dim wide); the wrapper can only hold them when both widths equal its head_dim and
        # num_key_value_heads is 1. The attention also reads num_key_value_heads (num_attention_heads // it
        # key/value repeats, under tracing), so query heads are 1 as well: a single-head MLA model
        r = t["qk_rope_head_dim"]
        t.update(kv_lora_rank=r, head_dim=r, num_key_value_heads=1, num_attention_heads=1)
    if t.get("multi_query") is True and "num_kv_heads" in t and t.get("num_key_value_heads") is None:
        # falcon: multi_query keys/values have one head but the config reports none, so the wrapper sizes
        # the cache with num_attention_heads; falcon's own non-multi-query variant (falcon-rw) is sized right
        t["multi_query"] = False
        t["num_kv_heads"] = t.get("num_attention_heads", t["num_kv_heads"])
    if text_key:
        d = {**d, text_key: t}
    return d


def _native_backbones(d: dict) -> dict:
    """Without timm installed, a timm backbone of a known family becomes transformers' own implementation of
    that family (as the "no_timm" revisions of the DETR checkpoints do: ResNetConfig / SwinConfig backbones)."""
    import importlib.util

    if importlib.util.find_spec("timm") is not None:
        return d
    from transformers import AutoConfig

    d = dict(d)
    for k, v in list(d.items()):
        if not isinstance(v, dict):
            continue
        if v.get("model_type") == "timm_backbone":
            family = next((f for f in ("resnet", "swin", "convnext") if str(v.get("backbone", "")).startswith(f)), None)
            if family is None:
                continue
            kw = {"out_indices": v["out_indices"]} if isinstance(v.get("out_indices"), list) else {}
            if isinstance(v.get("num_channels"), int):
                kw["num_channels"] = v["num_channels"]
            d[k] = AutoConfig.for_model(family, **kw).to_dict()
        elif _is_cfg_dict(k, v):
            d[k] = _native_backbones(v)
    return d


def _validity_fixups(d: dict) -> dict:
    """Fields a config needs set to be buildable at all (both shrinking modes, top level)."""
    if "prediction_length" in d and d["prediction_length"] is None:  # GluonTS-style forecasters: no default
        d["prediction_length"] = 8
        if d.get("context_length") is None:
            d["context_length"] = 2 * d["prediction_length"]
    if "num_query_tokens" in d:  # BLIP-2 family: checkpoints set the image placeholder id (the class default is None)
        for k in ("image_token_index", "image_token_id", "video_token_index", "video_token_id"):
            if k in d and d[k] is None:
                d[k] = 0  # moved into the reserved special-id band by _remap_special_ids
    if d.get("default_language") is None and isinstance(d.get("languages"), list) and d["languages"]:
        d["default_language"] = d["languages"][0]  # X-MOD: what set_default_language() sets
    if "lags_sequence" in d:
        if d.get("num_time_features") == 0:  # published checkpoints have time features (age, month...)
            d["num_time_features"] = 2
        if isinstance(d.get("label_length"), int) and isinstance(d.get("context_length"), int):  # autoformer
            d["label_length"] = min(d["label_length"], d["context_length"])
        d.pop("feature_size", None)  # derived from the fields above when the config is rebuilt
    return d


def _shrunk_config(model_type: str, mode: str = "small", task: str = "base"):
    from transformers import AutoConfig

    try:
        cfg0 = AutoConfig.for_model(model_type)
    except Exception as e:
        raise CaseUnavailable(f"config: {type(e).__name__}: {str(e)[:300]}", retry=False) from None
    d = _native_backbones(cfg0.to_dict())
    f = 16 if _max_width(d) >= 2048 else 8
    d = _validity_fixups(_shrink_level(d, d, mode, f))
    top_vocab = d.get("vocab_size") if isinstance(d.get("vocab_size"), int) else V
    d = _remap_special_ids(d, top_vocab, [])
    d = _set_everywhere(d, use_cache=False, dtype=None, torch_dtype=None, output_attentions=False,
                        output_hidden_states=False, return_dict=True)
    d.pop("transformers_version", None)
    if model_type in _OVERRIDES:
        d = _OVERRIDES[model_type](d)
    if task == STATIC_CACHE:
        d = _static_cache_fixups(d)
    try:
        cfg = type(cfg0).from_dict(d)
    except Exception as e:
        raise CaseUnavailable(f"shrunk config refused: {type(e).__name__}: {str(e)[:300]}") from None
    return cfg


# ------------------------------------------------------------------------------------------------
# Model and inputs
# ------------------------------------------------------------------------------------------------

@contextlib.contextmanager
def _quiet():
    from transformers.utils import logging as hf_logging

    level = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            yield
        finally:
            hf_logging.set_verbosity(level)


def _model_class(model_type: str, task: str):
    import transformers

    mp = _mappings().get("causal-lm" if task == STATIC_CACHE else task, {})
    if model_type not in mp:
        raise CaseUnavailable(f"transformers has no {task} model for {model_type!r}", retry=False)
    names = mp[model_type]
    name = names[0] if isinstance(names, (list, tuple)) else names
    try:
        return getattr(transformers, name)
    except Exception as e:  # missing optional dependency, removed class
        raise CaseUnavailable(f"class {name}: {type(e).__name__}: {str(e)[:300]}", retry=False) from None


def _build_model(cls, cfg):
    # as the Auto classes do: a text-only class of a composite model takes the text sub-config
    subs = getattr(cfg, "sub_configs", {}) or {}
    text_cls = subs.get("text_config")
    try:
        want = getattr(cls, "config_class", None)
    except ImportError as e:  # a placeholder class: its optional dependency (torchaudio, ...) is missing
        raise CaseUnavailable(f"construct {cls.__name__}: ImportError: {str(e).strip()[:300]}", retry=False) from None
    if text_cls is not None and want == text_cls:
        cfg = cfg.get_text_config()
    elif want is not None and not isinstance(cfg, want):
        # a part of a composite model (MusicgenModel is the decoder of MusicgenConfig): its own sub-config
        sub = next((getattr(cfg, k, None) for k, c in subs.items() if c == want), None)
        if sub is not None:
            cfg = sub
    errors = []
    for attn in ("sdpa", "eager", None):
        kw = {"dtype": torch.float32}
        if attn is not None:
            kw["attn_implementation"] = attn
        torch.manual_seed(0)
        try:
            model = cls._from_config(copy.deepcopy(cfg), **kw)
        except ValueError as e:
            if attn is not None and ("attention implementation" in str(e) or "attn_implementation" in str(e)
                                     or "does not support" in str(e)):
                errors.append(f"{attn}: {str(e)[:120]}")
                continue
            raise CaseUnavailable(f"construct {cls.__name__}: ValueError: {str(e)[:300]}") from None
        except ImportError as e:  # an optional dependency (timm, scipy, PIL...) is missing
            raise CaseUnavailable(f"construct {cls.__name__}: ImportError: {str(e).strip()[:300]}",
                                  retry=False) from None
        except Exception as e:
            raise CaseUnavailable(f"construct {cls.__name__}: {type(e).__name__}: {str(e)[:300]}") from None
        return _without_zero_matrices(model).eval(), attn
    raise CaseUnavailable(f"construct {cls.__name__}: no attention implementation accepted: {errors}")


def _without_zero_matrices(model):
    """``model`` with each weight matrix its init left all zeros drawn instead (seeded, normal with
    transformers' initializer_range of 0.02). A zero matrix makes every value after it degenerate: a
    mixture of experts whose router gate is zero (afmoe's) ties every expert for every token, and which
    of tied experts ``topk`` picks is unspecified (torch's and a backend's differ, both right), so no
    backend could be compared with eager on it."""
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for param in model.parameters():
            if param.dim() >= 2 and param.is_floating_point() and not param.any():
                param.copy_(torch.randn(param.shape, generator=gen, dtype=torch.float32).mul_(0.02))
    return model


def _sub(cfg, *names):
    for n in names:
        sub = getattr(cfg, n, None)
        if sub is not None and hasattr(sub, "to_dict"):
            return sub
    return None


def _int(cfg, *names, default=None):
    for n in names:
        v = getattr(cfg, n, None) if cfg is not None else None
        if isinstance(v, (list, tuple)) and v and isinstance(v[0], int):
            return v[0]
        if isinstance(v, int) and not isinstance(v, bool):
            return v
    return default


def _special_ids(cfg) -> set[int]:
    out = set()

    def walk(c, depth=0):
        if depth > 4 or c is None:
            return
        for k, v in vars(c).items() if hasattr(c, "__dict__") else []:
            if hasattr(v, "to_dict") and hasattr(v, "model_type"):
                walk(v, depth + 1)
            elif (_TOKEN_KEY_RE.search(k) or k in _BASIC_TOKEN_KEYS):
                for x in (v if isinstance(v, (list, tuple)) else [v]):
                    if isinstance(x, int) and not isinstance(x, bool):
                        out.add(x)
    walk(cfg)
    return out


def _text_vocab(cfg) -> int:
    text = cfg.get_text_config() if hasattr(cfg, "get_text_config") else cfg
    vocab = _int(text, "vocab_size", default=None) or _int(cfg, "vocab_size", default=V)
    # input_ids feed a text encoder with its own, smaller vocabulary (Dia's encoder, FastSpeech2 with HiFi-GAN)
    for k in ("encoder_config", "model_config"):
        sub_vocab = _int(getattr(cfg, k, None), "vocab_size", default=None)
        if sub_vocab:
            vocab = min(vocab, sub_vocab)
    return vocab


def _ids(cfg, shape, gen):
    vocab = _text_vocab(cfg)
    specials = _special_ids(cfg)
    lo = 4 if vocab > 64 else 0
    hi = max(lo + 2, min(vocab, V) - (SPECIAL_ID_BAND if vocab >= V else 0))
    ids = torch.randint(lo, hi, shape, generator=gen)
    for s in specials:  # never collide with a special id (image tokens etc.)
        ids[ids == s] = lo if lo not in specials else lo + 1
    return ids


def _image_size(vcfg):
    size = getattr(vcfg, "image_size", None) if vcfg is not None else None
    if isinstance(size, dict):
        size = size.get("height") or size.get("shortest_edge")
    if isinstance(size, (list, tuple)):
        return int(size[0]), int(size[-1])
    if isinstance(size, int):
        return size, size
    return 64, 64


def _forward_params(model):
    try:
        return inspect.signature(model.forward).parameters
    except (TypeError, ValueError):
        return {}


def _required(params) -> set[str]:
    return {n for n, p in params.items()
            if p.default is inspect.Parameter.empty and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}


def _input_variants(model, cfg, task):
    """Candidate (description, kwargs) pairs, most complete first; the first that runs eagerly wins."""
    params = _forward_params(model)
    required = _required(params)
    gen = torch.Generator().manual_seed(0)
    vcfg = _sub(cfg, "vision_config", "vision_encoder_config", "image_config", "backbone_config") or cfg
    acfg = _sub(cfg, "audio_config", "audio_encoder_config", "encoder_config", "speech_config") or cfg
    text_cfg = cfg.get_text_config() if hasattr(cfg, "get_text_config") else cfg
    channels = _int(vcfg, "num_channels", "in_channels", "input_channels", default=3)
    h, w = _image_size(vcfg)
    variants = []

    def pixels(c=channels, hh=h, ww=w):
        return torch.randn(BATCH, c, hh, ww, generator=gen)

    ids = _ids(cfg, (BATCH, SEQ), gen)
    text = {}
    if "input_ids" in params:
        text["input_ids"] = ids
    if "decoder_input_ids" in params and (getattr(cfg, "is_encoder_decoder", False) or "decoder_input_ids" in required):
        text["decoder_input_ids"] = _ids(cfg, (BATCH, DEC_SEQ), gen)

    has_pixels = "pixel_values" in params
    audio_keys = [k for k in ("input_values", "input_features") if k in params]

    if has_pixels and "input_ids" in params:
        variants.extend(_multimodal_inputs(model, cfg, gen, pixels, params))
        for desc, pix in _pixel_recipes(model, cfg, gen, pixels, params):
            variants.append((f"input_ids+pixel_values({desc})", {**text, **pix}))
        if "pixel_values" not in required:
            variants.append(("text-only", dict(text)))
    elif has_pixels:
        for desc, pix in _pixel_recipes(model, cfg, gen, pixels, params):
            variants.append((f"pixel_values({desc})" if desc != "4d" else "pixel_values", pix))
        frames = _int(vcfg, "num_frames", default=None)
        if frames:
            variants.append(("pixel_values(video)", {"pixel_values": torch.randn(BATCH, frames, channels, h, w,
                                                                                 generator=gen)}))
        for s in (32, 64, 128, 224):
            if (s, s) != (h, w):
                variants.append((f"pixel_values({s}x{s})", {"pixel_values": pixels(hh=s, ww=s)}))
        if required <= {"pixel_values"}:  # keypoint matching (SuperGlue, LightGlue, EfficientLoFTR): image pairs
            variants.append(("pixel_values(pair)", {"pixel_values": torch.stack([pixels(), pixels()], dim=1)}))
        if "decoder_input_ids" in text:  # image encoder + text decoder (VisionEncoderDecoder, Donut)
            enc = _sub(cfg, "encoder", "vision_config") or vcfg
            eh, ew = _image_size(enc)
            variants.append(("pixel_values+decoder_input_ids", {
                "pixel_values": pixels(c=_int(enc, "num_channels", default=channels), hh=eh, ww=ew), **text}))
    if audio_keys:
        base = dict(text) if text else {}
        masks = [k for k in _AUDIO_MASK_KEYS if k in params]
        if "input_values" in audio_keys:
            variants.append(("input_values", {**base, "input_values": torch.randn(BATCH, 4000, generator=gen)}))
            # codecs (DAC, EnCodec, Mimi, X-codec...): (batch, audio channels, samples)
            ch = _int(acfg, "audio_channels", "num_channels", "in_channels", default=1)
            variants.append(("input_values(B,C,T)", {**base, "input_values": torch.randn(BATCH, ch, 4000,
                                                                                       generator=gen)}))
            mel = _int(acfg, "num_mel_bins", default=None)
            max_len = _int(acfg, "max_length", default=None)
            if mel and max_len:  # spectrogram transformers (AST): (batch, max_length frames, mel bins)
                variants.append(("input_values(B,T,mel)", {**base, "input_values": torch.randn(
                    BATCH, max_len, mel, generator=gen)}))
            if "decoder_input_values" in params:  # SpeechT5Model without pre-nets: hidden states in and out
                hid = _int(acfg, "hidden_size", "d_model", default=H)
                variants.append(("input_values(B,T,H)+decoder_input_values", {
                    **base, "input_values": torch.randn(BATCH, SEQ, hid, generator=gen),
                    "decoder_input_values": torch.randn(BATCH, DEC_SEQ, hid, generator=gen)}))
        if "input_features" in audio_keys:
            mel = _int(acfg, "num_mel_bins", "feature_size", "input_feat_per_channel", "n_mels", "mel_dim",
                       "input_dim", default=80)
            src = _int(acfg, "max_source_positions", default=None)
            win = _int(acfg, "n_window", default=None)  # Qwen3-ASR: chunks of 2 * n_window frames
            frames = 2 * src if src else 2 * win if win else 64
            chans = _int(acfg, "input_channels", default=1)
            mk = {k: torch.ones(BATCH, frames, dtype=torch.long) for k in masks}
            variants.append(("input_features(B,mel,T)", {**base, **mk, "input_features": torch.randn(
                BATCH, mel, frames, generator=gen)}))
            # stacked frames (w2v-BERT, SeamlessM4T: feature_size * stride features per frame)
            feat = _int(acfg, "feature_projection_input_dim", default=None) or mel * chans
            variants.append(("input_features(B,T,F)", {**base, **mk, "input_features": torch.randn(
                BATCH, frames, feat, generator=gen)}))
            if frames != 3000:
                variants.append(("input_features(B,mel,3000)",
                                 {**base, "input_features": torch.randn(BATCH, mel, 3000, generator=gen)}))
    if text and not has_pixels and not audio_keys:
        variants.append(("input_ids", dict(text)))
        if "attention_mask" in params:
            variants.append(("input_ids+attention_mask", {**text, "attention_mask": torch.ones_like(ids)}))
        if "bbox" in params and "bbox" not in required:  # layout models that cannot run without boxes (BROS)
            boxes = _boxes(gen, (BATCH, SEQ))
            variants.append(("input_ids+bbox", {**text, "bbox": boxes}))
            variants.append(("input_ids+bbox(normalized)", {**text, "bbox": boxes.float() / 1000}))
        if "visual_feats" in params:  # LXMERT: detector region features and their boxes
            nv = 8
            variants.append(("input_ids+visual_feats+visual_pos", {
                **text, "visual_feats": torch.randn(BATCH, nv, _int(cfg, "visual_feat_dim", default=H), generator=gen),
                "visual_pos": torch.rand(BATCH, nv, _int(cfg, "visual_pos_dim", default=4), generator=gen)}))
        dec = _sub(cfg, "decoder_config")
        dec_books = _int(dec, "num_codebooks", "num_channels", default=None)
        if dec_books and "decoder_input_ids" in text:  # Dia: the decoder reads (B, T, codebooks) audio tokens
            variants.append(("input_ids+decoder_input_ids(B,T,codebooks)", {
                **text, "decoder_input_ids": _ids(cfg, (BATCH, DEC_SEQ, dec_books), gen)}))
        books = _int(text_cfg, "num_codebooks", default=None) or _int(cfg, "num_codebooks", default=None)
        if books and "input_ids" in text:  # audio-token LMs: one token stream per codebook
            variants.append(("input_ids(B*codebooks,T)", {**text, "input_ids": _ids(cfg, (BATCH * books, SEQ), gen)}))
            variants.append(("input_ids(B,T,codebooks)", {**text, "input_ids": _ids(cfg, (BATCH, SEQ, books), gen)}))
            variants.append(("input_ids(B,codebooks,T)", {**text, "input_ids": _ids(cfg, (BATCH, books, SEQ), gen)}))
    if audio_keys and "input_ids" in params:
        variants[:0] = _audio_multimodal_inputs(model, cfg, gen, acfg, params)
        if text and not has_pixels and not required & set(audio_keys):  # last resort: the text path alone
            variants.append(("text-only(audio)", dict(text)))
    if "latents" in required:  # codec decoders (Mimi, Pocket-TTS): continuous latents (B, hidden, frames)
        variants.append(("latents", {"latents": torch.randn(BATCH, _int(cfg, "hidden_size", default=H), 8,
                                                            generator=gen)}))
    if "qformer_input_ids" in params:
        for _, kw in variants:
            kw.setdefault("qformer_input_ids", ids)
    if "grid_thw" in params and "hidden_states" in params:  # Qwen-VL style vision towers
        for t in _grid_ts(cfg):
            flat, grid, _ = _grid_patches(cfg, gen, t=t)
            variants.append(("hidden_states+grid_thw", {"hidden_states": flat, "grid_thw": grid}))
    if not variants and "inputs_embeds" in params:
        hidden = _int(text_cfg, "hidden_size", "d_model", default=H)
        variants.append(("inputs_embeds", {"inputs_embeds": torch.randn(BATCH, SEQ, hidden, generator=gen)}))
    if "past_values" in params:  # time series
        variants.extend(_time_series_inputs(cfg, gen, params))
    variants.extend(_other_family_inputs(cfg, vcfg, gen, params, required, text))
    # fill other required tensor inputs we know how to make
    out = []
    for desc, kw in variants:
        if kw is None:
            continue
        kw = dict(kw)
        if "decoder_input_ids" in required and "decoder_input_ids" not in kw:
            kw["decoder_input_ids"] = _ids(cfg, (BATCH, DEC_SEQ), gen)
        if "attention_mask" in required and "attention_mask" not in kw and "input_ids" in kw:
            kw["attention_mask"] = torch.ones_like(kw["input_ids"])
        if "bbox" in required and "bbox" not in kw and "input_ids" in kw:
            kw["bbox"] = torch.zeros(*kw["input_ids"].shape, 4, dtype=torch.long)
        if "prompt_pixel_values" in required and "pixel_values" in kw:  # SegGPT: an example image and its mask
            kw.setdefault("prompt_pixel_values", torch.randn(kw["pixel_values"].shape, generator=gen))
            kw.setdefault("prompt_masks", torch.randn(kw["pixel_values"].shape, generator=gen))
        if "task_inputs" in required and "task_inputs" not in kw:  # OneFormer: the tokenized task prompt
            n = _int(cfg, "task_seq_len", default=SEQ)
            kw["task_inputs"] = torch.randint(0, _int(cfg, "text_encoder_vocab_size", default=V), (BATCH, n),
                                              generator=gen)
        missing = required - set(kw)
        if missing:
            desc += f" (missing {sorted(missing)})"
        out.append((desc, kw))
    return out


def _other_family_inputs(cfg, vcfg, gen, params, required, text):
    """(description, kwargs) for families whose forward takes neither token ids nor images / audio as such."""
    out = []
    if "pixel_values_videos" in params and "pixel_values" not in params:  # VideoPrism, V-JEPA 2
        frames = _int(vcfg, "num_frames", "frames_per_clip", default=8)
        c = _int(vcfg, "num_channels", "in_chans", default=3)
        h, w = _image_size(vcfg) if getattr(vcfg, "image_size", None) else (_int(vcfg, "crop_size", default=32),) * 2
        kw = {"pixel_values_videos": torch.randn(BATCH, frames, c, h, w, generator=gen)}
        if "input_ids" in text:
            kw["input_ids"] = text["input_ids"]
        out.append(("pixel_values_videos" + ("+input_ids" if "input_ids" in text else ""), kw))
    if "flattened_patches" in params:  # Pix2Struct: (row, column, patch pixels) per patch
        g, width = 4, _int(vcfg, "patch_embed_hidden_size", default=H)
        rows = torch.arange(1, g + 1).repeat_interleave(g).float()
        cols = torch.arange(1, g + 1).repeat(g).float()
        patches = torch.cat([rows[:, None], cols[:, None], torch.randn(g * g, width, generator=gen)], dim=-1)
        out.append(("flattened_patches" + ("+decoder_input_ids" if "decoder_input_ids" in params else ""), {
            "flattened_patches": patches.expand(BATCH, -1, -1).clone(),
            "attention_mask": torch.ones(BATCH, g * g, dtype=torch.long),
            **({"decoder_input_ids": _ids(cfg, (BATCH, DEC_SEQ), gen)} if "decoder_input_ids" in params else {})}))
    if "inputs" in required:  # PerceiverModel without a preprocessor: (batch, positions, d_model) inputs
        out.append(("inputs", {"inputs": torch.randn(BATCH, SEQ, _int(cfg, "d_model", default=H), generator=gen)}))
    if "states" in params and "actions" in params:  # Decision Transformer: one step = (return, state, action)
        t = SEQ // 2
        out.append(("states+actions+returns_to_go", {
            "states": torch.randn(BATCH, t, _int(cfg, "state_dim", default=8), generator=gen),
            "actions": torch.randn(BATCH, t, _int(cfg, "act_dim", default=4), generator=gen),
            "rewards": torch.randn(BATCH, t, 1, generator=gen),
            "returns_to_go": torch.randn(BATCH, t, 1, generator=gen),
            "timesteps": torch.arange(t).expand(BATCH, t).clone(),
            "attention_mask": torch.ones(BATCH, t, dtype=torch.long)}))
    if "query_embeds" in required:  # a Q-Former alone: learned queries attending to image features
        nq = _int(cfg, "num_query_tokens", default=8)
        out.append(("query_embeds+encoder_hidden_states", {
            "query_embeds": torch.randn(BATCH, nq, _int(cfg, "hidden_size", default=H), generator=gen),
            "encoder_hidden_states": torch.randn(BATCH, 16, _int(cfg, "encoder_hidden_size", default=H),
                                                 generator=gen)}))
    return out


def _boxes(gen, shape):
    """Token boxes (x0, y0, x1, y1) with x0 < x1, y0 < y1 on the 0..1000 grid the layout models use."""
    lo = torch.randint(0, 500, (*shape, 2), generator=gen)
    size = torch.randint(1, 500, (*shape, 2), generator=gen)
    return torch.cat([lo, lo + size], dim=-1)


def _time_series_inputs(cfg, gen, params):
    """(description, kwargs) for the time-series families, by what their forward takes."""
    ctx = _int(cfg, "context_length", default=32) or 32
    pred = _int(cfg, "prediction_length", "horizon_length", default=8) or 8
    if "past_values_padding" in params:  # TimesFM: (B, T) series, T a whole number of patches, 1 = padded
        kw = {"past_values": torch.randn(BATCH, ctx, generator=gen),
              "past_values_padding": torch.zeros(BATCH, ctx, dtype=torch.long)}
        if "freq" in params:
            kw["freq"] = torch.zeros(BATCH, 1, dtype=torch.long)
        return [("time-series(B,T)+padding", kw)]
    nch = _int(cfg, "num_input_channels", default=None)
    if nch is not None:  # PatchTST / PatchTSMixer: (B, context_length, channels)
        kw = {"past_values": torch.randn(BATCH, ctx, nch, generator=gen)}
        mask = next((k for k in ("past_observed_mask", "observed_mask") if k in params), None)
        if mask:
            kw[mask] = torch.ones(BATCH, ctx, nch)
        return [("time-series(B,T,C)", kw)]
    # GluonTS-style encoder-decoders (TimeSeriesTransformer, Informer, Autoformer): the past window holds
    # context_length steps plus the largest lag; time features always have at least one column
    lags = getattr(cfg, "lags_sequence", None) or [1]
    past_len = ctx + max(lags)
    nin = _int(cfg, "input_size", default=1) or 1
    shape = (BATCH, past_len) if nin == 1 else (BATCH, past_len, nin)
    kw = {"past_values": torch.randn(*shape, generator=gen), "past_observed_mask": torch.ones(*shape)}
    ntf = _int(cfg, "num_time_features", default=0) or 0
    if "past_time_features" in params:
        kw["past_time_features"] = torch.randn(BATCH, past_len, ntf, generator=gen)
    if "future_time_features" in params:
        kw["future_time_features"] = torch.randn(BATCH, pred, ntf, generator=gen)
    fshape = (BATCH, pred) if nin == 1 else (BATCH, pred, nin)
    kw["future_values"] = torch.randn(*fshape, generator=gen)
    return [("time-series", kw)]


def _grid_patches(vcfg, gen, n_images=BATCH, t=None):
    """Qwen-VL style vision input: flattened patches plus grid_thw, a 1 x g x g grid per image."""
    p = _int(vcfg, "patch_size", default=8)
    t = t or _int(vcfg, "temporal_patch_size", default=2)
    c = _int(vcfg, "in_channels", "num_channels", "in_chans", default=3)
    m = _int(vcfg, "spatial_merge_size", "merge_size", default=2)
    g = 2 * m
    grid = torch.tensor([[1, g, g]] * n_images)
    flat = torch.randn(n_images * g * g, c * t * p * p, generator=gen)
    return flat, grid, g * g // (m * m)


def _grid_ts(vcfg) -> list[int]:
    t = _int(vcfg, "temporal_patch_size", default=None)
    return [t] if t else [2, 1]


def _pixel_recipes(model, cfg, gen, pixels, params):
    """(description, extra kwargs) ways to pass images, most likely first."""
    vcfg = _sub(cfg, "vision_config", "vision_encoder_config") or cfg
    out = []
    for gk in ("image_grid_thw", "grid_thw"):
        if gk in params:
            for t in _grid_ts(vcfg):
                flat, grid, _ = _grid_patches(vcfg, gen, t=t)
                kw = {"pixel_values": flat, gk: grid}
                if "merge_sizes" in params:  # VideoLLaMA3: the spatial merge of each image
                    kw["merge_sizes"] = torch.tensor([_int(vcfg, "spatial_merge_size", "merge_size", default=2)]
                                                     * grid.shape[0])
                out.append(("grid" if t != 1 else "grid,t=1", kw))
            break
    if "spatial_shapes" in params and "pixel_attention_mask" in params:  # NaFlex (SigLIP2): flattened patches
        p = _int(vcfg, "patch_size", default=PATCH)
        c = _int(vcfg, "num_channels", default=3)
        g = 4
        out.append(("patches+spatial_shapes", {
            "pixel_values": torch.randn(BATCH, g * g, c * p * p, generator=gen),
            "pixel_attention_mask": torch.ones(BATCH, g * g, dtype=torch.long),
            "spatial_shapes": torch.tensor([[g, g]] * BATCH)}))
    pv = pixels()
    out.append(("4d", {"pixel_values": pv}))
    out.append(("5d", {"pixel_values": pv.unsqueeze(1)}))
    if "image_attention_mask" in params and "input_ids" in params:  # IDEFICS: images per sample, which tokens see them
        out.append(("5d+image_attention_mask", {"pixel_values": pv.unsqueeze(1),
                                                "image_attention_mask": torch.ones(BATCH, SEQ, 1, dtype=torch.long)}))
    frames = _int(vcfg, "num_frames", default=None)
    if frames and "input_ids" in params:  # video-text models (X-CLIP): (batch, frames, channels, h, w)
        out.append(("video", {"pixel_values": torch.stack([pixels() for _ in range(frames)], dim=1)}))
    if "image_sizes" in params:
        sizes = torch.tensor([list(pv.shape[-2:])] * BATCH)
        out.append(("4d+image_sizes", {"pixel_values": pv, "image_sizes": sizes}))
        out.append(("5d+image_sizes", {"pixel_values": pv.unsqueeze(1), "image_sizes": sizes}))
    return out


def _features_of(getter, kw) -> int | None:
    """How many placeholder tokens the features ``getter(**kw)`` returns stand for (None: it fails)."""
    try:
        with torch.no_grad(), _quiet():
            return _count_features(getter(**kw))
    except Exception:  # noqa: BLE001 -- this recipe does not fit the model
        return None


def _ids_with_placeholders(cfg, gen, tok: int, n: int):
    """Text ids with ``n`` placeholder tokens ``tok`` (image or audio) from position 2 on."""
    ids = _ids(cfg, (BATCH, SEQ + n), gen)
    ids[:, 2:2 + n] = tok
    return ids


def _count_features(feats) -> int | None:
    if hasattr(feats, "pooler_output") and feats.pooler_output is not None:
        feats = feats.pooler_output
    elif hasattr(feats, "last_hidden_state"):
        feats = feats.last_hidden_state
    if isinstance(feats, (list, tuple)):
        if not all(torch.is_tensor(f) for f in feats):
            return None
        total = sum(f.shape[0] * (f.shape[1] if f.dim() == 3 else 1) if f.dim() >= 2 else 0 for f in feats)
        return total // BATCH
    if torch.is_tensor(feats):
        if feats.dim() == 3:
            return feats.shape[0] * feats.shape[1] // BATCH
        if feats.dim() == 2:
            return feats.shape[0] // BATCH
    return None


def _find_getter(model, name):
    """model.<name>, or that of the model it wraps (ShieldGemma2ForImageClassification wraps a Gemma 3 model)."""
    getter = getattr(model, name, None)
    inner = getattr(model, "model", None)
    if getter is None and isinstance(inner, torch.nn.Module):
        getter = getattr(inner, name, None)
    return getter


def _token_id(cfg, *names):
    """The value of the first of ``names`` that the config holds as an int, or None."""
    return next((v for v in (getattr(cfg, k, None) for k in names) if isinstance(v, int)), None)


def _multimodal_inputs(model, cfg, gen, pixels, params):
    """input_ids holding as many image tokens as the model makes image features, plus the pixel inputs."""
    tok = _token_id(cfg, "image_token_id", "image_token_index")
    getter = _find_getter(model, "get_image_features")
    queries = getattr(cfg, "num_query_tokens", None)  # Q-Former models: one image token per query (the processor's)
    queries = queries if isinstance(queries, int) and queries > 0 else None
    video = False
    latents = getattr(cfg, "latent_query_num", None)
    if tok is None and "image_embeds_position_mask" in params and isinstance(latents, int):
        # Kosmos-2: no image token id; the processor inserts latent_query_num placeholder tokens whose positions
        # image_embeds_position_mask marks, where the image features replace the embeddings
        tok, queries = max(_special_ids(cfg) | {V - 1}), latents
    if tok is None and queries:  # InstructBLIP-Video: one placeholder per query and frame
        tok = _token_id(cfg, "video_token_id", "video_token_index")
        video = True
    if tok is None or (getter is None and not queries):
        return []
    try:
        getter_params = inspect.signature(getter).parameters if getter is not None else {}
    except (TypeError, ValueError):
        getter_params = {}
    out = []
    for desc, pix in _pixel_recipes(model, cfg, gen, pixels, params):
        kw = {k: v for k, v in pix.items() if k in getter_params or "kwargs" in getter_params}
        if queries:
            pv = pix["pixel_values"]
            if video and pv.dim() != 5:
                continue
            n = queries * (pv.shape[1] if video else 1)
        else:
            n = _features_of(getter, kw)
        if not n or n <= 0 or n > 4096:
            continue
        ids = _ids_with_placeholders(cfg, gen, tok, n)
        kw = {"input_ids": ids, **pix}
        if "mm_token_type_ids" in params:  # 1 marks image tokens (what the processors return)
            kw["mm_token_type_ids"] = (ids == tok).long()
        if "image_embeds_position_mask" in params:  # Kosmos-2 marks the image tokens' positions
            kw["image_embeds_position_mask"] = (ids == tok).long()
        out.append((f"input_ids+pixel_values(image tokens, {desc})", kw))
    return out


_AUDIO_MASK_KEYS = ("input_features_mask", "feature_attention_mask", "audio_attention_mask", "input_features_attention_mask")


def _audio_multimodal_inputs(model, cfg, gen, acfg, params):
    """input_ids holding as many audio tokens as the model makes audio features, plus the audio input
    (input_features spectrograms, or input_values waveforms)."""
    tok = _token_id(cfg, "audio_token_id", "audio_token_index")
    getter = _find_getter(model, "get_audio_features")
    if tok is None or getter is None:
        return []
    try:
        gp = inspect.signature(getter).parameters
    except (TypeError, ValueError):
        gp = {}
    candidates = []  # (description, audio kwargs)
    if "input_features" in params:
        mel = _int(acfg, "num_mel_bins", "feature_size", "n_mels", "input_dim", default=80)
        src = _int(acfg, "max_source_positions", default=None)
        win = _int(acfg, "n_window", default=None)
        for frames in ([2 * src] if src else [2 * win] if win else []) + [64, 128, 3000]:
            for layout in ("BFT", "BTF"):
                feats = torch.randn(BATCH, mel, frames, generator=gen) if layout == "BFT" else \
                    torch.randn(BATCH, frames, mel, generator=gen)
                extra = {k: torch.ones(BATCH, frames, dtype=torch.long) for k in _AUDIO_MASK_KEYS if k in params}
                candidates.append((f"input_features(audio tokens, {layout}, T={frames})",
                                   {"input_features": feats, **extra}))
    if "input_values" in params:
        wav = torch.randn(BATCH, 4000, generator=gen)
        candidates.append(("input_values(audio tokens)", {"input_values": wav}))
        candidates.append(("input_values(audio tokens, B,C,T)", {"input_values": wav.unsqueeze(1)}))
    for desc, audio in candidates:
        kw = {k: v for i, (k, v) in enumerate(audio.items()) if i == 0 or k in gp}
        n = _features_of(getter, kw)
        if not n or n <= 0 or n > 4096:
            continue
        ids = _ids_with_placeholders(cfg, gen, tok, n)
        return [(f"input_ids+{desc}", {"input_ids": ids, **audio})]
    return []


_DYN_TEXT_KEYS = ("input_ids", "attention_mask", "token_type_ids", "position_ids", "decoder_input_ids",
                  "decoder_attention_mask", "bbox")


def _dynamic_shapes(kw: dict):
    """Dynamic sequence length for token inputs (Dim.DYNAMIC: torch.export errors if it must specialize)."""
    if not any(k in kw for k in _DYN_TEXT_KEYS) or "pixel_values" in kw:
        return None
    keys = set(_DYN_TEXT_KEYS)
    if "input_ids" not in kw:  # masks / boxes of other inputs (Pix2Struct's patches, Decision Transformer's steps)
        keys -= {"attention_mask", "token_type_ids", "position_ids", "bbox"}
        if not keys & set(kw):
            return None
    dyn = torch.export.Dim.DYNAMIC
    return {k: ({1: dyn} if k in keys and torch.is_tensor(v) and v.dim() >= 2 else None)
            for k, v in kw.items()}


_NOT_EXERCISED = {"text-only": "vision path not exercised", "text-only(audio)": "audio path not exercised"}


def _eager_ok(model, kw):
    try:
        with torch.no_grad(), _quiet():
            model(**copy.deepcopy(kw))
        return None
    except Exception as e:
        return f"{type(e).__name__}: {str(e)[:200]}"


def _n_params(model) -> int:
    return sum(p.numel() for p in model.parameters())


def make_case(name: str, dtype: torch.dtype | None = None) -> RealCase:
    """Build case ``name`` (seeded), or raise CaseUnavailable saying why it cannot be built offline.

    The config is shrunk with absolute small sizes first; when that model cannot be built or run, once
    more with every width divided by a common factor (proportions kept). A name with a variant
    (``llama@bf16``: corpus/variants.py) is that variant of the base case. ``dtype``: where the
    builder itself must know it (a static-cache wrapper makes its cache in the model's dtype).
    """
    from . import variants

    base, variant = variants.split(name)
    if variant is not None:
        return variants.apply(make_case(base, variants.dtype_of(variant)), variant, CaseUnavailable)
    model_type, task = _parse(name)
    errors = []
    for mode in ("small", "scaled"):
        try:
            with _quiet():
                case = _make(name, model_type, task, mode, dtype)
            if mode != "small":
                case.notes = (case.notes + "; " if case.notes else "") + f"shrunk proportionally ({errors[0][:80]})"
            return case
        except CaseUnavailable as e:
            errors.append(str(e))
            if not e.retry:
                break
    raise CaseUnavailable(errors[0] if len(errors) == 1 else f"{errors[0]} || scaled: {errors[1]}"[:900],
                          retry=False)


def _make(name, model_type, task, mode, dtype=None) -> RealCase:
    cfg = _shrunk_config(model_type, mode, task)
    cls = _model_class(model_type, task)
    if task == STATIC_CACHE:
        return _static_cache_case(name, model_type, cls, cfg, dtype)
    model, attn = _build_model(cls, cfg)
    n = _n_params(model)
    if n > MAX_PARAMS:
        raise CaseUnavailable(f"too big after shrinking: {n / 1e6:.1f}M parameters")
    errors = []
    for desc, kw in _input_variants(model, model.config, task):
        err = _eager_ok(model, kw)
        if err is None:
            return RealCase(name=name, model_type=model_type, task=task, model=model, args=(), kwargs=kw,
                            dynamic_shapes=_dynamic_shapes(kw), model_class=cls.__name__, attn_implementation=attn,
                            inputs=desc, notes=_NOT_EXERCISED.get(desc, ""))
        errors.append(f"[{desc}] {err}")
    if not errors:
        raise CaseUnavailable(f"no input recipe for {cls.__name__}.forward{tuple(_forward_params(model))[:8]}",
                              retry=False)
    raise CaseUnavailable("no input recipe runs eagerly: " + " | ".join(errors)[:600])


def _static_cache_case(name, model_type, cls, cfg, dtype=None):
    from transformers.integrations.executorch import TorchExportableModuleForDecoderOnlyLM

    cfg = copy.deepcopy(cfg)
    for c in {id(cfg): cfg, id(cfg.get_text_config()): cfg.get_text_config()}.values():
        c.use_cache = True
    model, attn = _build_model(cls, cfg)
    if dtype is not None:  # before the wrapper makes its cache (outside the module tree) in the model's dtype
        model = model.to(dtype)
    gc = model.generation_config
    if gc is None:
        raise CaseUnavailable("no generation_config")
    gc.use_cache = True
    gc.cache_implementation = "static"
    try:
        torch.manual_seed(0)
        wrapper = TorchExportableModuleForDecoderOnlyLM(model, batch_size=1, max_cache_len=CACHE_LEN).model
    except Exception as e:
        raise CaseUnavailable(f"TorchExportableModuleForDecoderOnlyLM: {type(e).__name__}: {str(e)[:300]}") from None
    wrapper.eval()
    gen = torch.Generator().manual_seed(0)
    kw = {"input_ids": _ids(cfg, (1, CACHE_SEQ), gen), "cache_position": torch.arange(CACHE_SEQ)}
    err = _eager_ok(copy.deepcopy(wrapper), kw)
    if err is not None:
        raise CaseUnavailable(f"static-cache wrapper does not run eagerly: {err}")
    # transformers' own export recipe: the prefill length is dynamic, bounded by the cache length
    seq = torch.export.Dim("seq_length", max=CACHE_LEN - 1)
    return RealCase(name=name, model_type=model_type, task=STATIC_CACHE, model=wrapper, args=(), kwargs=kw,
                    dynamic_shapes={"input_ids": {1: seq}, "cache_position": {0: seq}}, strict=True, model_class=f"{type(wrapper).__name__}({cls.__name__})",
                    attn_implementation=attn, inputs="input_ids+cache_position")
