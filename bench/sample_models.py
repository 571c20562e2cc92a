"""The held-apart benchmark sample: models drawn at random, with a seed, from the registries of libraries
nobody tunes pt2b against (torchvision, timm, diffusers, transformers decoders in bfloat16), built offline.

A candidate is named "<library>/<model>" ("torchvision/resnet18", "torchvision-detection/fcos_resnet50_fpn",
"timm/gcvit_xxtiny", "diffusers/AutoencoderKL", "transformers/llama/causal-lm@bf16"). ``draw`` orders each
library's registry by a seeded shuffle; ``build`` makes one candidate with random weights and a small fixed
input, downloading nothing (weights=None, pretrained=False, configs only; ``offline`` refuses any download
attempted on the way). A candidate too large for a 2-core bench (more than MAX_PARAMS parameters, counted
on the meta device before anything is allocated) is refused with SampleRefused, as is an unknown name.
torchvision, timm and diffusers are the `bench` extra of pyproject.toml; a library missing is refused too.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import random

import torch

__all__ = ["LIBRARIES", "MAX_PARAMS", "Built", "DownloadRefused", "SampleRefused", "build", "decoder_0p6b", "draw",
           "offline", "quotas", "registry"]

# A model with more parameters than this is left out: the sample runs one model at a time on 2 shared cores
MAX_PARAMS = 60_000_000

# the fp32 libraries and the share of the sample each gets (the bf16 decoders are counted apart)
LIBRARIES = {"torchvision": 0.25, "torchvision-detection": 0.1, "timm": 0.45, "diffusers": 0.2}


class SampleRefused(Exception):
    """A candidate the sample does not build here (unknown, too large, its library not installed)."""


class DownloadRefused(RuntimeError):
    """A download attempted while building a sample model: the sample uses random weights only."""


@dataclasses.dataclass
class Built:
    name: str
    model: torch.nn.Module  # eval mode, random weights
    args: tuple
    kwargs: dict
    params: int
    dtype: str  # "float32" or "bfloat16"


# ------------------------------------------------------------------------------------------------
# Registries and the draw
# ------------------------------------------------------------------------------------------------

def _torchvision():
    """torchvision, imported where its C++ ops do not load (a CUDA build beside the CPU torch): its
    fake kernels for those ops are then not registered, the models that call them fail when captured
    (the detection models, dropped with the reason), and the others are whole Python."""
    import sys

    if "torchvision" in sys.modules:
        return sys.modules["torchvision"]
    import torch.library

    register = torch.library.register_fake

    def tolerant(op, *a, **k):
        ns, _, name = op.partition("::") if isinstance(op, str) else ("", "", "")
        if ns == "torchvision" and not hasattr(getattr(torch.ops, ns), name):
            return lambda fn: fn
        return register(op, *a, **k)

    torch.library.register_fake = tolerant
    try:
        import torchvision
    finally:
        torch.library.register_fake = register
    return torchvision


def _torchvision_first() -> None:
    """torchvision imported by _torchvision before timm, diffusers or transformers import it their way."""
    with contextlib.suppress(ImportError):
        _torchvision()


def registry(library: str) -> list[str]:
    """Every model name ``library``'s own registry lists (sorted), or SampleRefused where it is missing."""
    _torchvision_first()
    try:
        if library == "torchvision":
            torchvision = _torchvision()
            return sorted(torchvision.models.list_models(module=torchvision.models))
        if library == "torchvision-detection":
            torchvision = _torchvision()
            return sorted(torchvision.models.list_models(module=torchvision.models.detection))
        if library == "timm":
            import timm

            return sorted(timm.list_models())
        if library == "diffusers":
            import diffusers

            return sorted(n for n in _DIFFUSERS if hasattr(diffusers, n))
        if library == "transformers":
            from tools.corpus.transformers_zoo import case_names

            return sorted(case_names(tasks=["causal-lm"]))
    except ImportError as e:
        raise SampleRefused(f"{library} is not installed ({e}); pip install 'pt2b[bench]'") from e
    raise SampleRefused(f"no library {library!r} in the sample; one of {', '.join([*LIBRARIES, 'transformers'])}")


def draw(seed: int, libraries=(*LIBRARIES, "transformers")) -> dict[str, list[str]]:
    """library -> its whole registry in an order shuffled by ``seed`` (the same seed, the same order): the
    bench takes candidates from the front, past those it drops, until each library's quota is met."""
    if not isinstance(seed, int) or isinstance(seed, bool):
        raise SampleRefused(f"the seed must be an int, not {type(seed).__name__}")
    out = {}
    for lib in libraries:
        names = registry(lib)
        random.Random(f"{seed}/{lib}").shuffle(names)
        out[lib] = [f"{lib}/{n}" + ("@bf16" if lib == "transformers" else "") for n in names]
    return out


def quotas(n: int) -> dict[str, int]:
    """How many of ``n`` fp32 models each library gives (LIBRARIES' shares, the rest to timm)."""
    if n < 1:
        raise SampleRefused(f"the sample needs at least one model, not {n}")
    out = {lib: int(n * share) for lib, share in LIBRARIES.items()}
    out["timm"] += n - sum(out.values())
    return out


# ------------------------------------------------------------------------------------------------
# Building, offline
# ------------------------------------------------------------------------------------------------

@contextlib.contextmanager
def offline():
    """Within: the Hugging Face hub offline, and torch.hub's downloads raise DownloadRefused."""
    import torch.hub

    def refuse(url, *a, **k):
        raise DownloadRefused(f"the sample builds models with random weights; refused to download {url}")

    saved = {k: os.environ.get(k) for k in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")}
    patched = [(torch.hub, "download_url_to_file"), (torch.hub, "load_state_dict_from_url")]
    originals = [getattr(mod, attr) for mod, attr in patched]
    os.environ.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    for mod, attr in patched:
        setattr(mod, attr, refuse)
    try:
        yield
    finally:
        for (mod, attr), fn in zip(patched, originals):
            setattr(mod, attr, fn)
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _params(make) -> int:
    """The parameter count of ``make()`` built on the meta device (nothing allocated), -1 where it cannot be."""
    try:
        with torch.device("meta"):
            return sum(p.numel() for p in make().parameters())
    except Exception:  # noqa: BLE001 -- a model whose construction reads values: counted when built
        return -1


def _sized(name: str, make):
    """``make()`` in eval mode with seeded random weights, refused above MAX_PARAMS."""
    n = _params(make)
    if n > MAX_PARAMS:
        raise SampleRefused(f"{name}: {n / 1e6:.0f}M parameters, more than the sample's {MAX_PARAMS / 1e6:.0f}M")
    torch.manual_seed(0)
    model = make().eval()
    n = sum(p.numel() for p in model.parameters())
    if n > MAX_PARAMS:
        raise SampleRefused(f"{name}: {n / 1e6:.0f}M parameters, more than the sample's {MAX_PARAMS / 1e6:.0f}M")
    return model, n


def _randn(*shape, seed: int = 0) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def build(name: str) -> Built:
    """The candidate ``name`` (as draw names it), offline, with random weights and a small fixed input."""
    lib, _, model_name = name.partition("/")
    if not model_name:
        raise SampleRefused(f"{name!r} is not a sample name ('<library>/<model>')")
    _torchvision_first()
    with offline():
        if lib == "torchvision":
            torchvision = _torchvision()
            model, n = _sized(name, lambda: torchvision.models.get_model(model_name, weights=None))
            size = 299 if model_name == "inception_v3" else 224
            return Built(name, model, (_randn(1, 3, size, size),), {}, n, "float32")
        if lib == "torchvision-detection":
            torchvision = _torchvision()
            if not torchvision.extension._has_ops():
                raise SampleRefused(f"{name}: torchvision's C++ ops (nms, roi_align), which detection calls, do "
                                    "not load beside this torch (a torchvision built for another torch)")
            model, n = _sized(name, lambda: torchvision.models.get_model(model_name, weights=None,
                                                                         weights_backbone=None))
            return Built(name, model, ([_randn(3, 320, 320)],), {}, n, "float32")
        if lib == "timm":
            import timm

            model, n = _sized(name, lambda: timm.create_model(model_name, pretrained=False))
            size = tuple(model.pretrained_cfg.get("input_size", (3, 224, 224)))
            return Built(name, model, (_randn(1, *size),), {}, n, "float32")
        if lib == "diffusers":
            if model_name not in _DIFFUSERS:
                raise SampleRefused(f"{name}: no small config for this diffusers class here")
            make, inputs = _DIFFUSERS[model_name]
            model, n = _sized(name, make)
            args, kwargs = inputs()
            return Built(name, model, args, {**kwargs, "return_dict": False}, n, "float32")
        if lib == "transformers":
            from tools.corpus.transformers_zoo import CaseUnavailable, make_case

            try:
                case = make_case(model_name.removesuffix("@bf16"))
            except CaseUnavailable as e:
                raise SampleRefused(f"{name}: {e}") from e
            model = case.model.to(torch.bfloat16).eval()
            args, kwargs = _bf16((case.args, case.kwargs or {}))
            return Built(name, model, args, kwargs, sum(p.numel() for p in model.parameters()), "bfloat16")
        if lib == "big" and model_name == "decoder-0.6b@bf16":
            return decoder_0p6b()
    raise SampleRefused(f"{name!r}: unknown library {lib!r}")


def _bf16(tree):
    """Floating tensors of ``tree`` in bfloat16 (a bf16 model's float inputs), the rest as they are."""
    return torch.utils._pytree.tree_map_only(
        torch.Tensor, lambda t: t.to(torch.bfloat16) if t.is_floating_point() else t, tree)


def decoder_0p6b() -> Built:
    """A Llama-style decoder of about 0.6B parameters (8 layers of width 2048, vocabulary 48000, untied
    embeddings) in bfloat16 with random weights, on 128 tokens: the sample's big-model line."""
    import transformers

    cfg = transformers.LlamaConfig(hidden_size=2048, intermediate_size=5632, num_hidden_layers=8,
                                   num_attention_heads=16, num_key_value_heads=16, vocab_size=48000,
                                   max_position_embeddings=512, tie_word_embeddings=False, use_cache=False)
    torch.manual_seed(0)
    dtype = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)  # built in bf16 directly: no fp32 copy of 0.6B parameters
    try:
        model = transformers.LlamaForCausalLM(cfg).eval()
    finally:
        torch.set_default_dtype(dtype)
    ids = torch.randint(0, cfg.vocab_size, (1, 128), generator=torch.Generator().manual_seed(0))
    return Built("big/decoder-0.6b@bf16", model, (ids,), {"use_cache": False, "return_dict": False},
                 sum(p.numel() for p in model.parameters()), "bfloat16")


# ------------------------------------------------------------------------------------------------
# diffusers: its model classes, each with a small config and inputs of the shapes its forward takes
# ------------------------------------------------------------------------------------------------

def _d(cls: str, **config):
    def make():
        import diffusers

        return getattr(diffusers, cls)(**config)
    return make


_DIFFUSERS = {
    "UNet2DModel": (
        _d("UNet2DModel", sample_size=32, in_channels=3, out_channels=3, layers_per_block=1,
           block_out_channels=(32, 64, 64), down_block_types=("DownBlock2D", "AttnDownBlock2D", "DownBlock2D"),
           up_block_types=("UpBlock2D", "AttnUpBlock2D", "UpBlock2D"), norm_num_groups=8),
        lambda: ((_randn(1, 3, 32, 32), torch.tensor([10])), {})),
    "UNet2DConditionModel": (
        _d("UNet2DConditionModel", sample_size=32, in_channels=4, out_channels=4, layers_per_block=1,
           block_out_channels=(64, 128), cross_attention_dim=64, attention_head_dim=8, norm_num_groups=16,
           down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"), up_block_types=("UpBlock2D", "CrossAttnUpBlock2D")),
        lambda: ((_randn(1, 4, 32, 32), torch.tensor([10]), _randn(1, 16, 64, seed=1)), {})),
    "UNet1DModel": (
        _d("UNet1DModel", sample_size=64, in_channels=2, out_channels=2, block_out_channels=(32, 32, 64),
           extra_in_channels=16, down_block_types=("DownBlock1DNoSkip", "DownBlock1D", "AttnDownBlock1D"),
           up_block_types=("AttnUpBlock1D", "UpBlock1D", "UpBlock1DNoSkip"), mid_block_type="UNetMidBlock1D"),
        lambda: ((_randn(1, 2, 64), torch.tensor([10])), {})),
    "AutoencoderKL": (
        _d("AutoencoderKL", in_channels=3, out_channels=3, latent_channels=4, block_out_channels=(32, 64),
           down_block_types=("DownEncoderBlock2D",) * 2, up_block_types=("UpDecoderBlock2D",) * 2,
           norm_num_groups=16, sample_size=64),
        lambda: ((_randn(1, 3, 64, 64),), {})),
    "AutoencoderTiny": (
        _d("AutoencoderTiny", in_channels=3, out_channels=3, encoder_block_out_channels=(32, 32, 32, 32),
           decoder_block_out_channels=(32, 32, 32, 32), num_encoder_blocks=(1, 1, 1, 1),
           num_decoder_blocks=(1, 1, 1, 1), latent_channels=4),
        lambda: ((_randn(1, 3, 64, 64),), {})),
    "VQModel": (
        _d("VQModel", in_channels=3, out_channels=3, latent_channels=3, block_out_channels=(32, 64),
           down_block_types=("DownEncoderBlock2D",) * 2, up_block_types=("UpDecoderBlock2D",) * 2,
           norm_num_groups=16, num_vq_embeddings=64),
        lambda: ((_randn(1, 3, 32, 32),), {})),
    "DiTTransformer2DModel": (
        _d("DiTTransformer2DModel", num_attention_heads=4, attention_head_dim=16, in_channels=4, out_channels=8,
           num_layers=4, sample_size=16, patch_size=2, num_embeds_ada_norm=1000, norm_num_groups=16),
        lambda: ((_randn(1, 4, 16, 16),), {"timestep": torch.tensor([10]), "class_labels": torch.tensor([1])})),
    "SD3Transformer2DModel": (
        _d("SD3Transformer2DModel", sample_size=16, patch_size=2, in_channels=4, num_layers=4, attention_head_dim=16,
           num_attention_heads=4, joint_attention_dim=64, caption_projection_dim=64, pooled_projection_dim=32,
           out_channels=4, pos_embed_max_size=32),
        lambda: ((_randn(1, 4, 16, 16),), {"encoder_hidden_states": _randn(1, 8, 64, seed=1),
                                           "pooled_projections": _randn(1, 32, seed=2),
                                           "timestep": torch.tensor([10])})),
    "FluxTransformer2DModel": (
        _d("FluxTransformer2DModel", patch_size=1, in_channels=16, num_layers=2, num_single_layers=2,
           attention_head_dim=16, num_attention_heads=4, joint_attention_dim=64, pooled_projection_dim=32,
           axes_dims_rope=(4, 6, 6)),
        lambda: ((_randn(1, 64, 16),), {"encoder_hidden_states": _randn(1, 8, 64, seed=1),
                                        "pooled_projections": _randn(1, 32, seed=2), "timestep": torch.tensor([0.5]),
                                        "img_ids": torch.zeros(64, 3), "txt_ids": torch.zeros(8, 3)})),
    "PriorTransformer": (
        _d("PriorTransformer", num_attention_heads=4, attention_head_dim=16, num_layers=4, embedding_dim=32,
           num_embeddings=8, additional_embeddings=4),
        lambda: ((_randn(1, 32), torch.tensor([10]), _randn(1, 32, seed=1)),
                 {"encoder_hidden_states": _randn(1, 8, 32, seed=2), "attention_mask": torch.ones(1, 8)})),
}
