"""Variants of a real-model case: the workloads people bring beside fp32 with plain weights.
A case name carries its variant after ``@`` (``llama@bf16``, ``bert/masked-lm@pt2e``); make_case in
transformers_zoo.py builds the base case, then ``apply`` turns it into the variant:

- ``bf16`` / ``fp16``: the model and its floating-point inputs in bfloat16 / float16, compared with
  eager in the same dtype at that dtype's tolerance (the validation's bound for it);
- ``int8wo`` / ``fp8wo``: torchao's ``quantize_(model, Int8WeightOnlyConfig())`` /
  ``Float8WeightOnlyConfig()``: tensor-subclass weights, which the capture unwraps into int8 / float8
  data and scales (exporter/capture.py); (float8 activations need a CUDA GPU of compute capability
  8.9, not this corpus's CPU);
- ``pt2e``: PT2E static quantization with torchao's X86InductorQuantizer, calibrated on the case's
  inputs: the converted GraphModule is the model, with quantize/dequantize ops and int8 weights, the
  fp32 originals left unread (not stored).

The eager reference is always the variant itself (the bf16 model, the quantized model): what the user
runs. A variant the model cannot run eagerly (an op without a bfloat16 CPU kernel) is CaseUnavailable."""

from __future__ import annotations

import copy
import dataclasses

import torch

from exporter._torch.pytree import pytree
from exporter.capture import subclass_weights
from exporter.lowering.verdicts import WRONG_REL

VARIANTS = ("bf16", "fp16", "int8wo", "fp8wo", "pt2e")
_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def split(name: str) -> tuple[str, str | None]:
    """("llama/causal-lm", "bf16") for "llama/causal-lm@bf16"; (name, None) without a variant."""
    base, at, variant = name.partition("@")
    return base, (variant if at else None)


def dtype_of(variant: str | None) -> torch.dtype | None:
    """The floating-point dtype a variant builds its model in (bf16, fp16), else None."""
    return _DTYPES.get(variant)


def _cast_floats(value, dtype):
    return pytree.tree_map(lambda v: v.to(dtype) if isinstance(v, torch.Tensor) and v.is_floating_point() else v,
                           value)


def _runs(model, args, kwargs) -> str | None:
    try:
        with torch.no_grad():
            model(*copy.deepcopy(args), **copy.deepcopy(kwargs or {}))
        return None
    except Exception as e:  # noqa: BLE001 -- the variant's own eager failure is the reason it is unavailable
        return f"{type(e).__name__}: {str(e)[:200]}"


def apply(case, variant: str, unavailable):
    """The ``variant`` of RealCase ``case`` (named ``<case.name>@<variant>``); ``unavailable(msg)`` is the
    exception to raise when it cannot be built (transformers_zoo.CaseUnavailable)."""
    if variant not in VARIANTS:
        raise ValueError(f"unknown variant {variant!r}; known: {', '.join(VARIANTS)}")
    out = dataclasses.replace(case, name=f"{case.name}@{variant}")
    if variant in _DTYPES:
        dtype = _DTYPES[variant]
        out.model = case.model.to(dtype)
        out.args, out.kwargs = _cast_floats(case.args, dtype), _cast_floats(case.kwargs, dtype)
        # compared with eager in its own dtype: the bound the validation uses for it
        out.rtol = out.atol = WRONG_REL[dtype]
    elif variant in ("int8wo", "fp8wo"):
        try:
            from torchao.quantization import Float8WeightOnlyConfig, Int8WeightOnlyConfig, quantize_
        except ImportError as e:
            raise unavailable(f"torchao is not installed ({e}); pip install 'pt2b[corpus]'") from None
        try:
            quantize_(out.model, Int8WeightOnlyConfig() if variant == "int8wo" else Float8WeightOnlyConfig())
        except Exception as e:  # noqa: BLE001 -- torchao's own refusal of this model
            raise unavailable(f"torchao cannot quantize this model: {type(e).__name__}: {str(e)[:200]}") from None
        if not subclass_weights(out.model):
            raise unavailable("torchao quantized no layer of this model (no nn.Linear it takes)")
        out.rtol = out.atol = 1e-3  # the same int8 arithmetic, rounded in another order once decomposed
    else:
        out.model = _pt2e(case, unavailable)
        out.strict, out.rtol, out.atol = False, 1e-3, 1e-3
    why = _runs(out.model, out.args, out.kwargs)
    if why is not None:
        raise unavailable(f"the {variant} variant does not run eagerly: {why}")
    out.notes = (out.notes + "; " if out.notes else "") + f"variant {variant}"
    return out


def _pt2e(case, unavailable):
    """The converted GraphModule of PT2E static quantization (X86InductorQuantizer), calibrated once on
    the case's inputs."""
    try:
        from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e
        from torchao.quantization.pt2e.quantizer import x86_inductor_quantizer as xiq
    except ImportError as e:
        raise unavailable(f"torchao is not installed ({e}); pip install 'pt2b[corpus]'") from None
    try:  # static shapes: the quantizer annotates the fp32 graph; the corpus captures the result its own way
        ep = torch.export.export(case.model, copy.deepcopy(case.args), copy.deepcopy(case.kwargs or {}),
                                 strict=case.strict)
    except Exception as e:  # noqa: BLE001
        raise unavailable(f"torch.export cannot capture the fp32 model to quantize: {type(e).__name__}: "
                          f"{str(e)[:200]}") from None
    quantizer = xiq.X86InductorQuantizer().set_global(xiq.get_default_x86_inductor_quantization_config())
    try:
        model = prepare_pt2e(ep.module(), quantizer)
        with torch.no_grad():
            model(*copy.deepcopy(case.args), **copy.deepcopy(case.kwargs or {}))  # calibration
        return convert_pt2e(model)
    except Exception as e:  # noqa: BLE001
        raise unavailable(f"PT2E quantization fails on this model: {type(e).__name__}: {str(e)[:200]}") from None
