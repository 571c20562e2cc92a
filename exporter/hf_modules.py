"""The torch module export_hf (exporter/hf.py) captures for an encoder-decoder: ``Seq2Seq``, whose
``encode`` and ``decode`` are the two methods of one artifact over one copy of the weights."""

from __future__ import annotations

import torch

__all__ = ["Seq2Seq"]


class Seq2Seq(torch.nn.Module):
    """An encoder-decoder LM with two entry points: ``encode`` and ``decode`` (no KV cache: each step
    reads the whole decoder prefix, so decode's length is dynamic)."""

    def __init__(self, model: torch.nn.Module):
        super().__init__()
        self.model = model

    def encode(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.model.get_encoder()(input_ids=input_ids).last_hidden_state

    def decode(self, decoder_input_ids: torch.Tensor, encoder_hidden_states: torch.Tensor) -> torch.Tensor:
        """The logits of the next token after ``decoder_input_ids`` ([batch, vocab])."""
        out = self.model(encoder_outputs=(encoder_hidden_states,), decoder_input_ids=decoder_input_ids,
                         use_cache=False)
        return out.logits[:, -1]
