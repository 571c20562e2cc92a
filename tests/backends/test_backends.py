"""Issue 38: a backend lowers with its own op list, read from the installed backend, and a foreign op list
is taken as it comes (names this torch lacks left out and reported, refused only with strict=True)."""

from __future__ import annotations

import warnings

import pytest
import torch

from exporter import backends, export_model, load_for_backend
from exporter.cli import main as cli_main
from exporter.errors import BackendHandOffError, BackendUnavailableError, LoweringError, OpsetError, UnknownOpsWarning
from exporter.lowering import tables
from exporter.lowering.plan import plan_lowering
from exporter.ops import op_name
from tools.corpus.zoo import make_case
from runtime_ref import Runtime


def _inductor_registry() -> set[str]:
    from torch._inductor.lowering import fallbacks, lowerings

    return {op.name() for op in (*lowerings, *fallbacks) if isinstance(op, torch._ops.OpOverload)}


def _names(ops) -> set[str]:
    """'aten::add.Tensor' from either spelling of an overload name ('aten::add' is its default)."""
    return {n if "." in n.partition("::")[2] else n + ".default" for n in ops}


@pytest.fixture(scope="module")
def cnn(tmp_path_factory):
    case = make_case("cnn_bn")
    path = tmp_path_factory.mktemp("backends") / "cnn.pt2b"
    export_model(case.model, case.args, path)
    return path, case


def test_the_inductor_backend_is_inductors_own_registry():
    b = backends.get("inductor")
    assert b.name == "inductor" and b.version == torch.__version__.split("+")[0]
    # Inductor's registry, less the PrimTorch views no hand-off can be given (backends.retraceable)
    views = {op_name(op) for op in tables.view_prims_via_aten()}
    assert "prims::broadcast_in_dim.default" in _names(_inductor_registry()) & views
    assert set(b.supported_ops) == _names(_inductor_registry()) - views
    assert {"aten::convolution.default", "aten::add.Tensor", "aten::add.int"} <= set(b.supported_ops)
    assert backends.get("inductor") is b  # read once a process


class _ChecksAnyTrue(torch.nn.Module):
    """Calls an op Inductor has no lowering for and no decomposition reaches (aten::_is_any_true, the
    sibling of the aten::_is_all_true that `torch._check` of a tensor records, which pt2b decomposes)."""

    def forward(self, x):
        return x * torch.ops.aten._is_any_true(x > -10).to(x.dtype)


def test_an_op_without_a_decomposition_falls_back_on_inductor_as_inductor_does(tmp_path):
    """Inductor runs an op it cannot lower by its ATen kernel (config.implicit_fallbacks, on by
    default): the inductor preset keeps such an op and hands it over; the same op list given as
    supported_ops, without the fallback, still refuses it, naming it."""
    x = torch.randn(3, 4)
    export_model(_ChecksAnyTrue(), (x,), tmp_path / "m.pt2b")
    assert torch._inductor.config.implicit_fallbacks and backends.get("inductor").falls_back_to_aten
    assert "aten::_is_any_true.default" not in backends.get("inductor").supported_ops
    lp = load_for_backend(tmp_path / "m.pt2b", backend="inductor", cache=False)
    assert lp.ops().get("aten::_is_any_true.default") == 1 and "taken as it is" in lp.description
    torch.testing.assert_close(lp(x), x)
    with pytest.raises(OpsetError, match=r"aten::_is_any_true\.default \(1 call sites\): no decomposition reaches"):
        load_for_backend(tmp_path / "m.pt2b", supported_ops=sorted(backends.get("inductor").supported_ops),
                         cache=False)


def test_load_for_backend_with_the_inductor_preset(cnn):
    path, case = cnn
    with warnings.catch_warnings():
        warnings.simplefilter("error", UnknownOpsWarning)  # the backend's own list: no warning for its extras
        lp = load_for_backend(path, backend="inductor", cache=False)
    b = backends.get("inductor")
    assert lp.lowered_for == b.key and lp.backend == "inductor" and "inductor's own ops" in lp.description
    assert set(lp.ops()) <= set(b.supported_ops), set(lp.ops()) - set(b.supported_ops)
    assert "aten::add.int" in lp.unknown_supported_ops  # TorchScript-only: no dispatcher entry
    assert "left out" in lp.report()
    with torch.no_grad():
        want = case.model(*case.args)
        torch.testing.assert_close(lp(*case.args), want)
        torch.testing.assert_close(Runtime(lp)(*case.args), want)


def test_the_backend_and_its_version_key_the_lowering():
    plan = plan_lowering(backend=backends.get("inductor"))
    assert f'"backend": "{backends.get("inductor").key}"' in plan.fingerprint
    assert plan.fingerprint != plan_lowering(supported_ops=list(backends.get("inductor").supported_ops)).fingerprint
    with pytest.raises(LoweringError, match="brings its own op list: pass supported_ops or backend, not both"):
        plan_lowering(backend=backends.get("inductor"), supported_ops=["aten::add.Tensor"])


@pytest.fixture(scope="module")
def encoder(tmp_path_factory):
    case = make_case("transformer_encoder")
    path = tmp_path_factory.mktemp("backends") / "encoder.pt2b"
    export_model(case.model, case.args, path, kwargs=case.kwargs, dynamic_shapes=case.dynamic_shapes)
    return path, case


def test_a_foreign_op_list_lowers_and_names_what_this_torch_lacks(encoder):
    """Inductor's lowerings + fallbacks as a user would pass them: 278-odd TorchScript-only overloads
    (aten::add.int, aten::__and__.bool) were a LoweringError; they are left out with one warning."""
    path, case = encoder
    foreign = sorted(_inductor_registry()) + ["aten::frobnicate.default"]
    with pytest.warns(UnknownOpsWarning, match=r"supported_ops names \d+ op\(s\) this torch .* does not have, left "
                                               r"out: .*aten::__and__.bool"):
        lp = load_for_backend(path, supported_ops=foreign, cache=False)
    assert {"aten::add.int", "aten::frobnicate.default"} <= set(lp.unknown_supported_ops)
    assert not set(lp.unknown_supported_ops) & set(lp.ops())
    with torch.no_grad():
        torch.testing.assert_close(lp(*case.args), case.model(*case.args), rtol=1e-5, atol=1e-5)
    with warnings.catch_warnings():  # the user's own filter makes them an error
        warnings.simplefilter("error", UnknownOpsWarning)
        with pytest.raises(UnknownOpsWarning, match=r"supported_ops names \d+ op\(s\) this torch .* does not have"):
            load_for_backend(path, supported_ops=foreign, cache=False)


def test_the_backend_preset_brings_the_decompositions_the_backend_applies(cnn):
    """Inductor lowers eval batch norm with its own decomposition of _native_batch_norm_legit_no_training
    (torch's registered one writes in place, which pt2b does not apply): the bare op list cannot reach
    Inductor's ops from it, the backend's preset can."""
    path, _ = cnn
    with pytest.warns(UnknownOpsWarning), pytest.raises(OpsetError, match="_native_batch_norm_legit_no_training"):
        load_for_backend(path, supported_ops=sorted(_inductor_registry()), cache=False)
    assert "aten::_native_batch_norm_legit_no_training.default" not in load_for_backend(path, backend="inductor", cache=False).ops()


def test_an_unknown_or_missing_backend_is_a_clear_error(cnn, monkeypatch):
    path, _ = cnn
    with pytest.raises(BackendUnavailableError, match=r"unknown backend 'onnxx'; Did you mean 'onnx'\? pt2b knows "
                                                      r"inductor, onnx, openvino"):
        load_for_backend(path, backend="onnxx")
    with pytest.raises(LoweringError, match=r"unknown preset 'onnxx'; Did you mean backend='onnx'"):
        load_for_backend(path, "onnxx")
    with pytest.raises(BackendUnavailableError, match="unknown backend 'onnxx'"):
        backends.get("onnxx")
    from exporter.backends import inductor

    def missing():
        raise ImportError("No module named 'fakebackend'")

    monkeypatch.setitem(backends.ADAPTERS, "fake", ("inductor", "pt2b[fake]"))
    monkeypatch.setattr(inductor, "backend", missing)
    with pytest.raises(BackendUnavailableError, match=r"backend 'fake' is not installed here .*: pip install pt2b\[fake\]"):
        backends.get("fake")


def test_pt2b_lower_takes_a_backend_preset(cnn, capsys):
    path, _ = cnn
    assert cli_main(["lower", str(path), "--preset", "inductor"]) == 0
    assert backends.get("inductor").key in capsys.readouterr().out


@pytest.mark.slow
def test_inductor_hand_off_compiles_and_runs(cnn, tmp_path):
    """AOTInductor compiles the lowered program into a package that runs close to eager (minutes on 2 cores)."""
    path, case = cnn
    lp = load_for_backend(path, backend="inductor", cache=False)
    compiled = backends.to_backend("inductor", lp, package_path=str(tmp_path / "cnn.pt2"))
    assert compiled.native == str(tmp_path / "cnn.pt2")
    with torch.no_grad():
        torch.testing.assert_close(compiled(*case.args), case.model(*case.args))


def test_a_program_is_handed_to_the_backend_it_was_lowered_for(cnn):
    """to_backend(lowered) takes the backend from the lowering; naming another one, or none for a program
    lowered with a preset, is a BackendHandOffError before any backend work."""
    path, _ = cnn
    lowered = load_for_backend(path, backend="inductor", cache=False)
    assert lowered.backend == "inductor" and lowered.preset is None and lowered.lowered_for.startswith("inductor@")
    with pytest.raises(BackendHandOffError, match=r"lowered to inductor's own op list, not onnx's: hand it to "
                                                  r"inductor, or lower it with backend='onnx'"):
        backends.to_backend("onnx", lowered)
    core = load_for_backend(path, "core", cache=False)
    assert core.backend is None and core.preset.startswith("core@")
    with pytest.raises(BackendHandOffError, match=r"not lowered for a backend .* to_backend\('onnx', program\)"):
        backends.to_backend(core)
    with pytest.raises(LoweringError, match=r"backend='inductor' brings its own op list: do not pass preset='max'"):
        load_for_backend(path, "max", backend="inductor")
