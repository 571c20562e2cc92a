"""pt2b's own exact rewrites (exporter/lowering/rewrites.py) for ops no torch decomposition reaches:
each equals the op's own kernel, bitwise where the kernel's arithmetic is reproduced, on inputs chosen
to hit its edges, and a mixture-of-experts layer built on them lowers to core ATen ops."""

from __future__ import annotations

import random

import pytest
import torch
from torch import nn

from exporter import export_model, load_for_backend
from exporter.lowering.opset_check import INFRASTRUCTURE
from exporter.lowering.presets import load as load_preset
from exporter.errors import OpsetError
from exporter.lowering.rewrites import (amax_by_max_dim, avg_pool2d_without_ceil, cummax, cummin, empty_permuted,
                                        grouped_mm_fallback, histc, index_copy_by_scatter, masked_scatter, rand_like,
                                        randn_like, sort_by_topk, unfold_by_index)
from exporter.lowering.tables import closure_decompositions

CORE = sorted(load_preset("core").opset)


def _histc_inputs(seed: int):
    rng = random.Random(seed)
    for case in range(240):
        bins = rng.randint(1, 12)
        lo = rng.choice([0, -3, 0.5, -1e-3])
        hi = lo + rng.choice([1, 7, 11, 0.3, 1e3])
        dtype = rng.choice([torch.float32, torch.float64])
        kind = case % 4
        if kind == 0:
            x = torch.randn(rng.randint(0, 50)) * (hi - lo) + lo
        elif kind == 1:  # whole numbers, as expert indices are, some outside the range
            x = torch.randint(int(lo) - 1, int(hi) + 2, (30,)).float()
        elif kind == 2:  # every edge, where truncation decides the bin
            x = torch.linspace(lo, hi, bins + 1)
        else:
            x = torch.cat([torch.randn(9) * hi, torch.tensor([float("nan"), float("inf"), -float("inf"), lo, hi])])
        yield x.to(dtype), bins, lo, hi


def test_histc_counts_as_the_cpu_kernel_does():
    for x, bins, lo, hi in _histc_inputs(0):
        got, want = histc(x, bins, lo, hi), torch.histc(x, bins, lo, hi)
        assert torch.equal(got, want), (x, bins, lo, hi, got, want)
    assert histc(torch.randn(5, 3).double(), 4, -1, 1).shape == (4,)


def test_histc_with_no_range_counts_over_the_datas_extremes_as_the_kernel_does():
    """min == max (0 and 0 where a mixture of experts has one expert): the kernel reads the data's
    smallest and largest values, a range of one value widened by 1 each way."""
    rng = random.Random(1)
    for case in range(200):
        bound = rng.choice([0, 0, 2.5, -1])
        dtype = rng.choice([torch.float32, torch.float64])
        kind = case % 4
        if kind == 0:
            x = torch.randn(rng.randint(1, 40)) * rng.choice([1, 1e3, 1e-3])
        elif kind == 1:  # expert indices, as transformers counts them
            x = torch.randint(0, rng.randint(1, 6), (rng.randint(1, 30),)).float()
        elif kind == 2:  # one value: the widened range
            x = torch.full((rng.randint(1, 9),), rng.choice([0.0, 3.0, -7.5]))
        else:  # empty
            x = torch.empty(0)
        x, bins = x.to(dtype), rng.randint(1, 12)
        got, want = histc(x, bins, bound, bound), torch.histc(x, bins, bound, bound)
        assert torch.equal(got, want), (x, bins, bound, got, want)


def test_histc_declines_an_integer_input():
    assert histc(torch.arange(8), 4, 0, 7) is NotImplemented  # (the CPU kernel takes floats only)


def test_empty_permuted_has_the_sizes_and_strides_of_the_op():
    for size, layout in (([2, 3, 4], [2, 0, 1]), ([5, 1, 3, 2], [0, 2, 3, 1]), ([7], [0])):
        got, want = empty_permuted(size, layout, dtype=torch.float16), torch.empty_permuted(size, layout,
                                                                                             dtype=torch.float16)
        assert (got.shape, got.stride(), got.dtype) == (want.shape, want.stride(), want.dtype)


def test_grouped_mm_fallback_equals_transformers_kernel_for_any_offsets():
    pytest.importorskip("transformers.integrations.moe")
    op = torch.ops.transformers.grouped_mm_fallback.default
    rng = random.Random(1)
    for case in range(200):
        groups, rows = rng.randint(1, 5), rng.randint(0, 12)
        offs = torch.tensor([rng.randint(-rows - 3, rows + 3) for _ in range(groups)])
        if case % 3 == 0:  # as a router makes them: sorted, within the rows
            offs = offs.sort().values.clamp(0, rows)
        x, w = torch.randn(rows, 4), torch.randn(groups, 4, 3)
        torch.testing.assert_close(grouped_mm_fallback(x, w, offs), op(x, w, offs), rtol=1e-6, atol=1e-6)


def test_masked_scatter_equals_the_kernel_for_any_mask_and_broadcast():
    rng = random.Random(2)
    shapes = [((4, 5), (4, 5)), ((4, 5), (5,)), ((2, 1, 3), (1, 4, 1)), ((6,), (1,)), ((0, 3), (0, 3)), ((), ())]
    for case in range(120):
        x_shape, mask_shape = shapes[case % len(shapes)]
        dtype = rng.choice([torch.float32, torch.int64, torch.bool, torch.bfloat16])
        x = torch.randn(x_shape).to(dtype)
        mask = torch.rand(mask_shape) < rng.choice([0.0, 0.3, 0.7, 1.0])
        out_numel = torch.broadcast_shapes(x_shape, mask_shape).numel() if x_shape or mask_shape else 1
        source = torch.randn(out_numel + rng.randint(0, 3)).to(dtype).reshape(-1)
        if case % 2:
            source = source[: int(torch.broadcast_to(mask, torch.broadcast_shapes(x_shape, mask_shape)).sum())]
        got, want = masked_scatter(x, mask, source), torch.masked_scatter(x, mask, source)
        assert got.dtype == want.dtype and torch.equal(got, want), (x_shape, mask_shape, dtype)
    assert masked_scatter(torch.zeros(3), torch.ones(3), torch.ones(3)) is NotImplemented


def test_the_rewrites_apply_only_where_the_list_lacks_the_op():
    table = closure_decompositions()
    assert table[torch.ops.aten.histc.default] is histc
    assert table[torch.ops.aten.empty_permuted.default] is empty_permuted
    assert table[torch.ops.aten.masked_scatter.default] is masked_scatter
    assert table[torch.ops.aten.cummax.default] is cummax and table[torch.ops.aten.cummin.default] is cummin


class Experts(nn.Module):
    """A mixture-of-experts layer as transformers writes one: tokens counted per expert (histc), sorted
    by expert, and multiplied by their expert's weight (grouped_mm_fallback)."""

    def __init__(self, experts: int = 4, width: int = 8, top: int = 2):
        super().__init__()
        self.router = nn.Linear(width, experts)
        self.weight = nn.Parameter(torch.randn(experts, width, width) / width ** 0.5)
        self.experts, self.top = experts, top

    def forward(self, x):
        scores, chosen = self.router(x).softmax(-1).topk(self.top, dim=-1)
        flat = chosen.reshape(-1)
        order = flat.argsort()
        counts = torch.histc(flat.float(), bins=self.experts, min=0, max=self.experts - 1)
        offs = counts.cumsum(0).to(torch.int32)
        rows = x.repeat_interleave(self.top, dim=0)[order]
        out = torch.ops.transformers.grouped_mm_fallback(rows, self.weight, offs)
        back = torch.empty_like(out)
        back[order] = out
        return (back.view(-1, self.top, x.shape[-1]) * scores.unsqueeze(-1)).sum(1)


def test_a_mixture_of_experts_layer_lowers_to_core_aten_and_runs_as_eager(tmp_path):
    pytest.importorskip("transformers.integrations.moe")
    torch.manual_seed(0)
    model = Experts().eval()
    x = torch.randn(6, 8)
    export_model(model, (x,), tmp_path / "moe.pt2b")
    lowered = load_for_backend(tmp_path / "moe.pt2b", supported_ops=CORE, cache=False)
    assert not set(lowered.ops()) - set(CORE) - INFRASTRUCTURE, set(lowered.ops()) - set(CORE)
    assert lowered.validation.status == "passed"
    for _ in range(3):  # other routings than the example's
        x = torch.randn(6, 8)
        torch.testing.assert_close(lowered(x), model(x), rtol=1e-5, atol=1e-5)


def test_a_backend_that_decomposes_with_its_own_table_gets_the_rewrites_it_lacks(tmp_path):
    """OpenVINO takes whatever its own table leaves and has no conversion of histc: pt2b's rewrite of it
    applies; transformers' grouped product, which its extensions convert, stays for it."""
    pytest.importorskip("openvino")
    pytest.importorskip("transformers.integrations.moe")
    from exporter.backends import to_backend

    torch.manual_seed(0)
    model = Experts().eval()
    export_model(model, (torch.randn(6, 8),), tmp_path / "moe.pt2b")
    lowered = load_for_backend(tmp_path / "moe.pt2b", backend="openvino", cache=False)
    assert "aten::histc.default" not in lowered.ops()
    assert lowered.ops().get("transformers::grouped_mm_fallback.default") == 1
    compiled = to_backend(lowered)
    x = torch.randn(6, 8)
    torch.testing.assert_close(compiled(x), model(x), rtol=1e-4, atol=1e-4)


class ImageTokens(nn.Module):
    """Image features scattered into the text embeddings at the image tokens' positions, as transformers'
    vision-language models do (masked_scatter)."""

    def forward(self, embeds, ids, features):
        mask = (ids == 7).unsqueeze(-1).expand_as(embeds)
        return embeds.masked_scatter(mask, features) * 2


def test_masked_scatter_lowers_for_a_list_that_lacks_it_and_runs_as_eager(tmp_path):
    without = [op for op in CORE if op != "aten::masked_scatter.default"]
    ids = torch.tensor([[1, 7, 7, 3, 7], [7, 2, 2, 2, 5]])
    embeds, features = torch.randn(2, 5, 4), torch.randn(4, 4)
    export_model(ImageTokens(), (embeds, ids, features), tmp_path / "m.pt2b")
    lowered = load_for_backend(tmp_path / "m.pt2b", supported_ops=without, cache=False)
    assert "aten::masked_scatter.default" not in lowered.ops()
    assert not set(lowered.ops()) - set(without) - INFRASTRUCTURE
    assert lowered.validation.status == "passed"
    ids2 = torch.tensor([[7, 7, 1, 1, 1], [3, 7, 2, 7, 5]])
    assert torch.equal(lowered(embeds, ids2, features), ImageTokens()(embeds, ids2, features))


def test_amax_by_max_dim_equals_amax_nan_and_every_dim_choice_included():
    rng = random.Random(3)
    for case in range(100):
        shape = [rng.randint(1, 4) for _ in range(rng.randint(1, 4))]
        x = torch.randn(shape)
        if case % 3 == 0:
            x.view(-1)[rng.randrange(x.numel())] = float("nan")
        dims = rng.sample(range(-len(shape), len(shape)), rng.randint(0, len(shape)))
        dims = [d for i, d in enumerate(dims) if d % len(shape) not in {e % len(shape) for e in dims[:i]}]
        keep = rng.random() < 0.5
        got, want = amax_by_max_dim(x, dims, keep), torch.amax(x, dims, keep)
        assert got.shape == want.shape and torch.equal(got.nan_to_num(7.5), want.nan_to_num(7.5)), (shape, dims, keep)
    assert amax_by_max_dim(torch.tensor(3.0)) is NotImplemented


class Router(nn.Module):
    def forward(self, x):
        return x - torch.amax(x, dim=-1, keepdim=True) + torch.amax(x, dim=(0, 2))[None, :, None]


def test_amax_takes_pt2bs_route_where_the_list_has_max_dim_but_not_amax(tmp_path):
    """torch's route for amax ends in prims::amax, which no backend lists: for a list without amax (TVM's)
    that names max.dim, pt2b's route lowers it; a list naming amax keeps it whole."""
    without = [op for op in CORE if op != "aten::amax.default"]
    x = torch.randn(3, 4, 5)
    export_model(Router(), (x,), tmp_path / "m.pt2b")
    lowered = load_for_backend(tmp_path / "m.pt2b", supported_ops=without, cache=False)
    assert "aten::max.dim" in lowered.ops() and not set(lowered.ops()) - set(without) - INFRASTRUCTURE
    assert lowered.validation.status == "passed"
    y = torch.randn(3, 4, 5)
    assert torch.equal(lowered(y), Router()(y))
    assert "aten::amax.default" in load_for_backend(tmp_path / "m.pt2b", supported_ops=CORE, cache=False).ops()
    # without max.dim either, pt2b's route does not apply: torch's ends in prims::amax, refused
    with pytest.raises(OpsetError, match=r"prims::amax.default \(2 call sites\): no decomposition reaches"):
        load_for_backend(tmp_path / "m.pt2b", supported_ops=[o for o in without if o != "aten::max.dim"], cache=False)


def test_sort_by_topk_gives_sorts_values_and_order():
    """The values bitwise and, where no two values tie, the indices too; where they tie (whose order
    neither op specifies) the indices still gather the values."""
    rng = random.Random(2)
    for case in range(120):
        shape = [rng.randint(1, 6) for _ in range(rng.randint(1, 3))]
        dim, descending = rng.randrange(-len(shape), len(shape)), rng.random() < 0.5
        x = torch.randn(shape, dtype=rng.choice([torch.float32, torch.float64]))
        if case % 3 == 1:
            x = x.flatten()
            x[rng.randrange(x.numel())] = float("nan")
            x = x.reshape(shape)
        tied = case % 3 == 2
        if tied:
            x = torch.randint(0, 3, shape).to(x.dtype)
        got, want = sort_by_topk(x, dim, descending), torch.sort(x, dim, descending)
        assert torch.equal(got[0], want[0]) or torch.allclose(got[0], want[0], equal_nan=True), (x, dim)
        if tied:
            assert torch.equal(x.gather(dim, got[1]), want[0])
        else:
            assert torch.equal(got[1], want[1]), (x, dim, descending)
    assert sort_by_topk(torch.tensor(3.0)) is NotImplemented


def test_cummax_and_cummin_equal_the_kernels_ties_nan_infinities_and_empty_dims_included():
    """The same values and indices as the CPU kernels: a tie takes the later index, a NaN carries on with
    the last NaN's index, integer extremes and infinities stay, and a dim of size 0 gives empty results."""
    rng = random.Random(5)
    for case in range(300):
        shape = [rng.randint(0, 5) for _ in range(rng.randint(1, 3))]
        dim = rng.randrange(len(shape)) - (len(shape) if case % 2 else 0)
        dtype = rng.choice([torch.float32, torch.float64, torch.float16, torch.int64, torch.int32, torch.uint8])
        x = torch.randint(0 if dtype == torch.uint8 else -3, 3, shape).to(dtype)  # (few values: many ties)
        if x.numel() and dtype.is_floating_point:
            for value, p in ((float("nan"), 0.15), (float("inf"), 0.1), (-float("inf"), 0.1)):
                x[torch.rand(shape) < p] = value
        elif x.numel():
            x.view(-1)[0], x.view(-1)[-1] = torch.iinfo(dtype).min, torch.iinfo(dtype).max
        for ours, kernel in ((cummax, torch.cummax), (cummin, torch.cummin)):
            (values, indices), want = ours(x, dim), kernel(x, dim)
            assert torch.equal(indices, want.indices), (x, dim, indices, want.indices)
            assert values.dtype == want.values.dtype and torch.allclose(values, want.values, equal_nan=True)
    assert cummax(torch.tensor(2.0), 0) is NotImplemented and cummin(torch.tensor([True]), 0) is NotImplemented


class TextMasks(nn.Module):
    """Running extremes along the text, as Grounding DINO builds its text masks from them."""

    def forward(self, scores, ids):
        highest, at = torch.cummax(scores, dim=1)
        lowest, _ = torch.cummin(ids, dim=-1)
        return highest * 2, at, lowest + 1


def test_cummax_and_cummin_lower_for_a_list_that_lacks_them_and_run_as_eager(tmp_path):
    from torch.export import Dim

    without = [op for op in CORE if op not in ("aten::cummax.default", "aten::cummin.default")]
    scores, ids = torch.randn(2, 6), torch.randint(0, 4, (2, 6))
    text = Dim("text", min=2, max=64)
    export_model(TextMasks(), (scores, ids), tmp_path / "m.pt2b", dynamic_shapes=({1: text}, {1: text}))
    lowered = load_for_backend(tmp_path / "m.pt2b", supported_ops=without, cache=False)
    assert not {"aten::cummax.default", "aten::cummin.default"} & set(lowered.ops())
    assert not set(lowered.ops()) - set(without) - INFRASTRUCTURE
    assert lowered.validation.status == "passed"
    for n in (6, 11, 2):  # other lengths than the example's, with ties
        scores, ids = torch.randint(-2, 2, (2, n)).float(), torch.randint(0, 4, (2, n))
        for got, want in zip(lowered(scores, ids), TextMasks()(scores, ids)):
            assert torch.equal(got, want)


class OneExpertCounts(nn.Module):
    """Rows counted per expert as transformers' mixture-of-experts layers count them, with one expert:
    histc with min == max == 0, where the kernel counts over the data's extremes."""

    def forward(self, x):
        chosen = x.argmax(-1, keepdim=True) * 0
        return torch.histc(chosen.float(), bins=1, min=0, max=0) * 2, torch.histc(x, bins=4, min=-1, max=1)


def test_a_histc_over_the_data_s_extremes_runs_on_onnx(tmp_path, monkeypatch):
    """torchlib translates histc over a range only: where min == max the ONNX hand-off gives it pt2b's
    rewrite, and keeps torchlib's translation for a range."""
    pytest.importorskip("onnxruntime")
    pytest.importorskip("onnxscript")
    from exporter.backends import onnx as onnx_backend
    from exporter.backends import to_backend
    from exporter.errors import BackendHandOffError

    export_model(OneExpertCounts(), (torch.randn(6, 3),), tmp_path / "m.pt2b")
    lowered = load_for_backend(tmp_path / "m.pt2b", backend="onnx", cache=False)
    assert lowered.ops().get("aten::histc.default") == 2  # (onnx's list has histc: the lowering keeps it)
    with monkeypatch.context() as m:
        m.setattr(onnx_backend, "_for_torchlib", lambda ep: ep)
        with pytest.raises(BackendHandOffError, match="min == max"):
            to_backend("onnx", lowered)
    compiled = to_backend("onnx", lowered)
    histcs = [n for n in compiled.program.graph.nodes if n.target is torch.ops.aten.histc.default]
    assert [n.args[2:4] for n in histcs] == [(-1, 1)]  # (the one over a range is torchlib's)
    for _ in range(2):  # (other values than the example's)
        x = torch.randn(6, 3)
        for got, want in zip(compiled(x), OneExpertCounts()(x)):
            assert torch.equal(got, want)


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64, torch.bool])
def test_unfold_by_index_equals_unfold_on_any_layout(dtype):
    """Every window size and step that fits, every dim counted from either end, on contiguous,
    transposed, sliced and expanded inputs: the same values as unfold's view."""
    rng = random.Random(0)
    for _ in range(200):
        shape = [rng.randint(1, 6) for _ in range(rng.randint(1, 4))]
        x = (torch.randn(shape) * 4).to(dtype)
        layout = rng.choice(["contiguous", "transposed", "sliced", "expanded"])
        if layout == "transposed" and x.dim() > 1:
            x = x.transpose(0, -1)
        elif layout == "sliced":
            x = x[..., ::2]
        elif layout == "expanded":
            x = x[:1].expand(3, *x.shape[1:])
        dim = rng.randrange(-x.dim(), x.dim())
        size = rng.randint(0, x.shape[dim])
        step = rng.randint(1, 4)
        assert torch.equal(unfold_by_index(x, dim, size, step), x.unfold(dim, size, step)), (shape, layout, dim, size, step)


class Windows(nn.Module):
    """patchtst's patching: windows along the time dim of a transposed input, and along its last dim."""

    def forward(self, x):
        return x.transpose(1, 2).unfold(-1, 4, 2).sum(-1), x.unfold(1, 3, 3) * 2


def test_unfold_takes_pt2bs_gather_where_the_list_lacks_unfold(tmp_path):
    """torch's route for unfold is an as_strided with the strides of unfold's input, which a backend that
    makes its views dense copies reads wrong (ExecuTorch); for a list without unfold that names
    index_select, pt2b's gather lowers it instead, with a dynamic dim, exact."""
    without = [op for op in CORE if op != "aten::unfold.default"]
    export_model(Windows(), (torch.randn(2, 9, 5),), tmp_path / "w.pt2b",
                 dynamic_shapes=({0: torch.export.Dim("b", max=8)},))
    lowered = load_for_backend(tmp_path / "w.pt2b", supported_ops=without, cache=False)
    assert "aten::index_select.default" in lowered.ops() and "aten::as_strided.default" not in lowered.ops()
    assert lowered.validation.status == "passed"
    for b in (2, 5):
        x = torch.randn(b, 9, 5)
        for got, want in zip(lowered(x), Windows()(x)):
            assert torch.equal(got, want)


@pytest.mark.parametrize("like, draw", [(randn_like, torch.randn_like), (rand_like, torch.rand_like)])
def test_a_like_draw_draws_what_the_op_draws_from_the_same_seed(like, draw):
    """The same generator call fills both: from one seed, the same values, dtype and shape; laid out
    otherwise (channels-last kept by preserve_format), draws of the same distribution."""
    for x, dtype in [(torch.empty(3, 4, 5), None), (torch.empty(2, 7, dtype=torch.float64), torch.float16),
                     (torch.empty(0, 3), None), (torch.empty(4, 6).t(), None)]:
        kwargs = {"dtype": dtype} if dtype is not None else {}
        if not x.is_contiguous():
            kwargs["memory_format"] = torch.contiguous_format
        torch.manual_seed(7)
        want = draw(x, **kwargs)
        torch.manual_seed(7)
        got = like(x, **kwargs)
        assert got.dtype == want.dtype and torch.equal(got, want)
    cl = torch.empty(4, 32, 16, 16).to(memory_format=torch.channels_last)
    torch.manual_seed(7)
    got = like(cl)
    mean, std = (0.0, 1.0) if draw is torch.randn_like else (0.5, 12 ** -0.5)
    assert got.shape == cl.shape and abs(got.mean() - mean) < 0.01 and abs(got.std() - std) < 0.01


class Sampled(nn.Module):
    """vibevoice's latent sampling: mean + std * randn_like(mean)."""

    def forward(self, x):
        mean = x * 2
        return mean + 0.5 * torch.randn_like(mean), x.sum(-1)


def test_randn_like_lowers_to_randn_for_a_list_that_lacks_it(tmp_path):
    without = [op for op in CORE if op not in ("aten::randn_like.default", "aten::normal_functional.default")]
    export_model(Sampled(), (torch.randn(2, 8),), tmp_path / "s.pt2b",
                 dynamic_shapes=({0: torch.export.Dim("b", max=8)},))
    lowered = load_for_backend(tmp_path / "s.pt2b", supported_ops=without, cache=False)
    assert "aten::randn.default" in lowered.ops() and "aten::randn_like.default" not in lowered.ops()
    for b in (2, 5):
        x = torch.randn(b, 8)
        torch.manual_seed(3)
        got = lowered(x)
        torch.manual_seed(3)
        want = Sampled()(x)
        assert all(torch.equal(g, w) for g, w in zip(got, want))


def test_index_copy_by_scatter_equals_index_copy_along_any_dim():
    """Distinct indices in any order, along every dim counted from either end, a single slice and none:
    the same values as the op (a static KV cache's write at its positions)."""
    rng = random.Random(0)
    for _ in range(200):
        shape = [rng.randint(1, 5) for _ in range(rng.randint(1, 4))]
        x = torch.randn(shape)
        dim = rng.randrange(-x.dim(), x.dim())
        picked = rng.sample(range(x.shape[dim]), rng.randint(0, x.shape[dim]))
        source = torch.randn([len(picked) if d == dim % x.dim() else s for d, s in enumerate(shape)])
        index = torch.tensor(picked, dtype=torch.int64)
        assert torch.equal(index_copy_by_scatter(x, dim, index, source), x.index_copy(dim, index, source))


def test_an_average_pool_in_ceil_mode_equals_the_kernel_without_it():
    """Every window count, padding, stride and divisor rule: the same sizes and values as torch's pool in
    ceil mode (windows wider than the input included); a call without ceil mode is declined."""
    import itertools

    torch.manual_seed(0)
    checked = 0
    for h, w, k, s, p, counting, lead in itertools.product((5, 7, 8), (6, 7), (2, 3, 8), (1, 2, 3), (0, 1),
                                                           (True, False), ((2, 3), (3,))):
        if p > k // 2:
            continue
        x = torch.randn(*lead, h, w)
        try:
            want = torch.nn.functional.avg_pool2d(x, k, s, p, ceil_mode=True, count_include_pad=counting)
        except RuntimeError:  # (the kernel refuses sizes that leave no window: "Output size is too small")
            continue
        got = avg_pool2d_without_ceil(x, [k, k], [s, s], [p, p], True, counting)
        assert got.shape == want.shape
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
        checked += 1
    assert checked == 376
    x = torch.randn(1, 2, 7, 7)
    torch.testing.assert_close(avg_pool2d_without_ceil(x, [3, 3], [2, 2], [1, 1], True, True, 4),
                               torch.nn.functional.avg_pool2d(x, 3, 2, 1, ceil_mode=True, divisor_override=4))
    assert avg_pool2d_without_ceil(x, [2, 2], [2, 2], [0, 0], False) is NotImplemented
