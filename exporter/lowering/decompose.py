"""Apply a decomposition table to an ExportedProgram: the table as torch's run_decompositions
would apply it (its entries, plus the ops every retrace decomposes, with global-flag-free kernels),
handed to functionalization (exporter/functionalize.py), which applies it in its trace."""

from __future__ import annotations

import torch

from .. import torch_compat
from ..errors import LoweringError
from ..functionalize import _forced, functionalize

__all__ = ["flag_free", "run_decompositions", "trace_table"]


def run_decompositions(ep, table: dict):
    """``ep`` with exactly ``table`` applied (ops not in it stay) and functionalized, as a new
    ATen-dialect ExportedProgram; the op set equals torch's ``ep.run_decompositions(table)``."""
    return functionalize(ep, trace_table(table))


# ---- the table ----

def _lstm_without_mkldnn(input, hx, params, has_biases, num_layers, dropout, train, bidirectional, batch_first):
    """torch's aten.lstm.input decomposition as run_decompositions applies it (with mkldnn off):
    the layer loop of one_layer_lstm, never mkldnn_rnn_layer, whatever the global flag says (and
    one_layer_lstm repaired where torch's misplaces the batch: exporter/torch_compat.py)."""
    from torch._decomp import decompositions as d

    if len(hx) != 2:
        raise LoweringError(f"aten.lstm.input: expected two hidden states (h0, c0), got {len(hx)}.")
    params = d.gather_params(params, has_biases, hx[0].size(2) != hx[1].size(2))
    hidden = list(zip(hx[0], hx[1]))
    out, finals = d._rnn_helper(input, hidden, params, has_biases, num_layers, dropout, train, bidirectional,
                                batch_first, torch_compat.one_layer_lstm())
    finals = list(zip(*finals))
    return out, torch.stack(finals[0], 0), torch.stack(finals[1], 0)


def trace_table(table: dict) -> dict:
    """The table the pre-dispatch retrace applies for run_decompositions' ``table``."""
    from torch._export.utils import _special_op_to_preserve_cia

    full = {op: fn for op, fn in table.items() if fn is not _special_op_to_preserve_cia}
    for op, fn in _forced().items():
        full.setdefault(op, fn)
    return {op: flag_free(op, fn) for op, fn in full.items()}


def flag_free(op, fn):
    """``fn``, or what pt2b applies in its place: torch's aten.lstm.input decomposition reads the
    global mkldnn flag, which torch's retrace turns off; pt2b calls the path it then takes."""
    if op is torch.ops.aten.lstm.input and fn is _registered(op):
        return _lstm_without_mkldnn
    return fn


def _registered(op):
    from torch._decomp import decomposition_table

    return decomposition_table.get(op)
