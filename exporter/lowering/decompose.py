"""The table a lowering applies to an ExportedProgram: the table as torch's run_decompositions
would apply it (its entries, plus the ops every retrace decomposes, with global-flag-free kernels),
which the lowering engines (lowering/engines/) hand to functionalization (exporter/functionalize.py)
to apply in its trace."""

from __future__ import annotations

import functools

import torch

from .._torch import compat as torch_compat
from ..errors import LoweringError
from ..functionalize import forced_decompositions, runs_cia_kernel

__all__ = ["applied", "flag_free", "layout_repaired_decompositions", "layout_repaired_ops", "shared_trace_table",
           "trace_table"]


_LAST: list = [None, None]  # [a table, its trace_table]: one lowering request is usually lowered many times


def shared_trace_table(table: dict) -> dict:
    """trace_table(table), the same dict object as for the previous call with an equal table: the
    trace wraps each entry of the table it is given once per table object (functionalize._Watch)."""
    last, full = _LAST
    if last is not None and last == table:
        return full
    full = trace_table(table)
    _LAST[:] = [dict(table), full]
    return full


# ---- the table ----

def _lstm_without_mkldnn(input, hx, params, has_biases, num_layers, dropout, train, bidirectional, batch_first):
    """torch's aten.lstm.input decomposition as run_decompositions applies it (with mkldnn off):
    the layer loop of one_layer_lstm, never mkldnn_rnn_layer, whatever the global flag says (and
    one_layer_lstm repaired where torch's misplaces the batch: exporter/_torch/compat.py)."""
    from .._torch.tracing import decompositions as d

    if len(hx) != 2:
        raise LoweringError(f"aten.lstm.input: expected two hidden states (h0, c0), got {len(hx)}.")
    params = d.gather_params(params, has_biases, hx[0].size(2) != hx[1].size(2))
    hidden = list(zip(hx[0], hx[1]))
    out, finals = d._rnn_helper(input, hidden, params, has_biases, num_layers, dropout, train, bidirectional,
                                batch_first, torch_compat.one_layer_lstm())
    finals = list(zip(*finals))
    return out, torch.stack(finals[0], 0), torch.stack(finals[1], 0)


# Ops torch's retrace keeps whatever its table says (measured: run_decompositions() leaves them in the
# graph with torch's own table and with every registered decomposition; their Python decomposition is
# registered as a CompositeImplicitAutograd kernel beside their real ones). Their decompositions are not
# safe in their place: upsample_nearest2d's indexes past its source when output_size and scales disagree
# (output_size [6, 10], scales 2.3 and 4.7), where the kernel follows output_size.
# tests/test_lowering_local.py checks that torch keeps each one.
KEPT_BY_TORCHS_RETRACE = ("upsample_nearest1d", "upsample_nearest2d", "upsample_nearest3d",
                          "_upsample_nearest_exact1d", "_upsample_nearest_exact2d", "_upsample_nearest_exact3d")


def kept_by_torchs_retrace(op) -> bool:
    """Whether torch's retrace keeps ``op`` whatever its table says (KEPT_BY_TORCHS_RETRACE, the
    .default overloads)."""
    return isinstance(op, torch._ops.OpOverload) and op._overloadname == "default" and \
        op._schema.name == f"aten::{op._overloadpacket.__name__}" and op._overloadpacket.__name__ in KEPT_BY_TORCHS_RETRACE


def trace_table(table: dict) -> dict:
    """The table the pre-dispatch retrace applies for run_decompositions' ``table``, less the ops
    torch's retrace keeps whatever its table says (kept_by_torchs_retrace): the node-local lowering
    applies this table call by call, and keeps what torch keeps."""
    from .._torch.tracing import special_op_to_preserve_cia as _special_op_to_preserve_cia

    full = {op: fn for op, fn in table.items() if fn is not _special_op_to_preserve_cia and not kept_by_torchs_retrace(op)}
    for op, fn in forced_decompositions().items():
        full.setdefault(op, fn)
    out = {op: applied(op, fn) for op, fn in full.items()}
    for op, channels_last in layout_repaired_ops().items():
        out.setdefault(op, _dense_inputs(op, channels_last))
    return out


# ---- layouts the trace would get wrong ----

@functools.cache
def layout_repaired_ops() -> dict:
    """Ops whose CPU kernel and torch's fake (meta) kernel disagree on an input strided otherwise than
    contiguously (or channels-last), op -> whether a channels-last input is left as it is:

    - the batch norms return a contiguous result where the fake kernel keeps the input's layout
      (patchtst: a transposed activation); div with a rounding mode keeps the input's layout where the
      fake kernel returns a contiguous one. The trace decides views and copies by the fake layouts, so
      a view it found valid fails at run time ("view size is not compatible", in torch's own lowering
      too);
    - native_group_norm requires an input contiguous in the memory format its strides suggest, which
      group_norm's own kernel ensures with contiguous(format), decided on the fake strides; where a
      dimension of size 1 has another stride in the real tensor than in the fake one (the batch of
      one of a VAE, after its attention block's residual add), the two suggest different formats,
      the copy is not made, and the kernel refuses its input at run time, in torch's own lowering
      too. It gets a contiguous input whenever it is not one.

    pt2b's lowering gives these ops dense inputs (_dense_inputs), on which both kernels agree.
    tests/test_lowering_layout.py measures each disagreement, and scans the OpInfo samples of the
    core opset for others."""
    a = torch.ops.aten
    return {a._native_batch_norm_legit_no_training.default: True, a._native_batch_norm_legit.default: True,
            a._native_batch_norm_legit.no_stats: True, a.native_batch_norm.default: True,
            a.div.Tensor_mode: True, a.native_group_norm.default: False}


def _dense(t, channels_last: bool) -> bool:
    """Contiguous (or, with ``channels_last``, channels-last in 4 or 5 dimensions), as far as known
    without a guard."""
    from .._torch.symbolic import is_channels_last_contiguous_or_false, is_contiguous_or_false

    return is_contiguous_or_false(t) or (channels_last and t.dim() in (4, 5) and is_channels_last_contiguous_or_false(t))


def _densified(args, channels_last: bool) -> list:
    """``args`` with each tensor that is not dense (_dense) replaced by a contiguous copy."""
    return [a if not isinstance(a, torch.Tensor) or _dense(a, channels_last) else
            torch.ops.aten.clone.default(a, memory_format=torch.contiguous_format) for a in args]


def _dense_inputs(op, channels_last: bool):
    """A table entry for ``op``: its tensor arguments that are not dense (_dense) are copied to
    contiguous ones, and ``op`` is called on them (that call, on dense inputs, declines and goes on)."""
    def repaired(*args, **kwargs):
        if all(_dense(a, channels_last) for a in args if isinstance(a, torch.Tensor)):
            return NotImplemented
        return op(*_densified(args, channels_last), **kwargs)

    return repaired


@functools.cache
def layout_repaired_decompositions() -> dict:
    """Decompositions of torch's table that are exact on contiguous inputs and wrong on others, op ->
    whether a channels-last input is left as it is (pt2b opset audit runs every sample transposed,
    permuted, channels-last, strided and expanded too, and measured these):

    - view_copy decomposes to view(clone): clone keeps a transposed, permuted or expanded layout, on
      which the view is refused ("view size is not compatible"), where the op itself copies first;
    - adaptive_max_pool3d's decomposition refuses a channels-last input ("Unsupported memory format");
    - diagonal_scatter's decomposition writes into a clone of its input through as_strided with
      contiguous strides: with an expanded (stride 0) input the values land elsewhere.

    pt2b applies them to dense inputs (``applied``), on which the audit measures them exact. Not in
    the list: as_strided_copy, whose meaning depends on the input's storage (a copy to a dense input
    changes it): the audit keeps it wrong, and lossless lowering keeps the op."""
    a = torch.ops.aten
    return {a.view_copy.default: False, a.adaptive_max_pool3d.default: False, a.diagonal_scatter.default: False}


def applied(op, fn):
    """What pt2b's lowering applies for the table entry ``op -> fn``: ``fn``, on dense inputs where it
    is wrong on others (layout_repaired_decompositions), without global flags (flag_free), declining
    a call on which it would guard on a data-dependent value (_declining_data_dependent_guards). The
    audit measures this."""
    fn = _declining_data_dependent_guards(flag_free(op, fn))
    channels_last = layout_repaired_decompositions().get(op)
    if channels_last is None:
        return fn

    def on_dense_inputs(*args, **kwargs):
        return fn(*_densified(args, channels_last), **kwargs)

    on_dense_inputs.__wrapped__ = fn
    return on_dense_inputs


def _declining_data_dependent_guards(fn):
    """``fn``, declining (the op stays, as with ``keep``) a call where it asks a question of a value
    the trace only knows at run time: slice's decomposition asks whether an ``item()`` that nothing
    bounds is negative (ExportDB's assume_constant_result, opt's static cache under ``max``), and
    torch's run_decompositions fails there with GuardOnDataDependentSymNode. The op, undecomposed,
    answers it at run time; whether the backend accepts it is checked as for any op that stays.
    torch's stand-in for an op's own C++ kernel (a partial of _special_op_to_decompose_cia) is left
    as it is: the trace recognizes it and lets functionalization run that kernel."""
    from torch.fx.experimental.symbolic_shapes import GuardOnDataDependentSymNode

    if runs_cia_kernel(fn):
        return fn

    def decomposition(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except GuardOnDataDependentSymNode:
            return NotImplemented

    decomposition.__wrapped__ = fn
    return decomposition


def flag_free(op, fn):
    """``fn``, or what pt2b applies in its place: torch's aten.lstm.input decomposition reads the
    global mkldnn flag, which torch's retrace turns off; pt2b calls the path it then takes."""
    if op is torch.ops.aten.lstm.input and fn is _registered(op):
        return _lstm_without_mkldnn
    return fn


def _registered(op):
    from .._torch.tracing import decomposition_table

    return decomposition_table.get(op)
