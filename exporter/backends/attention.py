"""Attention in the forms backends' attention fusions match, with the values torch gives: a rewrite of the
lowered program made by a hand-off (a new program, the artifact's untouched).

A boolean attention mask is the form torch keeps, and the one backends handle worst:
- OpenVINO's ScaledDotProductAttention gives NaN for a row that attends to nothing under a boolean mask
  (openvinotoolkit/openvino#31630), where torch gives zeros: a left-padded batch's rows;
- torchlib translates it through a softmax guarded by IsNaN/Where, which ONNX Runtime's attention fusions
  do not match; an additive mask is what their attention bias (and GroupQueryAttention over a static
  cache) takes.
"""

from __future__ import annotations

import torch

SDPA = torch.ops.aten.scaled_dot_product_attention.default


def sdpa_with_additive_mask(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, *, scale=None,
                             enable_gqa=False):
    """``scaled_dot_product_attention`` with a boolean mask, given it as the additive mask it stands for (0
    where attended, the dtype's lowest value where not) and each row that attends to nothing set to zeros,
    as torch's boolean attention gives them: the same values. Other masks: as they are."""
    if attn_mask is None or attn_mask.dtype != torch.bool or not query.is_floating_point():
        return NotImplemented
    bias = (~attn_mask).to(query.dtype) * torch.finfo(query.dtype).min
    out = SDPA(query, key, value, bias, dropout_p, is_causal, scale=scale, enable_gqa=enable_gqa)
    unattended = attn_mask.to(query.dtype).sum(dim=-1, keepdim=True) < 1
    return torch.where(unattended, torch.zeros((), dtype=out.dtype), out)


def boolean_masks(ep) -> bool:
    """Whether an attention of ``ep`` takes a boolean mask."""
    masks = [n.args[3] if len(n.args) > 3 else n.kwargs.get("attn_mask") for n in ep.graph.nodes if n.target is SDPA]
    return any(isinstance(m, torch.fx.Node) and m.meta["val"].dtype == torch.bool for m in masks)


def additive_masks(ep, table: dict | None = None, base: dict | None = None):
    """``ep`` with each attention under a boolean mask given an additive one (sdpa_with_additive_mask) and
    the rewrites of ``table`` (op -> a function of its arguments) whose ops it calls applied, in the same
    retrace as the decompositions of ``base`` (the hand-off's own table, if it retraces anyway): a new
    program. Where there is nothing to rewrite, or torch cannot retrace it with the rewrites, ``ep``
    decomposed with ``base`` alone (``ep`` itself without one)."""
    called = {n.target for n in ep.graph.nodes}
    rewrites = {op: fn for op, fn in (table or {}).items() if op in called}
    if boolean_masks(ep):
        rewrites[SDPA] = sdpa_with_additive_mask
    if rewrites:
        try:
            return ep.run_decompositions({**(base or {}), **rewrites})
        # the rewrites let a backend's fusions match or route around its defects: a program torch cannot
        # retrace with them is handed over without them, and the hand-off check still compares what the
        # backend makes of it
        except Exception:  # noqa: BLE001
            pass
    return ep.run_decompositions(base) if base is not None else ep
