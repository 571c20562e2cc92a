"""The model `pt2b demo` exports: a small transformer encoder and an example input, seeded so that every
run shows the same numbers. The product's own example; the test corpora live in tools/corpus/."""

from __future__ import annotations

import torch


def demo_model() -> tuple[torch.nn.Module, tuple[torch.Tensor, ...]]:
    """(model, args): a 2-layer nn.TransformerEncoder (width 64, 4 heads, feed-forward 128, batch first) in
    eval mode, and one input batch of 2 sequences of 10 tokens."""
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(64, 4, dim_feedforward=128, batch_first=True)
    # nested tensors are an eager fast path for padded batches; torch.export traces the plain path
    model = torch.nn.TransformerEncoder(layer, num_layers=2, enable_nested_tensor=False).eval()
    return model, (torch.randn(2, 10, 64),)
