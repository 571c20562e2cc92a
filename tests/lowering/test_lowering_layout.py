"""Views on the layout the program was exported with (exporter/functionalize.py: _tolerant_view).

gpt2's attention output is `attn.transpose(1, 2).reshape(...).contiguous()` and then `.view(-1, n)`:
on the fused attention kernel's layout the contiguous() is a no-op, so torch.export records no copy,
and the view is valid. scaled_dot_product_attention's math decomposition lays its result out
otherwise, and the view then fails inside torch's own run_decompositions (and failed in pt2b's
lowering, for gpt2, gpt-sw3 and glm5_next). pt2b views a contiguous copy there instead, when nothing
writes through the view; a view that is written through still fails, as in torch."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import exporter
from exporter.errors import LoweringError
from exporter.lowering.decompose import layout_repaired_ops as decompose_layout_ops
from tests.support.helpers import assert_close_to_eager
from runtime_ref import Runtime


class Attention(torch.nn.Module):
    """gpt2's attention block in miniature, with an additive mask (so the CPU math path is taken)."""

    def __init__(self, write_through_view=False):
        super().__init__()
        self.qkv = torch.nn.Linear(64, 192)
        self.proj = torch.nn.Linear(64, 64)
        self.write_through_view = write_through_view

    def forward(self, x, mask):
        b, n, _ = x.shape
        q, k, v = (t.view(b, n, 4, 16).transpose(1, 2) for t in self.qkv(x).split(64, dim=2))
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        out = out.transpose(1, 2).reshape(b, n, -1).contiguous()
        flat = out.view(-1, 64)
        if self.write_through_view:
            flat.mul_(2)
            return self.proj(out)
        return self.proj(flat).view(b, n, 64)


_N = torch.export.Dim("n", min=2, max=64)
DYNAMIC = ({1: _N}, {2: _N, 3: _N})


def _inputs(n=6):
    torch.manual_seed(1)
    return torch.randn(2, n, 64), torch.randn(2, 1, n, n)


def _model(**kw):
    torch.manual_seed(0)
    return Attention(**kw).eval()


@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
def test_torch_run_decompositions_fails_on_it(dynamic):
    ep = torch.export.export(_model(), _inputs(), dynamic_shapes=DYNAMIC if dynamic else None)
    with pytest.raises(Exception, match="Cannot view a tensor with shape"):
        ep.run_decompositions()


@pytest.mark.parametrize("preset", ["core", "max"])
@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
def test_pt2b_lowers_it_and_it_runs_close_to_eager(tmp_path, preset, dynamic):
    path = tmp_path / "m.pt2b"
    exporter.export_model(_model(), _inputs(), path, dynamic_shapes=DYNAMIC if dynamic else None)
    lowered = exporter.load_for_backend(path, preset, cache=False)
    assert lowered.validation.status == "passed"
    copies = {torch.ops.aten.clone.default, torch.ops.prims.clone.default}
    assert any(n.target in copies for n in lowered.exported_program().graph.nodes), \
        "the view's input is copied to a contiguous layout"
    rt = Runtime(lowered)
    for n in ([6, 3, 11] if dynamic else [6]):
        args = _inputs(n)
        assert_close_to_eager(rt(*args), _model()(*args), rtol=1e-5, atol=1e-5)


def test_a_view_written_through_is_not_copied(tmp_path):
    """A copy would not alias: the write would not reach `out`. pt2b fails there, as torch does."""
    path = tmp_path / "m.pt2b"
    exporter.export_model(_model(write_through_view=True), _inputs(), path)
    with pytest.raises(LoweringError, match="Cannot view a tensor with shape"):
        exporter.load_for_backend(path, "core", cache=False)


# ---- ops whose kernel and fake kernel lay results out differently (decompose.layout_repaired_ops) ----

class BatchNormOnTransposed(torch.nn.Module):
    """patchtst's pattern: batch norm over the channel dim of a transposed activation, transposed
    back, then flattened. The CPU kernel returns a contiguous result, torch's fake kernel one in the
    input's layout, so the trace turns the reshape into a view that fails at run time."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(32, 64)
        self.norm = torch.nn.BatchNorm1d(64)

    def forward(self, x):
        h = self.norm(self.lin(x).transpose(1, 2)).transpose(1, 2)
        return h.reshape(-1, 64) * 2


def _bn_model():
    torch.manual_seed(0)
    m = BatchNormOnTransposed().eval()
    m.norm.running_mean.uniform_(-1, 1)
    m.norm.running_var.uniform_(0.5, 2)
    return m


def test_torch_lowering_of_batch_norm_on_transposed_fails_at_run_time():
    x = torch.randn(2, 12, 32)
    lowered = torch.export.export(_bn_model(), (x,)).run_decompositions().module()
    with pytest.raises(RuntimeError, match="view size is not compatible with input tensor's size and stride"):
        lowered(x)


@pytest.mark.parametrize("preset", ["core", "max"])
def test_pt2b_lowering_of_batch_norm_on_transposed_runs(tmp_path, preset):
    x = torch.randn(2, 12, 32)
    path = tmp_path / "m.pt2b"
    exporter.export_model(_bn_model(), (x,), path)
    lowered = exporter.load_for_backend(path, preset, cache=False)
    assert lowered.validation.status == "passed"
    assert_close_to_eager(Runtime(lowered)(x), _bn_model()(x), rtol=1e-5, atol=1e-5)
    assert_close_to_eager(lowered.exported_program().module()(x), _bn_model()(x), rtol=1e-5, atol=1e-5)


def _strides(t):
    """Strides of the dims longer than 1 (a size-1 dim's stride does not matter to any view)."""
    return tuple(s for n, s in zip(t.shape, t.stride()) if n > 1)


def _real_and_fake(op, args, kwargs=None):
    from torch._subclasses.fake_tensor import FakeTensorMode

    kwargs = kwargs or {}
    real = op(*args, **kwargs)
    with FakeTensorMode() as mode:
        fake = op(*[mode.from_tensor(a) if isinstance(a, torch.Tensor) else a for a in args], **kwargs)
    first = (lambda r: r[0] if isinstance(r, tuple) else r)
    return first(real), first(fake)


def _bn_args(op):
    x = torch.randn(2, 32, 64).permute(0, 2, 1)  # (2, 64, 32), neither contiguous nor channels-last
    c = [torch.randn(64), torch.randn(64)]
    stats = [torch.randn(64), torch.rand(64) + 0.5]
    a = torch.ops.aten
    return {a._native_batch_norm_legit_no_training.default: (x, *c, *stats, 0.1, 1e-5),
            a._native_batch_norm_legit.default: (x, *c, *stats, True, 0.1, 1e-5),
            a._native_batch_norm_legit.no_stats: (x, *c, True, 0.1, 1e-5),
            a.native_batch_norm.default: (x, *c, *stats, False, 0.1, 1e-5)}[op]


def _group_norm_input():
    """(1, 64, 8, 8) channels-last with the batch's stride 64: what the VAE's residual add gives at run
    time, where the fake kernel says 4096 (a size-1 dim: the layouts differ in nothing else)."""
    return torch.randn(8, 8, 64).permute(2, 0, 1)[None]


def test_group_norm_kernel_refuses_what_its_fake_kernel_accepts():
    from torch._subclasses.fake_tensor import FakeTensorMode

    op = torch.ops.aten.native_group_norm.default
    x = _group_norm_input()
    args = (torch.randn(64), torch.randn(64), 1, 64, 64, 16, 1e-5)
    assert x.stride() == (64, 1, 512, 64) and x.is_contiguous(memory_format=torch.channels_last)
    with FakeTensorMode() as mode:
        fake = [mode.from_tensor(a) if isinstance(a, torch.Tensor) else a for a in args]
        op(mode.from_tensor(x), *fake)
        op(mode.from_tensor(torch.empty_strided(x.shape, (4096, 1, 512, 64))), *fake)
    with pytest.raises(RuntimeError, match="Expected X.is_contiguous"):
        op(x, *args)
    op(x.contiguous(), *args)  # what the repair gives it


@pytest.mark.parametrize("op", [op for op in decompose_layout_ops()
                                if op is not torch.ops.aten.native_group_norm.default], ids=str)
def test_each_repaired_op_really_disagrees_with_its_fake_kernel(op):
    """The list is measured: if torch makes the two kernels agree, this fails and the op leaves it."""
    if op is torch.ops.aten.div.Tensor_mode:
        args, kwargs = (torch.randn(5, 10).mT, torch.randn(10, 5) + 3), {"rounding_mode": "floor"}
    else:
        args, kwargs = _bn_args(op), {}
    real, fake = _real_and_fake(op, args, kwargs)
    assert _strides(real) != _strides(fake)
    dense = [a.contiguous() if isinstance(a, torch.Tensor) else a for a in args]
    real, fake = _real_and_fake(op, dense, kwargs)
    assert _strides(real) == _strides(fake)  # what the repair gives them


@pytest.mark.slow  # a sweep over every core op's OpInfo samples in four layouts (about 50 s): -m slow
def test_no_other_core_op_disagrees_with_its_fake_kernel_on_opinfo_samples():
    """Every core op the OpInfo samples reach, with each tensor argument also transposed, permuted
    and channels-last: the kernel's result strides equal the fake kernel's, except for the repaired ops."""
    import warnings

    import torch.utils._pytree as pytree
    from torch.testing._internal.common_methods_invocations import op_db
    from torch.utils._python_dispatch import TorchDispatchMode

    from exporter._torch import testing
    from exporter.lowering import presets
    from exporter.ops import resolve_op

    core = {resolve_op(name) for name in presets.load("core").opset} - {None}
    repaired = set(decompose_layout_ops())

    class FirstCalls(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.calls = {}

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func in core and func not in self.calls:
                self.calls[func] = (args, kwargs or {})
            return func(*args, **(kwargs or {}))

    def variants(t):
        if not isinstance(t, torch.Tensor) or t.layout != torch.strided or t.dim() < 2 or t.numel() < 2:
            return []
        out = [t.mT.contiguous().mT]
        if t.dim() >= 3:
            order = (*range(1, t.dim()), 0)
            out.append(t.permute(order).contiguous().permute(t.dim() - 1, *range(t.dim() - 1)))
        if t.dim() == 4:
            out.append(t.contiguous(memory_format=torch.channels_last))
        return out

    found, reached = set(), set()
    for info in op_db:
        try:
            torch.manual_seed(0)
            samples = testing.samples(info, torch.float32, 4)
        except Exception:  # noqa: BLE001 - a sample generator that cannot run here
            continue
        for s in samples:
            try:
                with warnings.catch_warnings(), FirstCalls() as rec:
                    warnings.simplefilter("ignore")
                    info.op(s.input, *s.args, **s.kwargs)
            except Exception:  # noqa: BLE001 - a sample torch refuses
                continue
            for op, (args, kwargs) in rec.calls.items():
                if op._schema.is_mutable or torch.Tag.nondeterministic_seeded in op.tags:
                    continue
                reached.add(op)
                flat, spec = pytree.tree_flatten((args, kwargs))
                for i, x in enumerate(flat):
                    for v in variants(x):
                        a, k = pytree.tree_unflatten(flat[:i] + [v] + flat[i + 1:], spec)
                        try:
                            with warnings.catch_warnings():
                                warnings.simplefilter("ignore")
                                real, fake = _real_and_fake(op, a, k)
                        except Exception:  # noqa: BLE001 - the variant does not run
                            continue
                        if isinstance(real, torch.Tensor) and real.layout == torch.strided \
                                and _strides(real) != _strides(fake):
                            found.add(op)
    assert len(reached) > 120
    assert found - repaired == set()


# ---- the VAE case: group norm after an attention block, batch of one ----

class VaeMidBlock(torch.nn.Module):
    """A VAE encoder's mid block (diffusers' AutoencoderKL, whose encode() fails in torch's core
    lowering the same way): group norm, single-head attention over the pixels, the result reshaped
    back to an image, residual add, rescale, then the next block's group norm."""

    def __init__(self, c=64):
        super().__init__()
        self.norm = torch.nn.GroupNorm(16, c)
        self.q, self.k, self.v, self.out = (torch.nn.Linear(c, c) for _ in range(4))
        self.norm2 = torch.nn.GroupNorm(16, c)
        self.conv = torch.nn.Conv2d(c, c, 3, padding=1)

    def forward(self, x):
        b, c, h, w = x.shape
        t = self.norm(x.view(b, c, h * w)).transpose(1, 2)
        q, k, v = (lin(t).view(b, -1, 1, c).transpose(1, 2) for lin in (self.q, self.k, self.v))
        a = F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(b, -1, c)
        a = self.out(a).transpose(-1, -2).reshape(b, c, h, w)
        return self.conv(F.silu(self.norm2((a + x) / 1.0)))


def _vae_model():
    torch.manual_seed(0)
    return VaeMidBlock().eval()


def test_torch_lowering_of_the_vae_block_fails_at_run_time_with_a_batch_of_one():
    x = torch.randn(1, 64, 8, 8)
    lowered = torch.export.export(_vae_model(), (x,)).run_decompositions().module()
    with pytest.raises(RuntimeError, match="Expected X.is_contiguous"):
        lowered(x)
    x2 = torch.randn(2, 64, 8, 8)
    torch.export.export(_vae_model(), (x2,)).run_decompositions().module()(x2)  # a batch of two runs


@pytest.mark.parametrize("batch", [1, 2])
@pytest.mark.parametrize("preset", ["core", "max"])
def test_pt2b_lowering_of_the_vae_block_runs(tmp_path, preset, batch):
    x = torch.randn(batch, 64, 8, 8)
    path = tmp_path / "m.pt2b"
    exporter.export_model(_vae_model(), (x,), path)
    lowered = exporter.load_for_backend(path, preset, cache=False)
    assert lowered.validation.status == "passed"
    assert_close_to_eager(Runtime(lowered)(x), _vae_model()(x), rtol=1e-4, atol=1e-5)
