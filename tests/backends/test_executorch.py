"""Issue 38: ExecuTorch's preset is its runtime's own kernel registry read as functional ops; a view
op is accepted where the runtime has its *_copy kernel (to_edge rewrites one into the other), so
flatten/squeeze/expand no longer end at prims; the zoo runs on the portable kernels close to eager.
ExecuTorch installs slowly (about ten minutes): these tests run where it is installed
(`pytest -m backends tests/backends/test_executorch.py` in a venv with `pip install executorch`)."""

from __future__ import annotations

import copy
import dataclasses

import pytest
import torch

pytest.importorskip("executorch.extension.pybindings.portable_lib")

from exporter import backends, export_model, load_for_backend  # noqa: E402
from tools.corpus.zoo import make_case  # noqa: E402
from exporter.errors import BackendHandOffError, BackendResultError  # noqa: E402

pytestmark = pytest.mark.backends


def test_the_op_list_is_the_runtimes_kernel_registry():
    from executorch.extension.pybindings import portable_lib

    b = backends.get("executorch")
    kernels = set(portable_lib._get_operator_names())
    assert {"aten::add.out", "aten::view_copy.out", "aten::squeeze_copy.dims_out"} <= kernels
    accepted = set(b.supported_ops)
    # out-variants read as the functional op of the same arguments; *_copy kernels also as their view
    assert {"aten::add.Tensor", "aten::full.default", "aten::view_copy.default", "aten::view.default",
            "aten::squeeze.dims", "aten::expand.default", "aten::_to_copy.default"} <= accepted
    assert not any(n.endswith(".out") or n.endswith("_out") for n in accepted)
    assert "aten::view.default" not in {n for n in kernels}


class Views(torch.nn.Module):
    def forward(self, x):
        y = x.flatten(1).unsqueeze(0).squeeze(0)
        return y.sum(-1) + x.expand(2, -1, -1, -1).permute(0, 2, 1, 3).sum((0, 1, 3)), x[:, 1]


def test_views_reach_the_runtimes_copy_kernels_not_prims(tmp_path):
    """The case that stopped with OpsetError at prims::squeeze / broadcast_in_dim / collapse_view."""
    x = torch.randn(3, 4, 5)
    export_model(Views(), (x,), tmp_path / "v.pt2b")
    lp = load_for_backend(tmp_path / "v.pt2b", backend="executorch", cache=False)
    assert not any(op.startswith("prims::") for op in lp.ops()), lp.ops()
    torch.testing.assert_close(backends.to_backend("executorch", lp)(x), Views()(x))


@pytest.mark.parametrize("name", ["mlp", "cnn_bn", "lstm", "transformer_encoder", "pytree_io", "kwargs_only",
                                  "dynamic_shapes", "multihead_attention", "buffer_mutation", "map"])
def test_the_zoo_runs_on_the_portable_kernels(tmp_path, name):
    case = make_case(name)
    pristine = copy.deepcopy(case.model)
    export_model(case.model, case.args, tmp_path / "m.pt2b", kwargs=case.kwargs, dynamic_shapes=case.dynamic_shapes)
    compiled = backends.to_backend("executorch", load_for_backend(tmp_path / "m.pt2b", backend="executorch", cache=False))
    with torch.no_grad():
        want = pristine(*case.args, **(case.kwargs or {}))
    torch.testing.assert_close(compiled(*case.args, **(case.kwargs or {})), want, rtol=1e-4, atol=1e-4)
    pte = compiled.save(tmp_path / "m.pte")  # the program the runtime loads, as to_executorch made it
    assert open(pte, "rb").read() == compiled.native.buffer


def test_what_the_runtime_cannot_take_is_a_typed_error(tmp_path):
    case = make_case("while_loop")
    export_model(case.model, case.args, tmp_path / "w.pt2b")
    lp = load_for_backend(tmp_path / "w.pt2b", backend="executorch", cache=False)
    with pytest.raises(BackendHandOffError, match="executorch@.* could not take the program: .*while_loop"):
        backends.to_backend("executorch", lp)


def test_a_cache_filled_eagerly_is_written_back_on_the_runtime(tmp_path):
    """A buffer that required grad when captured (a KV cache filled outside no_grad; transformers'
    static-cache decoders) made to_executorch refuse its write-back ("a leaf Variable that requires grad
    is being used in an in-place operation"), on torch's own program too. pt2b reads the buffer back as
    stored, without requires_grad, and the runtime writes the cache and returns what eager does."""
    from tests.support.helpers import CacheFilledEagerly

    model, args = CacheFilledEagerly.made()
    ep = torch.export.export(model, args)
    with pytest.raises(BackendHandOffError, match="leaf Variable that requires grad"):
        backends.to_backend("executorch", ep)
    export_model(ep, path=tmp_path / "cache.pt2b")
    compiled = backends.to_backend("executorch", load_for_backend(tmp_path / "cache.pt2b", backend="executorch", cache=False))
    # the runtime holds the cache: handed over without frozen_state, checked on a runtime loaded for the check
    assert compiled.validation.status == "passed"
    again, _ = CacheFilledEagerly.made()
    with torch.no_grad():
        torch.testing.assert_close(compiled(*args), again(*args), rtol=1e-5, atol=1e-5)


def test_the_buffers_a_program_writes_carry_from_call_to_call(tmp_path):
    """Why ExecuTorch is a backend that holds state: the loaded Method keeps the program's mutable
    buffers, so three calls give what three eager calls give (a frozen copy would repeat the first)."""
    case = make_case("buffer_mutation")
    pristine = copy.deepcopy(case.model)
    export_model(case.model, case.args, tmp_path / "m.pt2b")
    compiled = backends.to_backend(load_for_backend(tmp_path / "m.pt2b", backend="executorch", cache=False))
    assert compiled.validation.status == "passed"  # (run on a runtime of its own: this one's state is untouched)
    for _ in range(3):
        x = torch.randn(4, 8)
        with torch.no_grad():
            torch.testing.assert_close(compiled(x), pristine(x), rtol=1e-4, atol=1e-4)


def test_the_program_s_writes_into_its_inputs_reach_the_caller(tmp_path):
    """Handed over with the writes lifted to outputs, which pt2b makes in the caller's tensors (the
    runtime copies its inputs in: it computes a write and never makes it)."""
    from tests.support.helpers import input_writes_reach_the_caller

    assert input_writes_reach_the_caller("executorch", tmp_path).write_back is not None


def test_a_written_buffer_starts_from_the_programs_value(tmp_path, monkeypatch):
    """ExecuTorch stores a written buffer's shape only and starts it from zeros unless its
    InitializedMutableBufferPass marks it: the hand-off marks every one. Unmarked, the hand-off check (run
    on a runtime loaded for it) catches the zeros."""
    from executorch.exir import to_edge

    from exporter.backends import executorch
    from tests.support.helpers import state_starts_from_the_programs_values

    compiled = state_starts_from_the_programs_values("executorch", tmp_path)
    unmarked = lambda ep: (lambda m: (m, ep, executorch.load(m)))(to_edge(ep).to_executorch())  # noqa: E731
    monkeypatch.setattr(backends, "_CACHE", {**backends._CACHE,
                                             "executorch": dataclasses.replace(compiled.backend, hand_off=unmarked)})
    with pytest.raises(BackendResultError, match=r"executorch@.*: output \(torch.float32\) differs from the "
                                                 r"lowered program's"):
        backends.to_backend(load_for_backend(tmp_path / "from-five-executorch.pt2b", backend="executorch", cache=False))


def test_a_tiny_llama_generates_token_for_token_what_transformers_generates(tmp_path):
    """Prefill and decode handed over on one state (the cache lifted: each method alone would hold a
    cache of its own in the runtime): greedy tokens equal transformers' own generate()."""
    from tests.support.helpers import generates_what_transformers_generates

    generates_what_transformers_generates(("executorch",), tmp_path)


def test_a_check_of_a_value_read_from_a_tensor_runs_on_the_runtime(tmp_path, monkeypatch):
    """to_edge's verifier refuses the sym_ite of such a check (a Python function), which sym_ops.py gives
    as ATen ops; with the verifier off for Python number functions (_edge_config), ExecuTorch's own prim op
    takes it too. Here the verifier stays on: the refusal without sym_ops, the run with it."""
    from executorch.exir import EdgeCompileConfig

    from exporter.backends import executorch as et
    from tests.support.helpers import CheckedIds, a_check_of_a_value_is_taken

    monkeypatch.setattr(et, "_edge_config", lambda ep: EdgeCompileConfig())
    compiled = a_check_of_a_value_is_taken("executorch", tmp_path, monkeypatch)
    for x, ids in ((torch.randn(3), torch.tensor([1, 2])), (torch.ones(3), torch.tensor([4, 0]))):
        torch.testing.assert_close(compiled(x, ids), CheckedIds()(x, ids))


class ModeCount(torch.nn.Module):
    """A buffer the program writes, and a most frequent value, for which ExecuTorch has no kernel: split, the
    reference runs the mode."""

    def __init__(self):
        super().__init__()
        self.register_buffer("count", torch.arange(3.0) + 5)

    def forward(self, x):
        self.count.add_(x)
        return torch.mode(self.count * x, 0, keepdim=True).values + 1


def test_a_split_carries_the_buffers_the_program_writes(tmp_path):
    """The runtime holds a whole program's buffers itself; the parts of a split hold none, so the split
    takes them lifted to inputs and outputs and carries them from call to call, as for a backend that holds
    no state (it used to fail: the check loaded the split as one runtime program)."""
    export_model(ModeCount(), (torch.ones(3),), tmp_path / "count.pt2b")
    from exporter.errors import OpsetError

    with pytest.raises(OpsetError, match="aten::mode"):
        load_for_backend(tmp_path / "count.pt2b", backend="executorch", cache=False)
    lowered = load_for_backend(tmp_path / "count.pt2b", backend="executorch", cache=False, fallback="reference")
    compiled = backends.to_backend(lowered)
    assert compiled.share is not None and compiled.share.on_reference == {"aten::mode.default": 1}
    assert compiled.validation.status == "passed"
    eager = ModeCount()
    for step in range(3):
        x = torch.tensor([1.0, -2.0, 3.0]) * (step + 1)
        torch.testing.assert_close(compiled(x), eager(x), rtol=0, atol=0)


class Router(torch.nn.Module):
    """A mixture-of-experts router that sorts its experts' scores (transformers' ernie4_5_moe, jetmoe)."""

    def forward(self, x):
        scores, order = torch.sort(x.softmax(-1), dim=-1, descending=True)
        return scores[..., :2] * 2, order[..., :2], torch.sort(x, dim=0).values


def test_a_sort_runs_on_the_portable_kernels_as_a_topk(tmp_path):
    """ExecuTorch has no sort kernel but a topk one: pt2b's rewrite (a topk of every element, sorted)
    reaches it, and the router runs whole, its order and sorted values as eager's."""
    torch.manual_seed(0)
    export_model(Router(), (torch.randn(5, 8),), tmp_path / "router.pt2b",
                 dynamic_shapes=({0: torch.export.Dim("tokens", max=16)},))
    lowered = load_for_backend(tmp_path / "router.pt2b", backend="executorch", cache=False)
    assert not any("sort" in str(n.target) for n in lowered.exported_program().graph.nodes)
    compiled = backends.to_backend(lowered)
    assert compiled.share is None and compiled.validation.status == "passed"
    for tokens in (5, 3):
        x = torch.randn(tokens, 8)
        (scores, order, values), (want_scores, want_order, want_values) = compiled(x), Router()(x)
        torch.testing.assert_close(scores, want_scores, rtol=1e-6, atol=1e-6)  # (its softmax rounds otherwise)
        assert torch.equal(order, want_order) and torch.equal(values, want_values)


class Patches(torch.nn.Module):
    """patchtst's patching: windows along the time dim of a transposed input."""

    def forward(self, x):
        return x.transpose(1, 2).unfold(-1, 4, 2).mean(-1)


def test_unfold_of_a_transposed_input_runs_on_the_portable_kernels_as_a_gather(tmp_path):
    """to_edge refuses aten::unfold (not core ATen; the kernel registry holds unfold_copy, which to_edge
    never makes from it), so unfold is not in the list; torch's route for it, an as_strided with the
    transposed input's strides, reads ExecuTorch's dense permute_copy wrong. pt2b's gather runs whole."""
    assert "aten::unfold.default" not in backends.get("executorch").supported_ops
    export_model(Patches(), (torch.randn(2, 9, 3),), tmp_path / "p.pt2b",
                 dynamic_shapes=({0: torch.export.Dim("b", max=8)},))
    lowered = load_for_backend(tmp_path / "p.pt2b", backend="executorch", cache=False)
    assert "aten::as_strided.default" not in lowered.ops()
    compiled = backends.to_backend(lowered)
    assert compiled.share is None and compiled.validation.status == "passed"
    for b in (2, 5):
        x = torch.randn(b, 9, 3)
        torch.testing.assert_close(compiled(x), Patches()(x), rtol=1e-6, atol=1e-6)


class Sampled(torch.nn.Module):
    """vibevoice's latent sampling: mean + std * randn_like(mean)."""

    def forward(self, x):
        mean = x * 2
        return mean + 0.5 * torch.randn_like(mean), x.sum(-1)


def test_a_program_that_samples_runs_on_the_portable_kernels_its_draws_checked_by_shape(tmp_path):
    """ExecuTorch has randn and no randn_like kernel: pt2b's rewrite draws randn of the input's size.
    The sample is ExecuTorch's own draw, compared by shape and dtype; the other output by value."""
    export_model(Sampled(), (torch.randn(2, 8),), tmp_path / "s.pt2b")
    lowered = load_for_backend(tmp_path / "s.pt2b", backend="executorch", cache=False)
    compiled = backends.to_backend(lowered)
    assert compiled.share is None and compiled.validation.random == ("output[0]",)
    x = torch.randn(2, 8)
    sample, total = compiled(x)
    torch.testing.assert_close(total, x.sum(-1))
    noise, again = (sample - x * 2) / 0.5, (compiled(x)[0] - x * 2) / 0.5
    assert noise.shape == (2, 8) and noise.std() > 0.3 and not torch.equal(noise, again)  # (each call draws anew)


class Shifted(torch.nn.Module):
    """RWKV's time shift (ZeroPad2d((0, 0, 1, -1)): a row in front, the last one cropped) and a pad that
    crops one side of a dim and grows the other."""

    def __init__(self):
        super().__init__()
        self.shift = torch.nn.ZeroPad2d((0, 0, 1, -1))

    def forward(self, x):
        return self.shift(x) * 2 - x, torch.nn.functional.pad(x, (-1, 2), value=3.0)


def test_a_pad_that_crops_runs_on_the_portable_kernels_as_slices(tmp_path):
    """torch crops where a pad is negative; ExecuTorch's constant_pad_nd kernel refuses it ("Padding values
    must be non-negative"). The hand-off gives it slices for the cropped sides and the pad of the rest,
    along a dynamic dim too, at sizes above the example's."""
    export_model(Shifted(), (torch.randn(2, 7, 5),), tmp_path / "s.pt2b",
                 dynamic_shapes=({1: torch.export.Dim("t", min=2, max=16)},))
    lowered = load_for_backend(tmp_path / "s.pt2b", backend="executorch", cache=False)
    assert "aten::constant_pad_nd.default" in lowered.ops()
    compiled = backends.to_backend(lowered)
    assert compiled.share is None and compiled.validation.status == "passed"
    for t in (7, 3, 12):
        x = torch.randn(2, t, 5)
        for got, want in zip(compiled(x), Shifted()(x)):
            assert torch.equal(got, want)


def test_a_mixture_of_experts_runs_on_the_portable_kernels_above_the_example_s_size(tmp_path):
    """The layer's empty_like of its routed rows is an empty of a size the program computes; to_edge's
    memory-format pass read that size as a number, specialized the dim to the example's, and the runtime
    refused anything larger ("Attempted to resize a bounded tensor with a maximum capacity of 48
    elements"). The hand-off gives ExecuTorch a full of zeros there (an empty's values are unspecified)."""
    pytest.importorskip("transformers.integrations.moe")
    from tests.lowering.test_rewrites import Experts

    torch.manual_seed(0)
    model = Experts().eval()
    export_model(model, (torch.randn(6, 8),), tmp_path / "moe.pt2b",
                 dynamic_shapes=({0: torch.export.Dim("tokens", max=64)},))
    compiled = backends.to_backend(load_for_backend(tmp_path / "moe.pt2b", backend="executorch", cache=False))
    assert compiled.share is None and compiled.validation.status == "passed"
    for tokens in (6, 9, 40):
        x = torch.randn(tokens, 8)
        torch.testing.assert_close(compiled(x), model(x), rtol=1e-5, atol=1e-5)


class Positions(torch.nn.Module):
    """vitdet's absolute position embeddings: a channels-last grid permuted to channels first, resized by
    bicubic interpolation (whose decomposition keeps the layout by a channels-last clone), permuted back."""

    def __init__(self):
        super().__init__()
        self.grid = torch.nn.Parameter(torch.randn(1, 4, 4, 8))

    def forward(self, x):
        grid = torch.nn.functional.interpolate(self.grid.permute(0, 3, 1, 2), size=(6, 6), mode="bicubic",
                                               align_corners=False)
        return x + grid.permute(0, 2, 3, 1)


def test_a_copy_to_another_layout_runs_on_the_portable_kernels(tmp_path):
    """The portable kernels take every tensor of a call in one dim order; a channels-last clone followed
    by a permute was refused ("2 input tensors have different dim orders", error 0x12). The hand-off
    makes every clone and copy contiguous, the same values."""
    model = Positions()
    export_model(model, (torch.randn(2, 6, 6, 8),), tmp_path / "p.pt2b")
    lowered = load_for_backend(tmp_path / "p.pt2b", backend="executorch", cache=False)
    assert any(n.target is torch.ops.aten.clone.default and n.kwargs.get("memory_format") is torch.channels_last
               for n in lowered.exported_program().graph.nodes)
    compiled = backends.to_backend(lowered)
    assert compiled.share is None and compiled.validation.status == "passed"
    x = torch.randn(2, 6, 6, 8)
    torch.testing.assert_close(compiled(x), model(x), rtol=1e-5, atol=1e-5)


def test_mimis_padding_read_from_buffers_runs_on_executorch():
    """ExecuTorch could not decide a guard on the sizes Mimi's decoder computes from numbers it reads
    from its buffers ("Could not guard on data-dependent expression u12 + u42 + 88 < 1"); the numbers
    are handed over as numbers (fixed_numbers.py)."""
    from tests.support.helpers import CausalConvs

    model, x = CausalConvs().eval(), torch.randn(2, 4, 88)
    compiled = backends.to_backend("executorch", torch.export.export(model, (x,)))
    assert compiled.validation.status == "passed"
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), model(x))


class _SizesOfMinAndMax(torch.nn.Module):
    """deepseek_v32's and axk2's indexers take the smaller of a size and a constant: torch.export records
    ``torch.sym_min`` and ``torch.sym_max``, Python functions."""

    def forward(self, x):
        s = x.shape[1]
        return x * 2, torch.arange(min(s, 5)).sum(), torch.arange(max(s // 2, 3)).sum()


def test_min_and_max_of_sizes_run_on_executorch_as_its_prim_ops(monkeypatch):
    """to_edge's verifier refuses any Python function in a graph (a bare AssertionError), though
    to_executorch makes sym_min and sym_max ExecuTorch's own prim ops: the hand-off turns that verifier off
    for such a program only, and the runtime computes every size as torch does."""
    from executorch.exir import EdgeCompileConfig

    from exporter.backends import executorch as et

    model = _SizesOfMinAndMax()
    ep = torch.export.export(model, (torch.randn(2, 6),), dynamic_shapes=({1: torch.export.Dim("s", min=2, max=64)},))
    assert {torch.sym_min, torch.sym_max} <= {n.target for n in ep.graph.nodes}
    monkeypatch.setattr(et, "_edge_config", lambda ep: EdgeCompileConfig())
    with pytest.raises(BackendHandOffError, match="could not take the program: AssertionError"):
        backends.to_backend("executorch", ep)
    monkeypatch.undo()
    compiled = backends.to_backend("executorch", ep)
    assert compiled.validation.status == "passed"
    for n in (3, 4, 9, 20):
        x = torch.randn(2, n)
        for got, want in zip(compiled(x), model(x)):
            assert torch.equal(got, want)
    # (a program without such calls keeps to_edge's verifier)
    assert et._edge_config(torch.export.export(Views(), (torch.randn(2, 3, 4),)))._check_ir_validity


def test_a_rotary_embedding_on_complex_numbers_runs_on_the_portable_kernels_as_real_pairs(tmp_path, monkeypatch):
    """The portable kernels have no complex dtype, and DeepSeek-V2's and Llama 4's rotary embeddings view
    their queries as complex: the preset keeps the ops making and reading complex tensors
    (complex_pairs.PAIRED_OPS, which the lowering refused), and the hand-off gives them as arithmetic on
    real pairs."""
    from torch.export import Dim

    from exporter.backends import complex_pairs
    from exporter.backends import executorch as et
    from tests.backends.test_complex_pairs import Rotary

    torch.manual_seed(0)
    model = Rotary().eval()
    export_model(model, (torch.randn(2, 5, 8),), tmp_path / "rotary.pt2b",
                 dynamic_shapes=({1: Dim("s", min=2, max=64)},))
    lowered = load_for_backend(tmp_path / "rotary.pt2b", backend="executorch", cache=False)
    assert {"aten::view_as_complex.default", "aten::polar.default"} <= set(lowered.ops())
    assert set(complex_pairs.PAIRED_OPS) <= set(backends.get("executorch").supported_ops)
    with monkeypatch.context() as m:  # without the pairs: to_edge refuses the complex ops
        m.setattr(et, "complex_as_real_pairs", lambda ep: ep)
        with pytest.raises(BackendHandOffError, match="polar"):
            backends.to_backend(lowered)
    compiled = backends.to_backend(lowered)
    assert compiled.share is None and compiled.validation.status == "passed"
    for n in (5, 11):
        x = torch.randn(2, n, 8)
        for got, want in zip(compiled(x), model(x)):
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
