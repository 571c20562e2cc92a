"""Apache TVM (Relax) takes pt2b's lowering with its own op list, its importer's convert map read from
the installed package: the zoo and a small transformers Llama run close to eager (the Llama at another
batch and length), with TVM's conversions that compute wrong on torch programs routed around; the
hand-off check catches a wrong result; the buffers a program writes are carried; save() writes the
library TVM's runtime loads. TVM installs in minutes: these tests run where it is installed (`pytest -m
backends tests/backends/test_tvm.py` in a venv with apache-tvm)."""

from __future__ import annotations

import dataclasses
import subprocess
import sys

import pytest
import torch

pytest.importorskip("tvm.relax.frontend.torch")

from exporter import backends, export_model, load_for_backend  # noqa: E402
from exporter.errors import BackendHandOffError, BackendResultError  # noqa: E402

pytestmark = pytest.mark.backends

TOL = dict(rtol=1e-4, atol=1e-4)


def _artifact(tmp_path, name):
    from tests.support.helpers import zoo_artifact

    path, case = zoo_artifact(tmp_path, name)
    return path, case, case.pristine


def _own_conversion(key):
    """TVM's own conversion ``key``, as a custom_convert_map entry (over the hand-off's fixed one)."""
    from tvm.relax.frontend.torch.exported_program_translator import ExportedProgramImporter

    return lambda node, importer: ExportedProgramImporter.create_convert_map(importer)[key](node)


def test_the_op_list_is_the_importers_convert_map():
    from tvm.relax.frontend.torch.exported_program_translator import ExportedProgramImporter

    b = backends.get("tvm")
    keys = set(ExportedProgramImporter().create_convert_map())
    assert len(b.supported_ops) > 250 and "ExportedProgramImporter" in b.source
    # every entry is an ATen op whose name without the namespace is a key of the importer's map
    assert all(name.startswith("aten::") and name.removeprefix("aten::") in keys for name in b.supported_ops)
    assert {"aten::scaled_dot_product_attention.default", "aten::cumsum.default"} <= set(b.supported_ops)
    assert "aten::softsign.default" not in b.supported_ops  # a key naming no ATen op this torch has
    assert not b.holds_state and b.takes_lifted_state


@pytest.mark.parametrize("name", ["mlp", "cnn_bn", "transformer_encoder", "multihead_attention", "kwargs_only",
                                  "dynamic_shapes", "cond"])
def test_the_zoo_runs_on_tvm(tmp_path, name):
    path, case, pristine = _artifact(tmp_path, name)
    compiled = backends.to_backend(load_for_backend(path, backend="tvm", cache=False))
    assert compiled.validation.status == "passed"
    with torch.no_grad():
        want = pristine(*case.args, **(case.kwargs or {}))
    torch.testing.assert_close(compiled(*case.args, **(case.kwargs or {})), want, **TOL)


class Masks(torch.nn.Module):
    """What transformers' mask code does with bools: a cumsum and a cumprod of a bool (torch makes
    int64 of both), and ``new_ones(dtype=torch.bool)``."""

    def forward(self, mask, x):
        ones = x.new_ones(mask.shape, dtype=torch.bool)
        return mask.cumsum(-1), mask.cumprod(-1), (ones & mask).to(x.dtype) * x


def test_bool_cumsum_and_new_ones_take_torchs_dtypes(tmp_path):
    """TVM's own conversions keep a cumsum's input dtype (a bool one fails to compile) and ignore
    new_ones' dtype=; the hand-off converts them in the dtypes the program records."""
    import tvm
    from tvm.relax.frontend.torch import from_exported_program

    mask, x = torch.rand(3, 6) > 0.5, torch.randn(3, 6)
    ep = torch.export.export(Masks(), (mask, x))
    with pytest.raises(Exception, match="MatchesCode"):  # torch.export's own program, TVM on its own
        tvm.compile(from_exported_program(ep), target="llvm")
    export_model(Masks(), (mask, x), tmp_path / "m.pt2b", dynamic_shapes=({0: torch.export.Dim("n")},) * 2)
    compiled = backends.to_backend(load_for_backend(tmp_path / "m.pt2b", backend="tvm", cache=False))
    other = torch.rand(5, 6) > 0.3, torch.randn(5, 6)
    got, want = compiled(*other), Masks()(*other)
    assert [g.dtype for g in got] == [torch.int64, torch.int64, torch.float32]
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=0, atol=0)


class Router(torch.nn.Module):
    """A mixture-of-experts router as transformers writes one: the top two experts, unsorted, weigh their outputs."""

    def __init__(self):
        super().__init__()
        self.gate = torch.nn.Linear(8, 6)
        self.experts = torch.nn.Parameter(torch.randn(6, 8, 8))

    def forward(self, x):
        weights, chosen = torch.topk(self.gate(x).softmax(-1), 2, dim=-1, sorted=False)
        return (weights.unsqueeze(-1) * torch.einsum("nd,nkde->nke", x, self.experts[chosen])).sum(1)


def test_an_unsorted_topk_is_converted_sorted(tmp_path):
    """TVM's conversion refuses ``topk(sorted=False)``; the hand-off converts it sorted, an order it allows,
    and the router runs close to eager at another size."""
    torch.manual_seed(0)
    model, x = Router().eval(), torch.randn(5, 8)
    ep = torch.export.export(model, (x,), dynamic_shapes=({0: torch.export.Dim("n")},))
    with pytest.raises(BackendHandOffError, match="Currently supports only sorted output for topk operator"):
        backends.to_backend("tvm", ep, custom_convert_map={"topk.default": _own_conversion("topk.default")})
    compiled = backends.to_backend("tvm", ep)
    other = torch.randn(9, 8)
    torch.testing.assert_close(compiled(other), model(other), rtol=1e-5, atol=1e-5)


def test_a_grad_mode_region_is_handed_over(tmp_path, monkeypatch):
    """pt2b keeps a no_grad region's markers, which TVM's map does not name: they change no value, and the
    hand-off leaves them out (TVM's sin rounds otherwise than torch's on some values: within float32
    rounding)."""
    from tests.support.helpers import NoGrad, a_grad_mode_region_is_taken

    torch.manual_seed(0)
    x = torch.randn(3, 4)
    compiled = a_grad_mode_region_is_taken("tvm", tmp_path, monkeypatch)
    torch.testing.assert_close(compiled(x), NoGrad()(x), rtol=1e-6, atol=1e-6)


def test_a_small_llama_runs_close_to_eager_at_another_batch_and_length(tmp_path):
    """transformers hands SDPA a bool mask, which TVM's own conversion refuses; the hand-off converts it
    as torch defines it, left-padded rows (which attend to nothing) included."""
    from tests.support.helpers import tiny_llama

    model, ids, mask = tiny_llama(padded=2)
    dims = {0: torch.export.Dim("batch", max=8), 1: torch.export.Dim("seq", max=32)}
    export_model(model, (), tmp_path / "llama.pt2b", kwargs={"input_ids": ids, "attention_mask": mask},
                 dynamic_shapes={"input_ids": dims, "attention_mask": dims})
    lowered = load_for_backend(tmp_path / "llama.pt2b", backend="tvm", cache=False)
    assert "aten::scaled_dot_product_attention.default" in lowered.ops()
    key = "scaled_dot_product_attention.default"
    with pytest.raises(BackendHandOffError, match="tvm@.*Only a float mask is supported"):
        backends.to_backend(lowered, custom_convert_map={key: _own_conversion(key)})
    compiled = backends.to_backend(lowered)
    assert compiled.validation.status == "passed"
    ids, mask = torch.randint(0, 64, (3, 11)), torch.ones(3, 11, dtype=torch.long)
    mask[0, :4] = 0
    with torch.no_grad():
        want = model(input_ids=ids, attention_mask=mask).logits
    torch.testing.assert_close(compiled(input_ids=ids, attention_mask=mask).logits, want, **TOL)


def test_a_wrong_result_is_caught_at_the_hand_off(tmp_path, monkeypatch):
    path, _, _ = _artifact(tmp_path, "mlp")
    lowered = load_for_backend(path, backend="tvm", cache=False)
    tvm_backend = backends.get("tvm")
    real_run = tvm_backend.run

    def nudged(*a, **k):
        return real_run(*a, **k) * 1.01

    monkeypatch.setitem(backends._CACHE, "tvm", dataclasses.replace(tvm_backend, run=nudged))
    with pytest.raises(BackendResultError, match=r"tvm@.*: output \(torch.float32\) differs from the lowered "
                                                 r"program's by [0-9.e-]+ \(relative\), beyond 0.001"):
        backends.to_backend(lowered)
    assert backends.to_backend(lowered, validate=False).validation is None


def test_the_buffers_a_program_writes_carry_from_call_to_call(tmp_path):
    """TVM binds buffers as constants and drops their writes: the program is handed over with them
    lifted, and the Compiled carries them, three calls as three eager calls."""
    path, case, pristine = _artifact(tmp_path, "buffer_mutation")
    compiled = backends.to_backend(load_for_backend(path, backend="tvm", cache=False))
    assert sorted(compiled.state) == ["count", "ema"] and compiled.validation.status == "passed"
    for _ in range(3):
        x = torch.randn(4, 8)
        with torch.no_grad():
            torch.testing.assert_close(compiled(x), pristine(x), **TOL)
    assert int(compiled.state["count"]) == 3
    torch.testing.assert_close(compiled.state["ema"], pristine.ema, **TOL)


def test_save_writes_the_library_tvms_runtime_loads_without_pt2b(tmp_path):
    path, case, pristine = _artifact(tmp_path, "mlp")
    compiled = backends.to_backend(load_for_backend(path, backend="tvm", cache=False))
    library = compiled.save(tmp_path / "m.so")
    (x,) = case.args
    torch.save(x, tmp_path / "x.pt")
    script = (f"import sys, numpy, torch, tvm\nfrom tvm import relax\nassert 'exporter' not in sys.modules\n"
              f"vm = relax.VirtualMachine(tvm.runtime.load_module({library!r}), tvm.cpu())\n"
              f"x = torch.load({str(tmp_path / 'x.pt')!r})\n"
              f"numpy.save({str(tmp_path / 'y.npy')!r}, vm['main'](tvm.runtime.tensor(x.numpy()))[0].numpy())\n")
    subprocess.run([sys.executable, "-c", script], check=True, cwd=tmp_path, timeout=120)
    import numpy

    with torch.no_grad():
        torch.testing.assert_close(torch.from_numpy(numpy.load(tmp_path / "y.npy")), pristine(x), **TOL)


def test_the_program_s_writes_into_its_inputs_reach_the_caller(tmp_path):
    """Handed over with the writes lifted to outputs, which pt2b makes in the caller's tensors."""
    from tests.support.helpers import input_writes_reach_the_caller

    input_writes_reach_the_caller("tvm", tmp_path)


class CacheWrite(torch.nn.Module):
    """A static KV cache written at ``cache[:, :, position]`` (transformers' StaticCache), two dims sliced."""

    def __init__(self):
        super().__init__()
        self.register_buffer("cache", torch.zeros(2, 3, 8, 4))

    def forward(self, k, position):
        self.cache[:, :, position] = k
        return self.cache.sum(-1)


@pytest.mark.parametrize("indices, values", [
    ((None, None, torch.tensor([1, 3])), (2, 3, 2, 4)),
    ((None, torch.tensor([0, 2])), (2, 2, 8, 4)),
    ((None, torch.tensor([[0], [2]]), torch.tensor([1, 4])), (2, 2, 2, 4)),
    ((None, None, torch.tensor([1, 3]), None), (2, 3, 2, 4)),
    ((None, None, None, torch.tensor([0, 3])), (2, 3, 8, 2)),
])
@pytest.mark.parametrize("accumulate", [False, True])
def test_an_index_put_with_sliced_dims_indexes_every_dim_the_same(indices, values, accumulate):
    from exporter.backends.tvm import _index_put_every_dim

    torch.manual_seed(0)
    x, v = torch.randn(2, 3, 8, 4), torch.randn(values)
    want = torch.ops.aten.index_put.default(x, list(indices), v, accumulate)
    assert torch.equal(_index_put_every_dim(x, list(indices), v, accumulate), want)
    # index tensors apart: torch puts their dims first, and the rewrite declines
    assert _index_put_every_dim(x, [torch.tensor([0]), None, torch.tensor([1])], v, accumulate) is NotImplemented


def test_a_static_cache_write_reaches_tvm_with_every_dim_indexed(tmp_path, monkeypatch):
    """TVM's own conversion refuses an index_put that leaves dims sliced (every static-cache decoder's
    cache write); handed over with every dim indexed, it writes what eager writes, call after call."""
    from exporter.backends import tvm as adapter

    export_model(CacheWrite(), (torch.randn(2, 3, 1, 4), torch.tensor([0])), tmp_path / "w.pt2b")
    lowered = load_for_backend(tmp_path / "w.pt2b", backend="tvm", cache=False)
    compiled = backends.to_backend(lowered)
    eager = CacheWrite()
    for step in range(3):
        k, position = torch.randn(2, 3, 1, 4), torch.tensor([step * 2])
        torch.testing.assert_close(compiled(k, position), eager(k, position), **TOL)
    monkeypatch.setattr(adapter, "_every_dim_indexed", lambda ep: ep)
    with pytest.raises(BackendHandOffError, match="IndexPut requires the number of index tensors"):
        backends.to_backend(lowered)


def test_a_tiny_llama_generates_token_for_token_what_transformers_generates(tmp_path):
    """Prefill and decode handed over on one state (the cache lifted, carried by pt2b): greedy tokens
    equal transformers' own generate()."""
    from tests.support.helpers import generates_what_transformers_generates

    generates_what_transformers_generates(("tvm",), tmp_path)


def test_a_check_of_a_value_read_from_a_tensor_runs_on_the_vm(tmp_path, monkeypatch):
    from tests.support.helpers import CheckedIds, a_check_of_a_value_is_taken

    compiled = a_check_of_a_value_is_taken("tvm", tmp_path, monkeypatch)
    for x, ids in ((torch.randn(3), torch.tensor([1, 2])), (torch.ones(3), torch.tensor([4, 0]))):
        torch.testing.assert_close(compiled(x, ids), CheckedIds()(x, ids))
