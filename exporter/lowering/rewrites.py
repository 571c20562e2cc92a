"""pt2b's own decompositions, exact rewrites into ATen ops for backends whose list does not name the
op: ops torch registers no decomposition for, and library ops whose kernels no trace can follow."""

from __future__ import annotations

import torch

from ..ops import resolve_op


def grouped_mm_fallback(input: torch.Tensor, weight: torch.Tensor, offs: torch.Tensor) -> torch.Tensor:
    """transformers::grouped_mm_fallback without its loop over ``offs.tolist()``: its kernel writes rows
    ``[start, end)`` of a zero output with ``input[rows] @ weight[i]`` for each group ``i`` in turn
    (``start`` the previous group's end, bounds read as Python slices read them: a negative one counts
    from the end, both clamped to the rows), so each row holds the product with the last group whose
    slice covers it, or zeros. The same here, computed for every group at once: every row's product
    with every group's weight (groups x rows x outputs), the last covering group's picked."""
    rows_n = input.shape[0]
    rows = torch.arange(rows_n, device=input.device)
    ends = offs.to(torch.int64)
    starts = torch.cat([ends.new_zeros(1), ends[:-1]])

    def bound(v):  # a slice bound as Python reads it
        return torch.clamp(torch.where(v < 0, v + rows_n, v), 0, rows_n)

    covers = (rows[None, :] >= bound(starts)[:, None]) & (rows[None, :] < bound(ends)[:, None])  # groups x rows
    groups = torch.arange(weight.shape[0], device=input.device)
    last = torch.where(covers, groups[:, None], -1).amax(0)  # the last group writing each row, or -1
    every = torch.matmul(input.unsqueeze(0), weight)
    # each row's product with its group, by a gather along the groups (an index by two index tensors
    # picks the same, and IREE cannot compile it over a dynamic number of rows)
    at = last.clamp(min=0)[None, :, None].expand(1, -1, every.shape[-1])
    picked = every.gather(0, at).squeeze(0)
    return torch.where((last >= 0)[:, None], picked, picked.new_zeros(()))


def histc(x: torch.Tensor, bins: int = 100, min=0, max=0) -> torch.Tensor:
    """aten::histc as its CPU kernel counts: an element in ``[min, max]`` (NaN in none; both bounds in the
    input's dtype) goes to bin ``(x - min) * bins / (max - min)`` computed in the input's dtype in that
    order and truncated, the top bound in the last bin (the kernel interpolates linearly, with no search
    of the edges). ``min == max`` makes the kernel read the data's extremes instead, a range of one value
    widened by 1 each way (a mixture of experts of one expert counts with ``min=0, max=0``); where the
    data holds NaN or an infinity the kernel raises and the counts here are meaningless. An integer
    input (which the CPU kernel refuses): NotImplemented."""
    if not x.is_floating_point():
        return NotImplemented
    flat = x.reshape(-1, 1)
    if min == max:  # (an empty input reads +inf and -inf here, and counts nothing either way)
        # (reduced over dim 0 of the flat data, not over no dims: torchlib translates amin only with a dim)
        lo = torch.cat([x.reshape(-1), x.new_full((1,), float("inf"))]).amin(0)
        hi = torch.cat([x.reshape(-1), x.new_full((1,), -float("inf"))]).amax(0)
        same = lo == hi
        lo, hi = torch.where(same, lo - 1, lo), torch.where(same, hi + 1, hi)
    else:
        lo, hi = (torch.scalar_tensor(v, dtype=x.dtype, device=x.device) for v in (min, max))
    inside = (flat >= lo) & (flat <= hi)
    at = torch.clamp(((flat - lo) * bins / (hi - lo)).to(torch.int64), 0, bins - 1)
    hits = (at == torch.arange(bins, device=x.device)) & inside
    return hits.sum(0).to(x.dtype)


def empty_permuted(size, physical_layout, *, dtype=None, layout=None, device=None, pin_memory=None):
    """aten::empty_permuted: uninitialized memory laid out in ``physical_layout`` order, as the view of an
    empty tensor of the permuted size that puts the dims back (the same sizes and strides)."""
    physical = [size[d] for d in physical_layout]
    back = [physical_layout.index(d) for d in range(len(physical_layout))]
    return torch.empty(physical, dtype=dtype, layout=layout, device=device, pin_memory=pin_memory).permute(back)


def masked_scatter(x: torch.Tensor, mask: torch.Tensor, source: torch.Tensor) -> torch.Tensor:
    """aten::masked_scatter: ``x`` and ``mask`` broadcast together, each position the mask selects takes
    the next element of ``source`` in row-major order, the others keep ``x``'s. The same here as a
    gather: a selected position's rank among the selected (a cumulative sum) indexes the flattened
    source, and a where keeps the rest. Where the source holds fewer elements than the mask selects the
    kernel raises and the gather reads out of range; every valid call gives the kernel's values. A
    non-bool mask (which the kernel refuses): NotImplemented."""
    if mask.dtype != torch.bool:
        return NotImplemented
    xb, mb = torch.broadcast_tensors(x, mask)
    selected = mb.reshape(-1)
    rank = torch.cumsum(selected.to(torch.int64), 0) - 1
    # one element more, so that an empty source under a mask selecting nothing still has an index 0
    flat = torch.cat([source.reshape(-1), source.new_zeros(1)])
    return torch.where(selected, flat[rank.clamp(min=0)], xb.reshape(-1)).reshape(xb.shape)


def sort_by_topk(x: torch.Tensor, dim: int = -1, descending: bool = False) -> tuple:
    """aten::sort as a topk of every element along ``dim``, sorted, the largest first where
    ``descending`` (NaN counts as the largest in both, as in sort): the same values in the same order.
    Where values tie, which of their indices comes first is unspecified for both ops (sort without
    ``stable=True``) and may differ. A 0-d input: NotImplemented."""
    if x.dim() == 0:
        return NotImplemented
    return torch.ops.aten.topk.default(x, x.shape[dim], dim, descending, True)


def _cumulative_extreme(x: torch.Tensor, dim: int, largest: bool) -> tuple:
    """aten::cummax (``largest``) or aten::cummin as their CPU kernels give them, without a loop: each
    position's value is the extreme of the elements up to it along ``dim``, its index the last of those
    elements holding that value (a tie takes the later index, as the kernels' ``>=`` / ``<=`` do), and
    once a NaN is seen the value is NaN and the index the last NaN's. Computed over every (position,
    earlier element) pair: an ``n x n`` mask along ``dim``, so n times the input's memory. A 0-d, bool or
    complex input: NotImplemented."""
    if x.dim() == 0 or x.dtype == torch.bool or x.is_complex():
        return NotImplemented
    xt = x.movedim(dim, -1)
    n = xt.shape[-1]
    if x.is_floating_point():
        outside = float("-inf") if largest else float("inf")
    else:
        info = torch.iinfo(x.dtype)
        outside = info.min if largest else info.max
    # one column more, outside every position's elements, so that a reduction over an empty ``dim``
    # reduces something (with no branch on a size that may be symbolic)
    at = torch.arange(n + 1, device=x.device)
    upto = (at[None, :] <= at[:n, None]) & (at[None, :] < n)  # position i (rows) x element j (columns): j <= i
    padded = torch.cat([xt, xt.new_full((*xt.shape[:-1], 1), outside)], -1)
    pairs = padded.unsqueeze(-2).expand(*xt.shape[:-1], n, n + 1)
    masked = torch.where(upto, pairs, torch.scalar_tensor(outside, dtype=x.dtype, device=x.device))
    values = masked.amax(-1) if largest else masked.amin(-1)  # (amax and amin propagate NaN, as the kernels do)
    value = values.unsqueeze(-1)
    holds = pairs == value
    if x.is_floating_point():
        holds = holds | (torch.isnan(pairs) & torch.isnan(value))
    indices = torch.where(upto & holds, at, -1).amax(-1)
    return values.movedim(-1, dim), indices.movedim(-1, dim)


def cummax(x: torch.Tensor, dim: int) -> tuple:
    """aten::cummax: see _cumulative_extreme."""
    return _cumulative_extreme(x, dim, largest=True)


def cummin(x: torch.Tensor, dim: int) -> tuple:
    """aten::cummin: see _cumulative_extreme."""
    return _cumulative_extreme(x, dim, largest=False)


def _drawn_like(draw, x: torch.Tensor, dtype, layout, device, pin_memory, memory_format):
    """A ``*_like`` draw as the draw of ``x``'s size: the kernel of ``randn_like`` fills an empty tensor
    like ``x`` by the same generator call that fills ``randn``'s, so from one seed the same values. Where
    the op's result is laid out otherwise (``preserve_format`` of a transposed input), its kernel fills
    it by another path and the values differ: draws of the same distribution, which is all the op
    promises. Another layout than strided: NotImplemented."""
    if layout not in (None, torch.strided) or pin_memory:
        return NotImplemented
    return draw(x.shape, dtype=dtype or x.dtype, device=device or x.device)


def randn_like(x, *, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
    """aten::randn_like as aten::randn of its input's size: see _drawn_like."""
    return _drawn_like(torch.randn, x, dtype, layout, device, pin_memory, memory_format)


def rand_like(x, *, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
    """aten::rand_like as aten::rand of its input's size: see _drawn_like."""
    return _drawn_like(torch.rand, x, dtype, layout, device, pin_memory, memory_format)


def index_copy_by_scatter(x: torch.Tensor, dim: int, index: torch.Tensor, source: torch.Tensor) -> torch.Tensor:
    """aten::index_copy as a scatter along ``dim``: slice ``i`` of ``source`` goes to slice ``index[i]`` of
    ``x``, the index broadcast over the other dims. The same values (where ``index`` repeats a slice,
    which source's copy lands is unspecified for both). A 0-d input: NotImplemented."""
    if x.dim() == 0:
        return NotImplemented
    dim = dim % x.dim()
    # (the op's own contract, which its kernel checks: said so, a count of positions read from data
    # and the source's size are one, rather than a question the trace cannot answer)
    torch._check(index.numel() == source.shape[dim])
    shape = [1] * source.dim()
    shape[dim] = -1
    return x.scatter(dim, index.reshape(shape).expand_as(source), source)


def _pair(v, default=None) -> tuple:
    v = default if (v is None or (isinstance(v, (list, tuple)) and not v)) else v
    return tuple(v) * (2 // len(v)) if isinstance(v, (list, tuple)) else (v, v)


def avg_pool2d_without_ceil(x, kernel_size, stride=(), padding=0, ceil_mode=False, count_include_pad=True,
                            divisor_override=None):
    """aten::avg_pool2d with ``ceil_mode`` as one without it: the input padded with zeros by ``padding`` and
    by as much more at the end as ceil mode's last windows reach past it, its window sums (a pool of
    the padded input times the window's size) divided by how many positions each window counts (the
    same pool of ones over the region torch counts: inside the padding with ``count_include_pad``,
    inside the input without). A window wider than the padded input is cut to it: its positions past
    it hold zeros and count nothing. Other calls, and spatial sizes that are symbols: NotImplemented."""
    height, width = x.shape[-2:]
    if not ceil_mode or not (isinstance(height, int) and isinstance(width, int)):
        return NotImplemented
    (kh, kw), (ph, pw) = _pair(kernel_size), _pair(padding)
    sh, sw = _pair(stride, (kh, kw))

    def windows(size, k, s, p):  # torch's ceil-mode count: the last window starts inside input or left padding
        n = -(-(size + 2 * p - k) // s) + 1
        return n - 1 if (n - 1) * s >= size + p else n

    oh, ow = windows(height, kh, sh, ph), windows(width, kw, sw, pw)
    kh, kw = min(kh, height + 2 * ph), min(kw, width + 2 * pw)
    eh, ew = max((oh - 1) * sh + kh - height - 2 * ph, 0), max((ow - 1) * sw + kw - width - 2 * pw, 0)

    def summed(t):
        return torch.ops.aten.avg_pool2d.default(t, [kh, kw], [sh, sw], [0, 0], False, True) * (kh * kw)

    sums = summed(torch.ops.aten.constant_pad_nd.default(x, [pw, pw + ew, ph, ph + eh], 0.0))
    if divisor_override:
        return sums / divisor_override
    lead = (1,) * (x.dim() - 2)
    if count_include_pad:
        region = torch.ones((*lead, height + 2 * ph, width + 2 * pw), dtype=x.dtype, device=x.device)
        region = torch.ops.aten.constant_pad_nd.default(region, [0, ew, 0, eh], 0.0)
    else:
        region = torch.ones((*lead, height, width), dtype=x.dtype, device=x.device)
        region = torch.ops.aten.constant_pad_nd.default(region, [pw, pw + ew, ph, ph + eh], 0.0)
    return sums / summed(region)


# op name -> pt2b's decomposition; a library's op applies only where the library is loaded
WRITTEN = {
    "aten::randn_like.default": randn_like,
    "aten::rand_like.default": rand_like,
    "aten::sort.default": sort_by_topk,
    "aten::histc.default": histc,
    "aten::empty_permuted.default": empty_permuted,
    "aten::masked_scatter.default": masked_scatter,
    "aten::cummax.default": cummax,
    "aten::cummin.default": cummin,
    "transformers::grouped_mm_fallback.default": grouped_mm_fallback,
}


def amax_by_max_dim(x: torch.Tensor, dim=(), keepdim: bool = False) -> torch.Tensor:
    """aten::amax as one aten::max.dim per reduced dim, the largest dim first (so the dims left keep their
    indices): the same values, NaN propagated as amax does. A 0-d input: NotImplemented."""
    if x.dim() == 0:
        return NotImplemented
    dims = sorted({d % x.dim() for d in dim} if len(dim) else range(x.dim()), reverse=True)
    for d in dims:
        x = torch.ops.aten.max.dim(x, d, keepdim)[0]
    return x


def unfold_by_index(x: torch.Tensor, dimension: int, size: int, step: int) -> torch.Tensor:
    """aten::unfold as a gather of its windows: the elements of window ``w`` are those at ``w * step +
    [0, size)`` along ``dimension``, picked by one index_select, viewed as (windows, size) there and the
    size moved last. The same values as unfold's view. A 0-d input: NotImplemented."""
    if x.dim() == 0:
        return NotImplemented
    dim = dimension % x.dim()
    windows = (x.shape[dim] - size) // step + 1
    at = (torch.arange(windows, device=x.device)[:, None] * step
          + torch.arange(size, device=x.device)[None, :]).reshape(-1)
    picked = x.index_select(dim, at)
    return picked.view(*x.shape[:dim], windows, size, *x.shape[dim + 1:]).movedim(dim + 1, -1)


# op name -> (pt2b's route, the ops it ends in): preferred to torch's own decomposition where a backend's
# list lacks the op and takes every op the route ends in. torch's route for amax ends in prims that no
# backend lists (prims::amax), so without it the op is refused where the backend could run it. torch's
# route for unfold is an as_strided with the strides of unfold's input: right where the backend keeps
# every view's strides, wrong where it makes its views dense copies (ExecuTorch's permute_copy, then
# as_strided over the copy: 3.04 off); the gather means the same on any backend.
PREFERRED = {
    "aten::amax.default": (amax_by_max_dim, ("aten::max.dim",)),
    "aten::unfold.default": (unfold_by_index, ("aten::index_select.default",)),
}


def preferred_routes(accepted) -> dict:
    """The ops of PREFERRED that ``accepted`` (op -> whether the backend takes it as it is) refuses while
    taking every op their route ends in -> pt2b's route for them."""
    out = {}
    for name, (fn, needs) in PREFERRED.items():
        op = resolve_op(name)
        ends = [resolve_op(n) for n in needs]
        if op is not None and not accepted(op) and all(e is not None and accepted(e) for e in ends):
            out[op] = fn
    return out


def written_decompositions() -> dict:
    """The ops of WRITTEN this process has registered -> their decompositions (resolved on each call:
    a library's ops register when it is imported)."""
    out = {}
    for name, fn in WRITTEN.items():
        op = resolve_op(name)
        if op is not None:
            out[op] = fn
    return out
