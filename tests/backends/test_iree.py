"""Issue 38: IREE's preset is iree-turbine's own AOT table (IREE publishes no op list), and what it
leaves is what IREE compiles: eval batch norm, which the core preset leaves as
_native_batch_norm_legit_no_training and IREE cannot legalize, reaches it as arithmetic, and the conv
net runs. IREE installs slowly: these tests run where it is installed (`pytest -m backends
tests/backends/test_iree.py` in a venv with iree-turbine, iree-base-compiler and iree-base-runtime)."""

from __future__ import annotations

import operator

import pytest
import torch

pytest.importorskip("iree.turbine.aot")
pytest.importorskip("iree.runtime")

from exporter import backends, export_model, load_for_backend  # noqa: E402
from exporter.errors import BackendHandOffError, BackendResultError  # noqa: E402

pytestmark = pytest.mark.backends


def _artifact(tmp_path, name):
    from tests.support.helpers import zoo_artifact

    path, case = zoo_artifact(tmp_path, name)
    return path, case, case.pristine


def test_the_preset_is_torchs_implicit_decompositions_with_turbines_own_over_them():
    from iree.turbine.aot.decompositions import current_aot_decompositions

    b = backends.get("iree")
    assert b.takes_what_its_table_leaves
    table, turbine = b.decompositions(), current_aot_decompositions()
    cia = {op for op in torch.export.default_decompositions()
           if torch._C._dispatch_has_kernel_for_dispatch_key(op.name(), "CompositeImplicitAutograd")}
    # (what IREE's compiler cannot lower: torch's decompositions)
    gaps = {torch.ops.aten.logsumexp.default, torch.ops.aten._weight_norm_interface.default,
            torch.ops.aten.index_add.default, torch.ops.aten.isin.Tensor_Tensor, torch.ops.aten.isin.Tensor_Scalar,
            torch.ops.aten.isin.Scalar_Tensor}
    assert set(table) == cia | {op for op in turbine if isinstance(op, torch._ops.OpOverload)} | gaps
    bn = torch.ops.aten._native_batch_norm_legit_no_training.default
    assert table[bn] is turbine[bn] and torch.ops.aten.diff.default in table
    assert torch.ops.aten.empty_like.default not in table  # IREE takes it; torch's rewrite it does not
    # a static cache's write: pt2b's scatter over torch's decomposition (which declines on read positions)
    from exporter.lowering.rewrites import index_copy_by_scatter

    assert table[torch.ops.aten.index_copy.default] is index_copy_by_scatter


class Diff(torch.nn.Module):
    """What transformers' decoders do with an attention mask (aten::diff): IREE has no lowering for it."""

    def forward(self, x):
        return torch.diff(x, dim=-1) * 2


def test_aten_diff_reaches_iree_decomposed(tmp_path):
    x = torch.randn(3, 7)
    export_model(Diff(), (x,), tmp_path / "d.pt2b")
    ep = torch.export.export(Diff(), (x,))
    with pytest.raises(BackendHandOffError, match="iree@.* could not take the program"):
        backends.to_backend("iree", ep)  # torch.export's own program, as turbine takes it
    lp = load_for_backend(tmp_path / "d.pt2b", backend="iree", cache=False)
    assert "aten::diff.default" not in lp.ops()
    torch.testing.assert_close(backends.to_backend("iree", lp)(x), Diff()(x))


def test_a_conv_net_with_batch_norm_compiles_and_runs(tmp_path):
    """The core lowering keeps _native_batch_norm_legit_no_training, which IREE does not compile; the
    iree preset hands it arithmetic."""
    path, case, pristine = _artifact(tmp_path, "cnn_bn")
    core = load_for_backend(path, "core", cache=False)
    assert "aten::_native_batch_norm_legit_no_training.default" in core.ops()
    with pytest.raises(BackendHandOffError, match="iree@.* could not take the program"):
        backends.to_backend("iree", core)
    lp = load_for_backend(path, backend="iree", cache=False)
    assert "aten::_native_batch_norm_legit_no_training.default" not in lp.ops()
    with torch.no_grad():
        torch.testing.assert_close(backends.to_backend("iree", lp)(*case.args), pristine(*case.args), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("name", ["mlp", "transformer_encoder", "transformer_decoder", "multihead_attention",
                                  "kwargs_only", "dynamic_shapes", "buffer_mutation", "cnn_bn_train", "inplace_ops"])
def test_the_zoo_runs_on_iree(tmp_path, name):
    path, case, pristine = _artifact(tmp_path, name)
    lowered = load_for_backend(path, backend="iree", cache=False)
    compiled = backends.to_backend("iree", lowered)
    if lowered.exported_program().graph_signature.buffers_to_mutate:  # buffer_mutation, cnn_bn_train
        # IREE holds the buffers as mutable globals: checked on a module loaded for the check, this one untouched
        assert compiled.validation.status == "passed" and compiled.state is None
    else:
        assert compiled.validation.status == "passed"
    with torch.no_grad():
        want = pristine(*case.args, **(case.kwargs or {}))
    torch.testing.assert_close(compiled(*case.args, **(case.kwargs or {})), want, rtol=1e-4, atol=1e-4)
    vmfb = compiled.save(tmp_path / "m.vmfb")  # the module IREE's runtime loads
    assert open(vmfb, "rb").read() == compiled.native



def test_the_buffers_a_program_writes_carry_from_call_to_call(tmp_path):
    """Why IREE is a backend that holds state: the program's written buffers are the module's mutable
    globals, so three calls give what three eager calls give (a frozen copy would repeat the first)."""
    path, case, pristine = _artifact(tmp_path, "buffer_mutation")
    compiled = backends.to_backend(load_for_backend(path, backend="iree", cache=False))
    for _ in range(3):
        x = torch.randn(4, 8)
        with torch.no_grad():
            torch.testing.assert_close(compiled(x), pristine(x), rtol=1e-4, atol=1e-4)


def test_the_program_s_writes_into_its_inputs_reach_the_caller(tmp_path):
    """Handed over with the writes lifted to outputs, which pt2b makes in the caller's tensors."""
    from tests.support.helpers import input_writes_reach_the_caller

    input_writes_reach_the_caller("iree", tmp_path)


def test_a_written_buffer_starts_from_the_programs_value(tmp_path):
    """The module's globals start from the buffer's exported value, and the hand-off check runs on a
    module loaded for it."""
    from tests.support.helpers import state_starts_from_the_programs_values

    state_starts_from_the_programs_values("iree", tmp_path)


def test_a_tiny_llama_generates_token_for_token_what_transformers_generates(tmp_path):
    """Prefill and decode handed over on one state (the cache lifted: each method alone would hold a
    cache of its own in the runtime): greedy tokens equal transformers' own generate()."""
    from tests.support.helpers import generates_what_transformers_generates

    generates_what_transformers_generates(("iree",), tmp_path)


def test_a_check_of_a_value_read_from_a_tensor_runs_on_iree(tmp_path, monkeypatch):
    """turbine's importer converts no torch.sym_ite ("Unimplemented call_function"): the hand-off gives it
    the number as ATen ops (transformers' vision-language models' image-token checks)."""
    from tests.support.helpers import CheckedIds, a_check_of_a_value_is_taken

    compiled = a_check_of_a_value_is_taken("iree", tmp_path, monkeypatch)
    for x, ids in ((torch.randn(3), torch.tensor([1, 2])), (torch.ones(3), torch.tensor([4, 0]))):
        torch.testing.assert_close(compiled(x, ids), CheckedIds()(x, ids))


def test_a_grad_mode_region_runs_on_iree(tmp_path, monkeypatch):
    """turbine's importer converts no torch._C._set_grad_enabled (transformers' cpmant marks a region)."""
    from tests.support.helpers import NoGrad, a_grad_mode_region_is_taken

    x = torch.randn(3, 4)
    compiled = a_grad_mode_region_is_taken("iree", tmp_path, monkeypatch)
    torch.testing.assert_close(compiled(x), NoGrad()(x), rtol=1e-5, atol=1e-5)


class Spectral(torch.nn.Module):
    """Two linears around an FFT, which IREE's compiler cannot legalize (aten._fft_r2c)."""

    def __init__(self):
        super().__init__()
        self.a, self.b = torch.nn.Linear(8, 8), torch.nn.Linear(8, 8)

    def forward(self, x):
        return self.b(torch.fft.fft(self.a(x)).real)


def test_a_split_offers_iree_every_op(tmp_path):
    """IREE publishes no op list, so a split offers it every op and its hand-offs find what it refuses:
    the FFT runs on the reference, the linears on IREE (an empty list once handed IREE nothing)."""
    torch.manual_seed(0)
    model, x = Spectral().eval(), torch.randn(2, 8)
    export_model(model, (x,), tmp_path / "fft.pt2b")
    lowered = load_for_backend(tmp_path / "fft.pt2b", backend="iree", cache=False)
    with pytest.raises(BackendHandOffError, match="could not take the program"):
        backends.to_backend(lowered)
    compiled = backends.to_backend(lowered, fallback="reference")
    ops = [n for n in lowered.exported_program().graph.nodes if isinstance(n.target, torch._ops.OpOverload)]
    assert compiled.share.on_reference == {"aten::_fft_r2c.default": 1}
    assert compiled.share.backend_nodes == len(ops) - 1
    with torch.no_grad():
        for inputs in (x, torch.randn(2, 8)):
            torch.testing.assert_close(compiled(inputs), model(inputs), rtol=1e-5, atol=1e-5)


def test_a_mixture_of_experts_layer_compiles_and_runs_on_iree(tmp_path):
    """transformers' grouped product, inlined by pt2b's rewrite: each row's product with its expert is
    picked by a gather along the experts. The rewrite picked it by an index with two index tensors,
    which IREE refused ("failed to legalize operation 'torch.aten.index.Tensor_hacked_twin'"; dots1,
    ernie4_5_moe and the other mixtures of experts of the corpus)."""
    pytest.importorskip("transformers.integrations.moe")
    from tests.lowering.test_rewrites import Experts

    torch.manual_seed(0)
    model = Experts().eval()
    export_model(model, (torch.randn(6, 8),), tmp_path / "moe.pt2b")
    lowered = load_for_backend(tmp_path / "moe.pt2b", backend="iree", cache=False)
    assert "aten::gather.default" in lowered.ops()
    compiled = backends.to_backend(lowered)
    assert compiled.share is None and compiled.validation.status == "passed"
    for _ in range(3):  # other routings than the example's
        x = torch.randn(6, 8)
        torch.testing.assert_close(compiled(x), model(x), rtol=1e-5, atol=1e-5)


class Cache(torch.nn.Module):
    """A static KV cache written at the positions it is given (transformers' StaticCache: index_copy_)."""

    def __init__(self):
        super().__init__()
        self.register_buffer("keys", torch.zeros(1, 2, 8, 4))

    def forward(self, x, positions):
        self.keys.index_copy_(2, positions, x)
        return self.keys.sum(-1) * 1.0


def test_a_static_cache_is_written_on_iree_by_a_scatter(tmp_path):
    """IREE's importer has no lowering of index_copy (dots1's static cache); the preset writes it as a
    scatter, and the cache fills call by call as the program's does."""
    export_model(Cache(), (torch.randn(1, 2, 3, 4), torch.tensor([0, 1, 2])), tmp_path / "c.pt2b",
                 dynamic_shapes=({2: torch.export.Dim("n", max=8)}, {0: torch.export.Dim("n", max=8)}))
    lowered = load_for_backend(tmp_path / "c.pt2b", backend="iree", cache=False)
    assert "aten::scatter.src" in lowered.ops() and "aten::index_copy.default" not in lowered.ops()
    compiled, eager = backends.to_backend(lowered), Cache()
    for positions in ([0, 1, 2], [3], [4, 5]):
        x, at = torch.randn(1, 2, len(positions), 4), torch.tensor(positions)
        torch.testing.assert_close(compiled(x, at), eager(x, at))


class _Mask(torch.nn.Module):
    """granite_swa's sliding-window mask takes a logsumexp."""

    def forward(self, x):
        return torch.logsumexp(x, -1) * 2 + x.mean()


def test_logsumexp_reaches_iree_decomposed_and_a_failure_names_the_compilers_error(tmp_path, monkeypatch, capfd):
    """IREE's compiler cannot lower logsumexp ("failed to legalize operation 'torch.constant.bool'"), which
    its importer takes: the preset gives it torch's own decomposition. Where compilation fails, the error
    says what failed: the compiler's first error line, not only turbine's "See diagnostics"."""
    from exporter.backends import iree

    model = _Mask()
    export_model(model, (torch.randn(2, 3, 5),), tmp_path / "m.pt2b",
                 dynamic_shapes=({1: torch.export.Dim("n", max=16)},))
    lowered = load_for_backend(tmp_path / "m.pt2b", backend="iree", cache=False)
    assert "aten::logsumexp.default" not in lowered.ops()
    compiled = backends.to_backend(lowered)
    assert compiled.validation.status == "passed"
    x = torch.randn(2, 7, 5)
    torch.testing.assert_close(compiled(x), model(x), rtol=1e-5, atol=1e-5)
    monkeypatch.setattr(iree, "_GAPS", ())
    kept = load_for_backend(tmp_path / "m.pt2b", backend="iree", cache=False)
    assert "aten::logsumexp.default" in kept.ops()
    with pytest.raises(BackendHandOffError, match=r"Compilation failed \(iree-compile\): error: failed to legalize "
                                                  r"operation 'torch\.constant\.(int|bool)'"):
        backends.to_backend(kept)
    assert "error: failed to legalize operation" in capfd.readouterr().err  # (still where it would have gone)


def test_a_compiler_that_crashes_is_an_error_and_the_process_goes_on(tmp_path, monkeypatch):
    """IREE's compiler aborts on some programs (audioflamingo3's encoder: SIGABRT, and SIGSEGV on its
    seq2seq form). It runs in a process of its own, so a crash is an error naming the signal, and the
    caller's process goes on; the same program then compiles with the real compiler."""
    import os
    import stat

    from iree.compiler.tools import binaries

    export_model(_Mask(), (torch.randn(2, 3, 5),), tmp_path / "m.pt2b")
    lowered = load_for_backend(tmp_path / "m.pt2b", backend="iree", cache=False)
    crashing = tmp_path / "iree-compile"
    crashing.write_text('#!/bin/sh\necho "program.mlirbc:3:7: error: boom" >&2\nkill -SEGV $$\n')
    os.chmod(crashing, stat.S_IRWXU)
    with monkeypatch.context() as m:
        m.setattr(binaries, "find_tool", lambda name: str(crashing))
        with pytest.raises(BackendHandOffError, match=r"IREE's compiler \(iree-compile\) was killed by SIGSEGV: "
                                                      r"error: boom"):
            backends.to_backend(lowered)
    x = torch.randn(2, 3, 5)
    torch.testing.assert_close(backends.to_backend(lowered)(x), _Mask()(x), rtol=1e-5, atol=1e-5)


def _routed(lowered, model, inputs, monkeypatch, off, match):
    """The program handed to IREE computes what ``model`` does on each of ``inputs``; with the route
    turned off (``off``: a name in exporter.backends.iree and what replaces it) the compiler fails with
    ``match``: the route is what makes it run."""
    from exporter.backends import iree

    compiled = backends.to_backend(lowered)
    for args in inputs:
        with torch.no_grad():
            torch.testing.assert_close(compiled(*args), model(*args), rtol=1e-5, atol=1e-5)
    monkeypatch.setattr(iree, *off)
    with pytest.raises(BackendHandOffError, match=match):
        backends.to_backend(lowered)


class _Router(torch.nn.Module):
    """A mixture of experts' router: the top two experts, unsorted (their order does not matter)."""

    def __init__(self):
        super().__init__()
        self.gate = torch.nn.Linear(8, 6)
        self.experts = torch.nn.Embedding(6, 8)

    def forward(self, x):
        weights, picked = torch.topk(self.gate(x).softmax(-1), 2, dim=-1, sorted=False)
        return x * weights.sum(-1, keepdim=True) + self.experts(picked).sum(-2)


def test_an_unsorted_topk_is_handed_over_sorted(tmp_path, monkeypatch):
    """IREE lowers only a sorted topk ("failed to legalize operation 'torch.constant.bool'" on an unsorted
    one: the routers of most mixtures of experts). An unsorted topk's order is unspecified, so the
    hand-off sorts it; a sorted one is left as it is."""
    from exporter.backends import iree

    model = _Router().eval()
    export_model(model, (torch.randn(5, 8),), tmp_path / "m.pt2b", dynamic_shapes=({0: torch.export.Dim("n")},))
    lowered = load_for_backend(tmp_path / "m.pt2b", backend="iree", cache=False)
    handed = iree._rewritten_for_iree(lowered.exported_program())
    def unsorted(ep):
        return [iree._unsorted(n) for n in ep.graph.nodes if n.target is torch.ops.aten.topk.default]

    before, after = unsorted(lowered.exported_program()), unsorted(handed)
    assert (before, after) == ([True], [False])
    _routed(lowered, model, [(torch.randn(9, 8),)], monkeypatch, ("_unsorted", lambda node: False),
            r"Compilation failed \(iree-compile\): error: failed to legalize operation 'torch\.constant\.bool'")


class _ChunkedScan(torch.nn.Module):
    """bamba's, zamba2's and granitemoehybrid's chunked scans: the sequence padded to a multiple of the
    chunk, viewed as (batch, -1, chunk, heads), a cumulative sum over the chunk, its last element."""

    def forward(self, x):
        pad = (8 - x.shape[1] % 8) % 8
        y = torch.nn.functional.pad(x, (0, 0, 0, pad)).view(2, -1, 8, 4).permute(0, 3, 1, 2).cumsum(-1)
        return y[:, :, :, -1:] * 2


def test_a_view_to_chunks_names_the_size_of_its_minus_one(tmp_path, monkeypatch):
    """torch records the chunk's 8 in a view of (b, X, h) as (b, -1, 8, h) as ``X // (X // 8)``, which IREE
    cannot tell is 8, and it then miscomputes the slice of the last element ("expected sizes to be
    non-negative, but got -1"). Handed over with the -1 named, the 8 is a number again."""
    from exporter.backends import iree

    model = _ChunkedScan()
    export_model(model, (torch.randn(2, 21, 4),), tmp_path / "m.pt2b", dynamic_shapes=({1: torch.export.Dim.AUTO},))
    lowered = load_for_backend(tmp_path / "m.pt2b", backend="iree", cache=False)

    def chunk(ep):
        return [n.meta["val"].shape[2] for n in ep.graph.nodes if n.target is torch.ops.aten.view.default]

    assert [isinstance(c, int) for c in chunk(lowered.exported_program())] == [False]
    assert chunk(iree._rewritten_for_iree(lowered.exported_program())) == [8]
    _routed(lowered, model, [(torch.randn(2, n, 4),) for n in (3, 16, 37)], monkeypatch,
            ("_infers_a_dynamic_size", lambda node: False),
            r"Compilation failed \(iree-compile\): error: expected sizes to be non-negative, but got -1")


class _Blocks(torch.nn.Module):
    """pegasus_x's blocks: the sequence padded to a multiple of the block, viewed as (batch, n, block, d) with
    n read from the padded length (no -1), then padded again."""

    def forward(self, x):
        x = torch.nn.functional.pad(x, (0, 0, 0, (4 - x.shape[1] % 4) % 4))
        blocks = x.view(2, x.shape[1] // 4, 4, 8)
        return torch.nn.functional.pad(blocks, (0, 0, 2, 0)) * 2


def test_a_view_to_blocks_of_a_literal_size_keeps_it_literal(tmp_path, monkeypatch):
    """A view with no -1 whose literal block size torch records as an expression (``P // (P // 4)``):
    IREE's compiler cannot tell it is 4 and miscomputes the pad after it ("has invalid Read access
    range"). The hand-off retraces such a view, which then records the literal."""
    from exporter.backends import iree

    model = _Blocks()
    export_model(model, (torch.randn(2, 10, 8),), tmp_path / "m.pt2b", dynamic_shapes=({1: torch.export.Dim.AUTO},))
    lowered = load_for_backend(tmp_path / "m.pt2b", backend="iree", cache=False)

    def block(ep):
        return [n.meta["val"].shape[2] for n in ep.graph.nodes if n.target is torch.ops.aten.view.default]

    assert [isinstance(b, int) for b in block(lowered.exported_program())] == [False]
    assert block(iree._rewritten_for_iree(lowered.exported_program())) == [4]
    _routed(lowered, model, [(torch.randn(2, n, 8),) for n in (5, 13, 16)], monkeypatch,
            ("_infers_a_dynamic_size", lambda node: False),
            r"Compilation failed \(iree-compile\): error: .*invalid Read access range")


def _rotary():
    from tests.backends.test_complex_pairs import Rotary

    class DeepSeekRotary(Rotary):
        """DeepSeek-V2's rotary embedding alone: the queries viewed as complex numbers, turned by a product
        (its complex128 output left out: IREE's importer has no complex128)."""

        def forward(self, x):
            t = torch.arange(x.shape[1], dtype=torch.float32)
            cis = torch.polar(torch.ones_like(t)[:, None], torch.outer(t, self.inv_freq))
            q = torch.view_as_complex(self.q(x).reshape(*x.shape[:-1], -1, 2))
            return torch.view_as_real(q * cis.unsqueeze(0)).flatten(2)

    return DeepSeekRotary()


def test_a_rotary_embedding_on_complex_numbers_runs_on_iree_as_real_pairs(tmp_path, monkeypatch):
    """IREE computes a product of complex tensors wrong (the hand-off check catches it), and refuses
    DeepSeek-V2's and Llama 4's own rotary embeddings: the hand-off gives complex tensors as real pairs."""
    from exporter.backends import iree

    torch.manual_seed(0)
    model = _rotary().eval()
    export_model(model, (torch.randn(2, 5, 8),), tmp_path / "m.pt2b",
                 dynamic_shapes=({1: torch.export.Dim("s", min=2, max=64)},))
    lowered = load_for_backend(tmp_path / "m.pt2b", backend="iree", cache=False)
    assert "aten::view_as_complex.default" in lowered.ops()
    with monkeypatch.context() as m:
        m.setattr(iree, "complex_as_real_pairs", lambda ep: ep)
        with pytest.raises(BackendResultError, match="the backend computes something else"):
            backends.to_backend(lowered)
    compiled = backends.to_backend(lowered)
    for n in (5, 11):
        x = torch.randn(2, n, 8)
        with torch.no_grad():
            torch.testing.assert_close(compiled(x), model(x), rtol=1e-5, atol=1e-5)


class _OneWindow(torch.nn.Module):
    """Pools and convolutions making one window in a dim that leaves the input's end unread: mobilevit's
    depthwise convolution (3x3, stride 2, on 2x2), vibevoice's (16 wide on 18), pp_ocr's pool (3x2 on 4)."""

    def __init__(self):
        super().__init__()
        self.depthwise = torch.nn.Conv2d(4, 4, 3, stride=2, padding=1, groups=4)
        self.wide = torch.nn.Conv1d(4, 4, 16, stride=8)

    def forward(self, image, sound):
        pools = torch.nn.functional.avg_pool2d(image, (3, 2)) + torch.nn.functional.max_pool2d(image, (3, 2))
        return self.depthwise(image[:, :, :2, :2]), self.wide(sound), pools


def test_a_single_window_that_leaves_the_input_end_unread_is_handed_over_cut_to_its_reach(tmp_path, monkeypatch):
    """IREE's compiler miscomputes a pool or convolution making one window in a dim whose input it does not
    reach the end of ("'linalg.generic' op inferred input/output operand #1 has shape's dimension #0 to
    be 4, but found 3"): the hand-off gives it the input cut to the window's reach (padded ahead for a
    convolution), the same values."""
    from exporter.backends import iree

    torch.manual_seed(0)
    model = _OneWindow().eval()
    args = (torch.randn(2, 4, 4, 16), torch.randn(2, 4, 18))
    export_model(model, args, tmp_path / "m.pt2b")
    lowered = load_for_backend(tmp_path / "m.pt2b", backend="iree", cache=False)
    compiled = backends.to_backend(lowered)
    with torch.no_grad():
        for got, want in zip(compiled(*args), model(*args)):
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert iree._cut_dims((4, 16), (3, 2), (), 0, 1) == [0]  # (16 is 8 windows of 2: not cut)
    assert iree._cut_dims((5, 5), 3, 2, 1, 1) == []  # (two windows: IREE computes those)
    monkeypatch.setattr(iree, "_cut_dims", lambda *a: [])
    with pytest.raises(BackendHandOffError, match=r"inferred input/output operand #1 has shape's dimension"):
        backends.to_backend(lowered)


class _IndexAdd(torch.nn.Module):
    """jetmoe's experts add their outputs into the tokens' rows with index_add."""

    def forward(self, x, rows, values):
        return x.index_add(0, rows, values) * 2


def test_index_add_reaches_iree_as_torchs_accumulating_index_put(tmp_path, monkeypatch):
    from exporter.backends import iree

    args = (torch.randn(6, 4), torch.tensor([0, 2, 2, 5]), torch.randn(4, 4))
    n = torch.export.Dim("n")
    export_model(_IndexAdd(), args, tmp_path / "m.pt2b", dynamic_shapes=(None, {0: n}, {0: n}))
    lowered = load_for_backend(tmp_path / "m.pt2b", backend="iree", cache=False)
    assert "aten::index_add.default" not in lowered.ops()
    compiled = backends.to_backend(lowered)
    torch.testing.assert_close(compiled(*args), _IndexAdd()(*args), rtol=1e-6, atol=1e-6)
    monkeypatch.setattr(iree, "_GAPS", tuple(g for g in iree._GAPS if g != "aten::index_add.default"))
    kept = load_for_backend(tmp_path / "m.pt2b", backend="iree", cache=False)
    with pytest.raises(BackendHandOffError, match=r"explicitly marked illegal"):
        backends.to_backend(kept)


class _SplitByLength(torch.nn.Module):
    """prophetnet's attention splits a projection in three by the sequence's length."""

    def forward(self, x):
        first, second, third = torch.cat([x, x * 2, x * 3], dim=1).split(x.shape[1], dim=1)
        return first + second * third


def test_a_split_by_a_symbolic_size_reaches_iree_as_slices(tmp_path, monkeypatch):
    from exporter.backends import iree

    export_model(_SplitByLength(), (torch.randn(2, 5, 4),), tmp_path / "m.pt2b",
                 dynamic_shapes=({1: torch.export.Dim.AUTO},))
    lowered = load_for_backend(tmp_path / "m.pt2b", backend="iree", cache=False)
    compiled = backends.to_backend(lowered)
    for n in (3, 7):
        x = torch.randn(2, n, 4)
        torch.testing.assert_close(compiled(x), _SplitByLength()(x), rtol=1e-6, atol=1e-6)
    monkeypatch.setattr(iree, "_split_by_a_size_of_data", lambda node: False)
    with pytest.raises(BackendHandOffError, match=r"failed to legalize operation 'torch\.constant\.int'"):
        backends.to_backend(lowered)


class _Positions(torch.nn.Module):
    """opt's and prophetnet's positions, counted from a mask of ones (and sums of other fills)."""

    def forward(self, ids):
        mask = torch.ones(ids.shape, dtype=torch.long)
        return mask.cumsum(1) * mask - 1 + ids, torch.ones(ids.shape).cumsum(1), torch.full(ids.shape, 0.5).cumsum(-1)


def test_a_cumulative_sum_of_a_fill_reaches_iree_counted(tmp_path, monkeypatch):
    """IREE fuses the fill into the scan and sizes a stack buffer by the sequence's bound ("exceeded stack
    allocation limit"): the hand-off gives ``v * (1, ..., n)`` instead, the same numbers."""
    from exporter.backends import iree

    export_model(_Positions(), (torch.randint(0, 9, (2, 5)),), tmp_path / "m.pt2b",
                 dynamic_shapes=({1: torch.export.Dim("s")},))
    lowered = load_for_backend(tmp_path / "m.pt2b", backend="iree", cache=False)
    compiled = backends.to_backend(lowered)
    for n in (3, 9):
        ids = torch.randint(0, 9, (2, n))
        for got, want in zip(compiled(ids), _Positions()(ids)):
            assert torch.equal(got, want)
    monkeypatch.setattr(iree, "_sum_of_a_fill", lambda node: False)
    with pytest.raises(BackendHandOffError, match=r"exceeded stack allocation limit"):
        backends.to_backend(lowered)


class _Sparsity(torch.nn.Module):
    """gemma3n's activation sparsity: a cutoff at the normal distribution's inverse of a constant."""

    def forward(self, x):
        cutoff = torch.distributions.normal.Normal(0, 1).icdf(torch.tensor(0.95))
        return torch.relu(x - x.mean(-1, keepdim=True) - x.std(-1, keepdim=True) * cutoff)


def test_an_op_iree_cannot_lower_reaches_it_as_the_value_the_program_fixes(tmp_path, monkeypatch):
    from exporter.backends import iree

    x = torch.randn(2, 5, 8)
    export_model(_Sparsity(), (x,), tmp_path / "m.pt2b", dynamic_shapes=({1: torch.export.Dim("s")},))
    lowered = load_for_backend(tmp_path / "m.pt2b", backend="iree", cache=False)
    assert "aten::erfinv.default" in lowered.ops()
    compiled = backends.to_backend(lowered)
    y = torch.randn(2, 9, 8)
    torch.testing.assert_close(compiled(y), _Sparsity()(y), rtol=1e-5, atol=1e-5)
    monkeypatch.setattr(iree, "_NOT_LOWERED", ())
    with pytest.raises(BackendHandOffError, match=r"failed to legalize operation 'torch\.vtensor\.literal'"):
        backends.to_backend(lowered)


class _SplitByCounts(torch.nn.Module):
    """jetmoe's experts split their tokens by the counts routed to each: sizes read from data."""

    def forward(self, x, expert):
        counts = (expert[:, None] == torch.arange(3)).sum(0).tolist()
        for c in counts:
            torch._check(c >= 0)
        torch._check(sum(counts) == x.shape[0])
        return torch.cat([piece * (i + 1) for i, piece in enumerate(x.split(counts, dim=0))])


def test_a_split_by_sizes_read_from_data_reaches_iree_as_slices(tmp_path, monkeypatch):
    from exporter.backends import iree

    export_model(_SplitByCounts(), (torch.randn(6, 4), torch.tensor([0, 2, 1, 2, 0, 2])), tmp_path / "m.pt2b")
    lowered = load_for_backend(tmp_path / "m.pt2b", backend="iree", cache=False)
    assert "aten::split_with_sizes.default" in lowered.ops()
    compiled = backends.to_backend(lowered)
    for expert in ([0, 2, 1, 2, 0, 2], [1, 1, 1, 1, 0, 1]):
        args = (torch.randn(6, 4), torch.tensor(expert))
        torch.testing.assert_close(compiled(*args), _SplitByCounts()(*args), rtol=0, atol=0)
    monkeypatch.setattr(iree, "_split_by_a_size_of_data", lambda node: False)
    with pytest.raises(BackendHandOffError, match=r"failed to legalize operation 'torch\.constant\.int'"):
        backends.to_backend(lowered)


class _Lengths(torch.nn.Module):
    """timesfm clamps a count of positions (integers) to a float bound."""

    def forward(self, mask):
        return torch.clamp(mask.sum(-1), min=1.0) * 2


def test_an_integer_clamped_to_float_bounds_reaches_iree_converted_first(tmp_path, monkeypatch):
    from exporter.backends import iree

    export_model(_Lengths(), (torch.ones(2, 5, dtype=torch.long),), tmp_path / "m.pt2b",
                 dynamic_shapes=({1: torch.export.Dim("s")},))
    lowered = load_for_backend(tmp_path / "m.pt2b", backend="iree", cache=False)
    compiled = backends.to_backend(lowered)
    mask = torch.tensor([[0, 0, 0], [1, 1, 0]])
    got = compiled(mask)
    assert got.dtype == torch.float32 and torch.equal(got, _Lengths()(mask))
    monkeypatch.setattr(iree, "_clamps_an_integer_to_floats", lambda node: False)
    with pytest.raises(BackendHandOffError, match=r"'arith\.cmpf' op operand #0 must be floating-point-like"):
        backends.to_backend(lowered)


class _Masked(torch.nn.Module):
    """higgs_audio_v2 picks its audio positions' rows by a bool mask."""

    def forward(self, x, mask):
        return x[mask] * 2


def test_rows_picked_by_a_bool_mask_reach_iree_as_an_index_select(tmp_path, monkeypatch):
    from exporter.backends import iree

    s = torch.export.Dim("s")
    mask = torch.tensor([[1, 0, 1, 1, 0], [0, 1, 1, 0, 0]], dtype=torch.bool)
    export_model(_Masked(), (torch.randn(2, 5, 4), mask), tmp_path / "m.pt2b", dynamic_shapes=({1: s}, {1: s}))
    lowered = load_for_backend(tmp_path / "m.pt2b", backend="iree", cache=False)
    compiled = backends.to_backend(lowered)
    for mask in (torch.rand(2, 7) > 0.5, torch.ones(2, 3, dtype=torch.bool)):
        x = torch.randn(2, mask.shape[1], 4)
        assert torch.equal(compiled(x, mask), _Masked()(x, mask))
    monkeypatch.setattr(iree, "_indexed_by_a_mask", lambda node: False)
    with pytest.raises(BackendHandOffError, match=r"'arith\.cmpi' op requires all operands to have the same type"):
        backends.to_backend(lowered)


class _MaskedEveryDim(torch.nn.Module):
    """audioflamingo3 picks the values of its audio positions by a mask expanded over the last dim."""

    def forward(self, x, positions):
        return x[positions.unsqueeze(-1).expand_as(x)] * 2


def test_values_picked_by_an_expanded_mask_reach_iree(tmp_path):
    s = torch.export.Dim("s")
    positions = torch.tensor([[1, 0, 1, 1, 0], [0, 1, 1, 0, 0]], dtype=torch.bool)
    export_model(_MaskedEveryDim(), (torch.randn(2, 5, 4), positions), tmp_path / "m.pt2b",
                 dynamic_shapes=({1: s}, {1: s}))
    compiled = backends.to_backend(load_for_backend(tmp_path / "m.pt2b", backend="iree", cache=False))
    for positions in (torch.rand(2, 7) > 0.5, torch.ones(2, 3, dtype=torch.bool)):
        x = torch.randn(2, positions.shape[1], 4)
        assert torch.equal(compiled(x, positions), _MaskedEveryDim()(x, positions))


class _BlockMask(torch.nn.Module):
    """pixtral's block attention mask: blocks of zeros set in a tensor of the dtype's minimum."""

    def forward(self, x):
        mask = torch.full((8, 8), torch.finfo(x.dtype).min)
        mask[0:3, 0:3] = 0
        mask[3:8, 3:8] = 0
        return (x @ x.T + mask).softmax(-1)


def test_a_fill_with_a_tensors_value_reaches_iree_expanded(tmp_path, monkeypatch):
    from exporter.backends import iree

    x = torch.randn(8, 4)
    export_model(_BlockMask(), (x,), tmp_path / "m.pt2b")
    lowered = load_for_backend(tmp_path / "m.pt2b", backend="iree", cache=False)
    assert "aten::fill.Tensor" in lowered.ops()
    compiled = backends.to_backend(lowered)
    torch.testing.assert_close(compiled(x), _BlockMask()(x), rtol=1e-6, atol=1e-6)
    monkeypatch.setattr(iree, "_fill_as_expand", lambda x, value: NotImplemented)
    with pytest.raises(BackendHandOffError, match=r"write affecting operations on global resources"):
        backends.to_backend(lowered)


class _Window(torch.nn.Module):
    """deepseek_v4's and minimax's windows: ``min`` and ``max`` of a size and a number (torch.sym_min/max)."""

    def forward(self, x):
        return torch.arange(torch.sym_min(x.shape[1], 6)).sum() + x.sum(), torch.arange(torch.sym_max(x.shape[1], 4))


def test_min_and_max_of_sizes_reach_iree_as_ops(tmp_path, monkeypatch):
    export_model(_Window(), (torch.randn(2, 9),), tmp_path / "m.pt2b", dynamic_shapes=({1: torch.export.Dim.AUTO},))
    lowered = load_for_backend(tmp_path / "m.pt2b", backend="iree", cache=False)
    _routed(lowered, _Window(), [(torch.randn(2, n),) for n in (3, 5, 9, 20)], monkeypatch,
            ("_extreme_of_sizes", lambda node: False), r"Unimplemented call_function: target=<function sym_m")


class _PaddedToChunks(torch.nn.Module):
    """mamba2's, qwen3_5's and olmo_hybrid's chunked scans pad the sequence to a multiple of the chunk."""

    def forward(self, x):
        pad = (4 - x.shape[1] % 4) % 4
        return torch.nn.functional.pad(x, (0, 0, 0, pad)) * 2


def test_a_remainder_of_sizes_runs_on_iree_as_a_floor_division(monkeypatch):
    """turbine imports ``L % 4`` as aten.fmod.int, which IREE's compiler cannot lower ("explicitly marked
    illegal"); the hand-off gives it ``L - (L // 4) * 4``, and every length pads as torch pads it."""
    from exporter.backends import sym_ops

    model = _PaddedToChunks()
    ep = torch.export.export(model, (torch.randn(2, 6, 3),),
                             dynamic_shapes=({1: torch.export.Dim("L", min=2, max=64)},))
    with monkeypatch.context() as m:
        m.setattr(sym_ops, "_integer_remainder", lambda node: False)
        with pytest.raises(BackendHandOffError, match=r"explicitly marked illegal.*torch\.aten\.fmod\.int"):
            backends.to_backend("iree", ep)
    compiled = backends.to_backend("iree", ep)
    assert compiled.validation.status == "passed"
    for n in (5, 8, 13):
        x = torch.randn(2, n, 3)
        assert torch.equal(compiled(x), model(x))


class _PositionalConv(torch.nn.Module):
    """hubert's and wav2vec2's positional convolution: a grouped conv whose weight is normed over its last dim."""

    def __init__(self):
        super().__init__()
        conv = torch.nn.Conv1d(16, 16, 8, padding=4, groups=4)
        self.conv = torch.nn.utils.parametrizations.weight_norm(conv, name="weight", dim=2)

    def forward(self, x):
        return self.conv(x.transpose(1, 2)).transpose(1, 2)


def test_a_weight_norm_reaches_iree_decomposed(tmp_path, monkeypatch):
    """IREE's compiler miscomputes the shapes of _weight_norm_interface ("'tensor.cast' op operand type
    'tensor<1x1x?xf32>' and result type 'tensor<16x4x8xf32>' are cast incompatible"): the preset gives it
    torch's decomposition, a vector norm and a division, and the convolution runs as torch's."""
    from exporter.backends import iree

    torch.manual_seed(0)
    model = _PositionalConv().eval()
    export_model(model, (torch.randn(2, 10, 16),), tmp_path / "p.pt2b",
                 dynamic_shapes=({1: torch.export.Dim("L", min=2, max=64)},))
    lowered = load_for_backend(tmp_path / "p.pt2b", backend="iree", cache=False)
    assert "aten::_weight_norm_interface.default" not in lowered.ops()
    compiled = backends.to_backend(lowered)
    x = torch.randn(2, 13, 16)
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), model(x), rtol=1e-5, atol=1e-5)
    monkeypatch.setattr(iree, "_GAPS", ("aten::logsumexp.default",))
    kept = load_for_backend(tmp_path / "p.pt2b", backend="iree", cache=False)
    with pytest.raises(BackendHandOffError, match=r"'tensor\.cast' op .* are cast incompatible"):
        backends.to_backend(kept)


class _Pools(torch.nn.Module):
    """efficientnet's final pool (ceil mode, a window wider than the input) beside a plain one."""

    def forward(self, x):
        return (torch.nn.functional.avg_pool2d(x, 8, ceil_mode=True),
                torch.nn.functional.avg_pool2d(x, 3, 2, 1, ceil_mode=True, count_include_pad=False),
                torch.nn.functional.avg_pool2d(x, 2))


def test_an_average_pool_in_ceil_mode_runs_on_iree_without_it(tmp_path, monkeypatch):
    """IREE's compiler miscomputes the last windows of a pool in ceil mode ("'linalg.generic' op inferred
    input/output operand #1 has shape's dimension #0 to be 15, but found 8"): the hand-off gives it the
    pool without ceil mode over the input padded to them, each window divided by what it counts."""
    from exporter.backends import iree

    model = _Pools()
    export_model(model, (torch.randn(2, 4, 7, 7),), tmp_path / "p.pt2b")
    lowered = load_for_backend(tmp_path / "p.pt2b", backend="iree", cache=False)
    handed = iree._rewritten_for_iree(lowered.exported_program())
    pools = [n for n in handed.graph.nodes if n.target is torch.ops.aten.avg_pool2d.default]
    assert len(pools) == 5 and not any(iree._in_ceil_mode(n) for n in pools)  # (two per rewritten pool)
    compiled = backends.to_backend(lowered)
    x = torch.randn(2, 4, 7, 7)
    for got, want in zip(compiled(x), model(x)):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    monkeypatch.setattr(iree, "_rewritten_for_iree", lambda ep: ep)
    with pytest.raises(BackendHandOffError, match=r"'linalg\.generic' op inferred input/output operand"):
        backends.to_backend(lowered)


def _without_importer_repairs(monkeypatch):
    from exporter.backends import iree

    monkeypatch.setattr(iree, "FX_IMPORTER_REPAIRS", ())


def test_checks_built_with_not_and_or_run_on_iree(monkeypatch):
    """turbine's importer converts no ``torch.sym_not`` nor ``|`` of checks ("Unimplemented call_function"):
    the hand-off computes each such check by ops, and IREE runs it: a call breaking it fails."""
    from tests.support.helpers import CheckedCount, CheckedRows

    x = torch.randn(6, 3)
    compiled = {}
    for model, args in ((CheckedRows(), (x[:5], torch.tensor([1, 0, 1, 1, 0], dtype=torch.bool))),
                        (CheckedCount(), (x, torch.tensor([2, 2])))):
        ep = torch.export.export(model, args)
        with monkeypatch.context() as m:
            _without_importer_repairs(m)
            with pytest.raises(BackendHandOffError, match="Unimplemented call_function: target=<function sym_not"):
                backends.to_backend("iree", ep)
        compiled[type(model)] = backends.to_backend("iree", ep)
        assert compiled[type(model)].validation.status == "passed"
    rows, count = compiled[CheckedRows], compiled[CheckedCount]
    for mask in (torch.tensor([0, 1, 0, 0, 0], dtype=torch.bool), torch.ones(5, dtype=torch.bool)):
        torch.testing.assert_close(rows(x[:5], mask), CheckedRows()(x[:5], mask))
    for counts in (torch.tensor([4, 0]), torch.tensor([0, 0]), torch.tensor([3, 3])):
        torch.testing.assert_close(count(x, counts), CheckedCount()(x, counts))
    with pytest.raises(RuntimeError, match=r"Runtime assertion failed for expression Ne\(u\d+, 0\)"):
        rows(x[:5], torch.zeros(5, dtype=torch.bool))
    with pytest.raises(RuntimeError, match=r"Runtime assertion failed for expression Ne\(u\d+, 3\)"):
        count(x, torch.tensor([1, 2]))
    with pytest.raises(RuntimeError, match=r"Runtime assertion failed for expression Eq\(u\d+, 0\) \| \(1 < u\d+\)"):
        count(x, torch.tensor([1, 0]))


def test_a_check_the_shapes_fix_is_left_out_for_iree(tmp_path, monkeypatch):
    """A check of a count that the program's shapes then fix is recorded as ``8 >= 8`` (omniasr's
    placeholder check), a Python call whose value is no expression, which turbine's importer does not
    convert: the hand-off leaves it out, as the program proves it."""
    from tests.support.helpers import PlacedFeatures, placed_features_args

    args = placed_features_args()
    export_model(PlacedFeatures(), args, tmp_path / "p.pt2b")
    lowered = load_for_backend(tmp_path / "p.pt2b", backend="iree", cache=False)
    fixed = [n for n in lowered.exported_program().graph.nodes
             if n.op == "call_function" and n.target is operator.ge and n.meta.get("val") is True]
    assert fixed and all(not isinstance(a, torch.fx.Node) for a in fixed[0].args)
    with monkeypatch.context() as m:
        _without_importer_repairs(m)
        with pytest.raises(BackendHandOffError, match="Unimplemented call_function: target=<built-in function ge>"):
            backends.to_backend(lowered)
    compiled = backends.to_backend(lowered)
    assert compiled.validation.status == "passed"
    x, ids, features = args
    for ids in (ids, torch.tensor([[1, 7, 1, 1, 1], [1, 1, 1, 1, 7]])):
        torch.testing.assert_close(compiled(x, ids, features), PlacedFeatures()(x, ids, features))


class _SpecialTokens(torch.nn.Module):
    """grounding-dino marks its special text tokens with isin."""

    def forward(self, x, ids):
        return x * torch.isin(ids, torch.tensor([101, 102, 1012])).unsqueeze(-1)


def test_isin_reaches_iree_decomposed(tmp_path, monkeypatch):
    from exporter.backends import iree

    args = (torch.randn(2, 6, 3), torch.tensor([[101, 5, 1012, 7, 102, 3], [4, 4, 101, 9, 9, 9]]))
    export_model(_SpecialTokens(), args, tmp_path / "m.pt2b")
    lowered = load_for_backend(tmp_path / "m.pt2b", backend="iree", cache=False)
    assert "aten::isin.Tensor_Tensor" not in lowered.ops()
    compiled = backends.to_backend(lowered)
    assert torch.equal(compiled(*args), _SpecialTokens()(*args))
    monkeypatch.setattr(iree, "_GAPS", tuple(g for g in iree._GAPS if not g.startswith("aten::isin")))
    kept = load_for_backend(tmp_path / "m.pt2b", backend="iree", cache=False)
    with pytest.raises(BackendHandOffError, match=r"explicitly marked illegal.*torch\.aten\.isin"):
        backends.to_backend(kept)
