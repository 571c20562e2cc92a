"""Models of families other than transformers' text models, for the lowering bench (issue 40):
convolutional image classifiers (transformers' ResNet-50, ConvNeXt-T, EfficientNet-B0, MobileNetV2
at their default sizes) and diffusion U-Nets from diffusers, each built from its library's own code
with random weights (nothing downloaded), in eval mode. (torchvision and timm, the usual homes of
conv classifiers, install here only as CUDA builds whose kernels do not load beside the CPU torch.)

Each builder returns (model, args, kwargs). diffusers is a bench-only dependency
(`pip install diffusers==0.42.1`); a family whose library is missing is reported, not run.
"""

from __future__ import annotations

import torch


def _classifier(config: str, model: str, **overrides):
    import transformers

    torch.manual_seed(0)
    cfg = getattr(transformers, config)(**overrides)
    pixels = torch.randn(1, 3, 224, 224, generator=torch.Generator().manual_seed(0))
    return getattr(transformers, model)(cfg).eval(), (pixels,), {"return_dict": False}


def unet2d_condition():
    """A Stable-Diffusion-shaped conditional U-Net, narrowed (channels 128/256/256, 2 layers a block,
    cross attention over 77 tokens of width 256) to fit a 2-core bench: ~50M parameters."""
    from diffusers import UNet2DConditionModel

    torch.manual_seed(0)
    model = UNet2DConditionModel(
        sample_size=32, in_channels=4, out_channels=4, layers_per_block=2,
        block_out_channels=(128, 256, 256), cross_attention_dim=256, attention_head_dim=8,
        down_block_types=("CrossAttnDownBlock2D", "CrossAttnDownBlock2D", "DownBlock2D"),
        up_block_types=("UpBlock2D", "CrossAttnUpBlock2D", "CrossAttnUpBlock2D")).eval()
    gen = torch.Generator().manual_seed(0)
    args = (torch.randn(1, 4, 32, 32, generator=gen), torch.tensor([10]),
            torch.randn(1, 77, 256, generator=gen))
    return model, args, {"return_dict": False}


def unet2d():
    """An unconditional DDPM-shaped U-Net (channels 64/128/128/256, attention in one block)."""
    from diffusers import UNet2DModel

    torch.manual_seed(0)
    model = UNet2DModel(
        sample_size=32, in_channels=3, out_channels=3, layers_per_block=2, block_out_channels=(64, 128, 128, 256),
        down_block_types=("DownBlock2D", "DownBlock2D", "AttnDownBlock2D", "DownBlock2D"),
        up_block_types=("UpBlock2D", "AttnUpBlock2D", "UpBlock2D", "UpBlock2D")).eval()
    gen = torch.Generator().manual_seed(0)
    return model, (torch.randn(1, 3, 32, 32, generator=gen), torch.tensor([10])), {"return_dict": False}


FAMILIES = {
    "resnet50": lambda: _classifier("ResNetConfig", "ResNetForImageClassification"),
    "convnext_tiny": lambda: _classifier("ConvNextConfig", "ConvNextForImageClassification"),
    "efficientnet_b0": lambda: _classifier("EfficientNetConfig", "EfficientNetForImageClassification",
                                           width_coefficient=1.0, depth_coefficient=1.0, image_size=224, hidden_dim=1280),
    "mobilenet_v2": lambda: _classifier("MobileNetV2Config", "MobileNetV2ForImageClassification"),
    "unet2d_condition": unet2d_condition,
    "unet2d": unet2d,
}


def family_names(spec: str) -> list[str]:
    names = list(FAMILIES) if spec == "all" else [n for n in spec.split(",") if n]
    unknown = [n for n in names if n not in FAMILIES]
    if unknown:
        raise SystemExit(f"unknown --families name(s) {unknown}; known: {', '.join(FAMILIES)}")
    return names
