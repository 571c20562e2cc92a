"""transformers' exporters keep conversion tables per backend (its ONNX translations, its OpenVINO
conversion extensions); pt2b's onnx and openvino backends take them where transformers is installed:
a mixture-of-experts model's transformers::grouped_mm_fallback runs on onnxruntime and OpenVINO, SymInt
`%` and sym_min on OpenVINO, and without the tables the same hand-offs fail naming the op."""

from __future__ import annotations

import re
import sys
import types

import pytest
import torch

from exporter import backends, export_model, load_for_backend
from exporter.backends import library_tables
from exporter.errors import BackendHandOffError

pytest.importorskip("onnxruntime")
pytest.importorskip("onnxscript")
pytest.importorskip("openvino")
transformers = pytest.importorskip("transformers")
pytest.importorskip("transformers.exporters.exporter_onnx")
pytest.importorskip("transformers.exporters.exporter_openvino")

GROUPED_MM = "transformers::grouped_mm_fallback.default"
TOL = dict(rtol=1e-4, atol=1e-5)


def _calls(ep) -> set[str]:
    from exporter.ops import op_name

    return {op_name(n.target) for n in ep.graph.nodes if n.op == "call_function"}


def _moe_block():
    """Mixtral's sparse mixture-of-experts block, 4 experts of width 32: its experts run
    transformers' grouped_mm (the torch.ops.transformers.grouped_mm_fallback op under torch.export)."""
    from transformers import MixtralConfig
    from transformers.models.mixtral.modeling_mixtral import MixtralSparseMoeBlock

    config = MixtralConfig(hidden_size=32, intermediate_size=32, num_local_experts=4, num_experts_per_tok=2)
    config._experts_implementation = "grouped_mm"  # a block built alone has no model to set it
    torch.manual_seed(0)
    block = MixtralSparseMoeBlock(config).eval()
    with torch.no_grad():
        for p in block.parameters():  # the experts' weights are made uninitialised
            p.normal_(0, 0.2)
    return block


class GroupedExperts(torch.nn.Module):
    """Rows sorted by expert, each multiplied by its expert's weight with transformers' grouped_mm op;
    the offsets come from a one-hot count (no histc, which OpenVINO lacks and transformers does not
    convert)."""

    def __init__(self):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(4, 16, 8))

    def forward(self, x, expert):
        offsets = torch.nn.functional.one_hot(expert, 4).sum(0).cumsum(0).to(torch.int32)
        return torch.ops.transformers.grouped_mm_fallback(x, self.weight, offsets)


class PadToFour(torch.nn.Module):
    """Pads the dynamic last dim up to a multiple of 4: SymInt `%` nodes in the program."""

    def forward(self, x):
        return torch.nn.functional.pad(x, (0, (4 - x.shape[1] % 4) % 4)) * 2


class FirstFive(torch.nn.Module):
    """A row of min(n, 5) ones scaled by x's row sums: a torch.sym_min node in the program."""

    def forward(self, x):
        return x.sum(1, keepdim=True) * torch.ones(torch.sym_min(x.shape[1], 5))


class IndexAdd(torch.nn.Module):
    """Rows of x added into a 4-row zero tensor at idx: aten.index_add, whose OpenVINO translator fails
    when alpha is left out."""

    def forward(self, x, idx):
        return torch.zeros(4, x.shape[1]).index_add(0, idx, x)


class EmptyLike(torch.nn.Module):
    """empty_like, filled: aten.empty_permuted after torch's decompositions, which OpenVINO lacks."""

    def forward(self, x):
        y = torch.empty_like(x)
        y.copy_(x * 3)
        return y + 1


DYNAMIC = {"x": {1: torch.export.Dim("n", min=2, max=64)}}
# a model whose program holds an op or SymInt node OpenVINO converts only with transformers' extensions
OPENVINO_CASES = {
    "mod": (PadToFour, (torch.randn(2, 7),), DYNAMIC, "operator.mod", "<built-in function mod>"),
    "index_add": (IndexAdd, (torch.randn(6, 5), torch.tensor([0, 1, 1, 3, 0, 2])), None,
                  "aten::index_add.default", "aten.index_add.default"),
    "empty_permuted": (EmptyLike, (torch.randn(3, 4),), None, "aten::empty_like.default",
                       "aten.empty_permuted.default"),
}


@pytest.fixture(scope="module")
def moe(tmp_path_factory):
    block = _moe_block()
    x = torch.randn(2, 6, 32)
    path = tmp_path_factory.mktemp("library_tables") / "moe.pt2b"
    ep = export_model(block, (x,), path)
    return path, block, x, ep


@pytest.fixture
def without_tables(monkeypatch):
    """The backends as they are without transformers' tables."""
    monkeypatch.setattr(library_tables, "transformers_table", lambda backend: library_tables.LibraryTable())
    monkeypatch.setattr(backends, "_CACHE", {})


def test_the_tables_are_transformers_own():
    from transformers.exporters import exporter_onnx, exporter_openvino

    onnx = library_tables.transformers_table("onnx")
    assert onnx.entries is exporter_onnx._ONNX_TRANSLATION_TABLE and GROUPED_MM in onnx.ops
    assert onnx.library == f"transformers{transformers.__version__}"
    ov = library_tables.transformers_table("openvino")
    assert ov.entries is exporter_openvino._OV_CONVERSION_EXTENSIONS
    assert {GROUPED_MM, "aten::empty_permuted.default", "aten::index_add.default", "aten::_fft_c2c.default"} \
        <= set(ov.ops)
    assert {"<built-in function mod>", "<built-in function min>"} <= set(ov.others)
    for name in ("onnx", "openvino"):
        b = backends.get(name)
        assert b.version.endswith(f"+transformers{transformers.__version__}") and "transformers" in b.source
        assert GROUPED_MM in b.supported_ops


def test_no_transformers_table_is_an_empty_one(monkeypatch):
    monkeypatch.setitem(sys.modules, "transformers.exporters.exporter_onnx", None)  # an import that fails
    monkeypatch.setitem(sys.modules, "transformers.exporters.exporter_openvino", types.ModuleType("bare"))
    for name in ("onnx", "openvino"):
        table = library_tables.transformers_table(name)
        assert not table and table.ops == () and table.library == ""
    monkeypatch.setattr(backends, "_CACHE", {})
    onnx = backends.get("onnx")
    assert "transformers" not in onnx.version and GROUPED_MM not in onnx.supported_ops


def test_the_moe_block_runs_on_onnxruntime(moe):
    path, block, x, ep = moe
    assert GROUPED_MM in _calls(ep)
    lp = load_for_backend(path, backend="onnx")
    assert GROUPED_MM in _calls(lp.exported_program())  # the backend takes it as it is
    compiled = backends.to_backend(lp)
    assert compiled.validation.status == "passed" and compiled.validation.outputs == 1
    other = torch.randn(2, 6, 32) * 3  # another routing: other offsets between the experts
    with torch.no_grad():
        for inputs in (x, other):
            torch.testing.assert_close(compiled(inputs), block(inputs), **TOL)


def test_without_the_table_onnx_refuses_the_moe_block(moe, without_tables):
    """Without transformers' table ONNX has no translation of the op: kept whole, the hand-off fails
    naming it; not kept, pt2b's own rewrite of it (lowering/rewrites.py) is what ONNX gets."""
    path, block, x, _ = moe
    lp = load_for_backend(path, backend="onnx", keep=[GROUPED_MM], cache=False)
    with pytest.raises(BackendHandOffError, match=r"onnx@[^ ]+ could not take the program: .*No ONNX function "
                                                  r"found for .*transformers\.grouped_mm_fallback"):
        backends.to_backend(lp)
    rewritten = load_for_backend(path, backend="onnx", cache=False)
    assert GROUPED_MM not in rewritten.ops()
    with torch.no_grad():
        torch.testing.assert_close(backends.to_backend(rewritten)(x), block(x), **TOL)


def test_grouped_mm_runs_on_openvino(tmp_path):
    torch.manual_seed(0)
    m = GroupedExperts()
    x, expert = torch.randn(10, 16), torch.tensor([0, 0, 0, 1, 2, 2, 2, 2, 3, 3])
    path = tmp_path / "experts.pt2b"
    ep = export_model(m, (x, expert), path)
    assert GROUPED_MM in _calls(ep)
    compiled = backends.to_backend(load_for_backend(path, backend="openvino"))
    with torch.no_grad():
        for e in (expert, torch.tensor([1, 1, 1, 1, 1, 1, 3, 3, 3, 3])):  # an expert with no rows, too
            torch.testing.assert_close(compiled(x, e), m(x, e), **TOL)


@pytest.mark.parametrize("model, target", [(PadToFour, "operator.mod"), (FirstFive, "torch.sym_min")])
def test_symint_arithmetic_runs_on_openvino(tmp_path, model, target):
    m = model()
    path = tmp_path / "m.pt2b"
    ep = export_model(m, (torch.randn(2, 7),), path, dynamic_shapes=DYNAMIC)
    assert target in _calls(ep)
    compiled = backends.to_backend(load_for_backend(path, backend="openvino"))
    for n in (3, 8, 13):
        x = torch.randn(2, n)
        assert torch.equal(compiled(x), m(x))


@pytest.mark.parametrize("case", ["index_add", "empty_permuted"])
def test_ops_openvino_lacks_run_with_the_extensions(tmp_path, case):
    model, args, dynamic, op, _ = OPENVINO_CASES[case]
    m = model()
    path = tmp_path / "m.pt2b"
    assert op in _calls(export_model(m, args, path, dynamic_shapes=dynamic))
    compiled = backends.to_backend(load_for_backend(path, backend="openvino"))
    torch.testing.assert_close(compiled(*args), m(*args), rtol=0, atol=0)


@pytest.mark.parametrize("case", sorted(OPENVINO_CASES))
def test_without_the_extensions_openvino_refuses_them(tmp_path, without_tables, case):
    """(empty_permuted, which pt2b also rewrites where a backend lacks it, kept whole to show OpenVINO's gap)"""
    model, args, dynamic, _, failing = OPENVINO_CASES[case]
    path = tmp_path / "m.pt2b"
    export_model(model(), args, path, dynamic_shapes=dynamic)
    keep = ["aten::empty_permuted"] if case == "empty_permuted" else None
    with pytest.raises(BackendHandOffError, match=rf"openvino@[^ +]+ could not take the program: .*"
                                                  rf"(No conversion rule found for operations|Conversion is failed "
                                                  rf"for): {re.escape(failing)}"):
        backends.to_backend(load_for_backend(path, backend="openvino", keep=keep, cache=False))


class ScaledAttention(torch.nn.Module):
    """Attention with a scale of its own (ESM scales its query before and passes 1.0; Gemma 2 its
    query_pre_attn_scalar), under a boolean mask and under none."""

    def __init__(self, scale: float, masked: bool):
        super().__init__()
        self.scale, self.masked = scale, masked

    def forward(self, q, k, v, mask):
        return torch.nn.functional.scaled_dot_product_attention(
            q, k, v, attn_mask=mask if self.masked else None, scale=self.scale)


def _attention_inputs():
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 4, 8, 16) for _ in range(3))
    mask = torch.rand(2, 1, 8, 8) > 0.3
    mask[..., 0] = True
    return q, k, v, mask


@pytest.mark.parametrize("scale, masked", [(1.0, True), (0.5, False)])
def test_an_attention_s_own_scale_runs_on_openvino(tmp_path, monkeypatch, scale, masked):
    """transformers' OpenVINO conversion of the attention leaves its scale out (its export folds the scale
    into the query first): the hand-off folds it there too. Without that, OpenVINO applies its default
    1/sqrt(16) and the hand-off check finds the outputs 1.5-2.6 off."""
    from exporter.backends import openvino as ov_backend
    from exporter.errors import BackendResultError

    m, args = ScaledAttention(scale, masked), _attention_inputs()
    path = tmp_path / "attention.pt2b"
    export_model(m, args, path)
    lowered = load_for_backend(path, backend="openvino", cache=False)
    with monkeypatch.context() as patched:
        patched.setattr(ov_backend, "_scale_in_query", lambda gm, library: None)
        with pytest.raises(BackendResultError, match="the backend computes something else"):
            backends.to_backend(lowered)
    compiled = backends.to_backend(lowered)
    other = _attention_inputs()[:3] + (torch.rand(2, 1, 8, 8) > 0.5,)
    for inputs in (args, other):
        torch.testing.assert_close(compiled(*inputs), m(*inputs), **TOL)


class LegacyEmptyCache(torch.nn.Module):
    """flaubert's attention: a cache that starts as a tensor of shape (0,), concatenated with the keys
    (torch skips such a tensor beside ones of more dims)."""

    def __init__(self):
        super().__init__()
        self.start = torch.empty(0)

    def forward(self, k):
        return torch.cat([self.start.clone(), k.permute(0, 2, 1, 3)], dim=-2) * 2


def test_a_cat_with_a_legacy_empty_tensor_runs_on_openvino(tmp_path, monkeypatch):
    """OpenVINO's converter refuses the cat ("SequenceMark"); the hand-off leaves the empty tensor out."""
    from exporter.backends import openvino as ov_backend

    m, k = LegacyEmptyCache(), torch.randn(2, 5, 4, 8)
    path = tmp_path / "cat.pt2b"
    export_model(m, (k,), path, dynamic_shapes=({1: torch.export.Dim("seq")},))
    lowered = load_for_backend(path, backend="openvino", cache=False)
    with monkeypatch.context() as patched:
        patched.setitem(ov_backend._REWRITES, torch.ops.aten.cat.default, lambda *a, **kw: NotImplemented)
        with pytest.raises(BackendHandOffError, match="SequenceMark, aten.cat.default"):
            backends.to_backend(lowered)
    compiled = backends.to_backend(lowered)
    for seq in (5, 9):
        x = torch.randn(2, seq, 4, 8)
        assert torch.equal(compiled(x), m(x))


def test_a_legacy_empty_tensor_that_decides_the_dtype_stays():
    from exporter.backends.openvino import _cat_without_legacy_empties

    wide = [torch.empty(0, dtype=torch.float64), torch.randn(2, 3)]
    assert _cat_without_legacy_empties(wide, 0) is NotImplemented
    same = [torch.empty(0), torch.randn(2, 3), torch.randn(1, 3)]
    assert torch.equal(_cat_without_legacy_empties(same, 0), torch.cat(same, 0))
