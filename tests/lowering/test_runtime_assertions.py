"""Runtime assertions through the lowering: `torch._check_tensor_all` (aten::_is_all_true, which torch
decomposes nowhere) reaches a backend's op list through pt2b's own decomposition, and the lowering
report lists each assertion with what becomes of it (kept, dropped by a converter, proved)."""

import pytest
import torch
from torch.export import Dim

from exporter import backends, export_model, load_for_backend
from exporter.lowering import tables
from exporter.lowering.assertions import PROVED, runtime_assertions

aten = torch.ops.aten
IS_ALL_TRUE = aten._is_all_true.default


class ChecksTensor(torch.nn.Module):
    """transformers' torch_compilable_check on a tensor: `torch._check_tensor_all`."""

    def forward(self, x):
        torch._check_tensor_all(x > -10, lambda: "x must exceed -10")
        return torch.relu(x) * 2


class ChecksSizes(torch.nn.Module):
    def forward(self, x):
        torch._check(x.shape[0] <= 64)
        torch._check(x.shape[0] % 2 == 0)
        return x * 2


class ReadsSize(torch.nn.Module):
    def forward(self, x, n):
        k = n.item()
        torch._check(k >= 0)
        torch._check(k < x.shape[0])
        return x[k]


@pytest.fixture(scope="module")
def checked(tmp_path_factory):
    path = tmp_path_factory.mktemp("assertions") / "checked.pt2b"
    export_model(ChecksTensor(), (torch.randn(3, 4),), path)
    return path


def _failing():
    x = torch.randn(3, 4)
    x[1, 2] = -20.0
    return x


def test_torch_has_no_decomposition_of_is_all_true_and_pt2b_brings_one_to_op_list_backends():
    assert IS_ALL_TRUE not in tables.available_decompositions()  # why 29 ONNX cases failed to lower
    assert tables.closure_decompositions()[IS_ALL_TRUE] is tables.runtime_check_decompositions()[IS_ALL_TRUE]


def test_a_tensor_check_lowers_for_onnx_and_runs_there_as_eager(checked):
    pytest.importorskip("onnxruntime")
    lp = load_for_backend(checked, backend="onnx", cache=False)
    ops = lp.ops()
    assert "aten::_is_all_true.default" not in ops and ops["aten::all.default"] == 1
    assert lp.validation.status == "passed" and lp.validation.verdict == "exact"
    assert "decomposed into" in lp.explain("aten::_is_all_true.default")
    compiled = backends.to_backend(lp)
    for x in (torch.randn(3, 4), torch.randn(3, 4) * 3):
        torch.testing.assert_close(compiled(x), ChecksTensor()(x), rtol=0, atol=0)


@pytest.mark.filterwarnings("ignore::exporter.errors.UnknownOpsWarning")  # (torchlib's names this torch lacks)
def test_a_backend_that_lists_is_all_true_is_handed_it_undecomposed(checked):
    pytest.importorskip("onnxruntime")
    listed = sorted(backends.get("onnx").supported_ops) + ["aten::_is_all_true.default"]
    lp = load_for_backend(checked, supported_ops=listed, cache=False)
    assert lp.ops()["aten::_is_all_true.default"] == 1 and "aten::all.default" not in lp.ops()


@pytest.mark.parametrize("shape", [(), (0,), (1,), (7,), (3, 5), (2, 3, 4)])
def test_the_decomposition_is_exact_against_the_op(shape):
    decomposition = tables.runtime_check_decompositions()[IS_ALL_TRUE]
    g = torch.Generator().manual_seed(len(shape) * 10 + sum(shape))
    for p in (0.0, 0.5, 0.95, 1.0):
        t = torch.rand(shape, generator=g) < p
        for laid in (t, t.mT if t.dim() >= 2 else t, t.expand(2, *t.shape), t.repeat(2, *[1] * t.dim())[::2]):
            want, got = IS_ALL_TRUE(laid), decomposition(laid)
            assert (got.dtype, got.shape, got.device) == (want.dtype, want.shape, want.device)
            assert (got.dtype, got.shape) == (torch.bool, ())
            assert torch.equal(got, want), (shape, p)
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():  # what the lowering's trace sees: the op's meta says the same
        fake = torch.empty(shape, dtype=torch.bool)
        want, got = IS_ALL_TRUE(fake), decomposition(fake)
        assert (got.dtype, got.shape) == (want.dtype, want.shape)


def test_the_decomposition_declines_what_the_op_refuses():
    decomposition = tables.runtime_check_decompositions()[IS_ALL_TRUE]
    with pytest.raises(RuntimeError, match="kBool"):
        IS_ALL_TRUE(torch.ones(3))
    assert decomposition(torch.ones(3)) is NotImplemented


def test_the_report_names_each_assertion_and_what_onnx_and_openvino_make_of_it(checked):
    """Both converters drop a runtime assertion (torch.onnx by its own pass; OpenVINO converts only
    what its results read): their compiled programs run on an input that breaks the check, where the
    lowered program, which keeps it, stops."""
    pytest.importorskip("onnxruntime")
    pytest.importorskip("openvino")
    bad = _failing()
    core = load_for_backend(checked, "core", cache=False)
    found = runtime_assertions(core.exported_program())
    assert {a.op for a in found} == {"aten::_assert_scalar.default"}
    # the retrace's own checks that a bool read as 0/1 is in [0, 1] hold whatever x holds: proved;
    # the check that every x > -10 (a value read from data) is not
    assert {a.fate for a in found} == {"kept", PROVED}
    assert any(a.checks == "True" and a.fate == PROVED for a in found)
    check = next(a for a in found if a.fate == "kept" and a.checks.startswith("Eq("))
    assert check.message.startswith("Runtime assertion failed for expression Eq(")
    assert "runtime assertions (" in core.report() and check.describe() in core.report()
    with pytest.raises(RuntimeError, match="Runtime assertion failed"):
        core(bad)
    for name in ("onnx", "openvino"):
        lp = load_for_backend(checked, backend=name, cache=False)
        fates = {a.node: a.fate for a in runtime_assertions(lp.exported_program(), lp.backend)}
        assert fates == {a.node: a.fate if a.fate == PROVED else f"dropped by {name}'s converter" for a in found}
        assert f"{check.node}: {check.checks} -- dropped by {name}'s converter" in lp.report()
        compiled = backends.to_backend(lp)
        torch.testing.assert_close(compiled(bad), torch.relu(bad) * 2, rtol=0, atol=0)  # dropped: runs


def test_an_assertion_the_declared_range_implies_is_proved_and_one_it_does_not_is_not(tmp_path):
    x = torch.randn(8, 3)
    ep = torch.export.export(ChecksSizes(), (x,), dynamic_shapes=({0: Dim.DYNAMIC},),
                             prefer_deferred_runtime_asserts_over_guards=True)
    (symbol, declared), = ep.range_constraints.items()
    assert (declared.lower, declared.upper) == (2, 64)  # the program checks its input against it
    with pytest.raises(AssertionError, match="<= 64"):
        ep.module()(torch.randn(66, 3))
    export_model(ep, path=tmp_path / "sizes.pt2b")
    lp = load_for_backend(tmp_path / "sizes.pt2b", backend="onnx", cache=False)
    fates = {a.checks: a.fate for a in runtime_assertions(lp.exported_program(), "onnx")}
    assert fates == {f"{symbol} <= 64": PROVED, f"Eq(Mod({symbol}, 2), 0)": "dropped by onnx's converter"}
    assert "1 proved for the declared input ranges, 1 dropped by onnx's converter" in lp.report()


def test_a_range_read_from_data_proves_nothing():
    """u0's recorded range [0, 63] is what the assertions on it establish: proving them from it
    would prove them from themselves. Only the input's declared range counts."""
    b = Dim("b", min=4, max=64)
    ep = torch.export.export(ReadsSize(), (torch.randn(8, 3), torch.tensor(2)), dynamic_shapes=({0: b}, None))
    u0 = next(s for s in ep.range_constraints if str(s).startswith("u"))
    assert (ep.range_constraints[u0].lower, ep.range_constraints[u0].upper) == (0, 63)
    fates = {a.checks: a.fate for a in runtime_assertions(ep)}
    assert fates[f"{u0} >= 0"] == fates[f"{u0} <= 63"] == "kept"
    assert len(fates) == 3 and set(fates.values()) == {"kept"}  # and u0 < b, which b's range cannot settle
    with pytest.raises(RuntimeError, match="Runtime assertion failed"):
        ep.module()(torch.randn(8, 3), torch.tensor(8))


@pytest.mark.slow
def test_inductor_keeps_each_assertion(checked, tmp_path):
    """AOTInductor generates code that raises for each runtime assertion it is handed (an AOTInductor compile)."""
    lp = load_for_backend(checked, backend="inductor", cache=False)
    assert {a.fate for a in runtime_assertions(lp.exported_program(), "inductor")} <= {"kept", PROVED}
    compiled = backends.to_backend(lp, package_path=str(tmp_path / "m.pt2"))
    x = torch.randn(3, 4)
    torch.testing.assert_close(compiled(x), ChecksTensor()(x))
    with pytest.raises(RuntimeError, match=r"Expected .* but received 0"):
        compiled(_failing())
