"""Custom ops whose kernels read a tensor's values (offsets of row segments), as transformers' grouped
matrix product does: one traces (sizes read at run time), one branches on the values and cannot."""

from __future__ import annotations

import torch

NS = "pt2b_segment_test"


def _scaled_segments(x: torch.Tensor, offs: torch.Tensor, skip_empty: bool) -> torch.Tensor:
    """Rows scaled by their segment's number (offs: each segment's end)."""
    out = torch.zeros_like(x)
    start = 0
    for i, end in enumerate(offs.tolist()):
        if skip_empty and start == end:  # a branch on data: no trace can follow it
            continue
        out[start:end] = x[start:end] * (i + 1)
        start = end
    return out


@torch.library.custom_op(f"{NS}::segments", mutates_args=())
def segments(x: torch.Tensor, offs: torch.Tensor) -> torch.Tensor:
    return _scaled_segments(x, offs, skip_empty=False)


@torch.library.custom_op(f"{NS}::branchy", mutates_args=())
def branchy(x: torch.Tensor, offs: torch.Tensor) -> torch.Tensor:
    return _scaled_segments(x, offs, skip_empty=True)


for _op in (segments, branchy):
    _op.register_fake(lambda x, offs: torch.empty_like(x))
