"""load_for_backend(..., fallback="reference"): an op no decomposition brings to the backend's list stays in
the lowering, reported, instead of being an OpsetError; to_backend then runs it on the reference and the
rest on the backend. Without the fallback the OpsetError stays and names it; the cache keys the two apart."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from torch import nn
from torch.export import Dim

from exporter import backends, export_model, load_for_backend
from exporter._torch.pytree import pytree
from exporter.errors import BackendHandOffError, LoweringError, OpsetError

# what onnx's list lacks and no decomposition reaches: mode itself, and the prim erfinv decomposes to
LEFT = {"aten::mode.default": 1, "prims::erf_inv.default": 1}


class Cumulative(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x):
        values, _ = torch.mode(self.lin(x), dim=1, keepdim=True)
        return values.relu() + torch.special.erfinv(torch.tanh(x) * 0.5)


@pytest.fixture(scope="module")
def cumulative(tmp_path_factory):
    """The model, exported; the tests that take it hand it to onnx (skipped where it is not installed)."""
    pytest.importorskip("onnxscript")
    pytest.importorskip("onnxruntime")
    torch.manual_seed(0)
    model = Cumulative().eval()
    path = tmp_path_factory.mktemp("fallback_lowering") / "cum.pt2b"
    export_model(model, (torch.randn(5, 4),), path, dynamic_shapes=({0: Dim("rows", min=2, max=64)},))
    return path, model


def _plain_tensors_only(real):
    """``real`` whose runtime refuses a tensor subclass, as ExecuTorch's does ("Unsupported python type
    Parameter")."""
    def run(native, program, args, kwargs, **extra):
        bad = [type(a).__name__ for a in pytree.tree_leaves((args, kwargs))
               if isinstance(a, torch.Tensor) and type(a) is not torch.Tensor]
        if bad:
            raise RuntimeError(f"Unsupported python type {bad[0]}")
        return real.run(native, program, args, kwargs, **extra)

    return dataclasses.replace(real, run=run)


def test_without_fallback_the_opset_error_names_the_ops_and_the_fallback(cumulative):
    path, _ = cumulative
    with pytest.raises(OpsetError) as e:
        load_for_backend(path, backend="onnx", cache=False)
    msg = str(e.value)
    assert "2 op(s) cannot reach the accepted op set" in msg
    assert "aten::mode.default (1 call sites)" in msg and "prims::erf_inv.default (1 call sites)" in msg
    assert "The installed onnx converts none of them (its list is read from the package" in msg
    assert "Add them to supported_ops" not in msg  # (a backend's list is not the user's to extend)
    assert msg.endswith("or keep them; or lower with fallback='reference' to leave them to the reference runtime "
                        "beside the backend (to_backend(..., fallback='reference') runs them there, the rest on "
                        "the backend).")


def test_a_fallback_lowering_leaves_the_ops_and_the_backend_runs_the_rest(cumulative, monkeypatch):
    path, model = cumulative
    lowered = load_for_backend(path, backend="onnx", cache=False, fallback="reference")
    assert lowered.fallback == "reference" and lowered.outside_opset == LEFT
    assert lowered.lowered_for.endswith("+fallback") and lowered.validation.status == "passed"
    assert {op: lowered.ops()[op] for op in LEFT} == LEFT  # (everything else decomposed to onnx's list)
    assert all(op in LEFT or op in lowered.supported for op in lowered.ops())
    report = lowered.report()
    assert "outside the declared opset (2), left for the reference (fallback='reference'):" in report
    assert lowered.explain("aten::mode").endswith(
        "no decomposition exists for it; left for the reference: to_backend(..., fallback='reference') runs it there")
    # the lowering's fallback is to_backend's default; the runtime takes plain tensors only, as ExecuTorch's
    monkeypatch.setitem(backends._CACHE, "onnx", _plain_tensors_only(backends.get("onnx")))
    compiled = backends.to_backend(lowered)
    share = compiled.share
    ops = sum(lowered.ops().values())
    assert share.on_reference == LEFT and (share.nodes, share.backend_nodes) == (ops, ops - 2)
    assert share.flops > 0 and share.backend_flops == share.flops and share.wrong == () and share.refused == ()
    assert compiled.validation.status == "passed"
    for rows in (5, 9, 2):  # (a dynamic dim: the parts take other sizes too)
        x = torch.randn(rows, 4)
        torch.testing.assert_close(compiled(x), model(x), rtol=1e-5, atol=1e-5)


def test_the_cache_keys_a_fallback_lowering_apart(tmp_path, cache_dir):
    torch.manual_seed(0)
    export_model(nn.Sequential(nn.Linear(4, 4), nn.ReLU()).eval(), (torch.randn(3, 4),), tmp_path / "mlp.pt2b")
    export_model(Cumulative().eval(), (torch.randn(3, 4),), tmp_path / "cum.pt2b")
    listed = ["aten::linear.default", "aten::relu.default", "aten::add.Tensor", "aten::mul.Tensor",
              "aten::tanh.default"]  # (a backend's own list: mode and erf_inv not in it)
    plain = load_for_backend(tmp_path / "mlp.pt2b", supported_ops=listed)
    with_fallback = load_for_backend(tmp_path / "mlp.pt2b", supported_ops=listed, fallback="reference")
    assert plain.fingerprint != with_fallback.fingerprint
    assert not with_fallback.from_cache and with_fallback.fallback == "reference" and plain.fallback is None
    assert load_for_backend(tmp_path / "mlp.pt2b", supported_ops=listed).from_cache
    left = {"aten::mode.default": 1, "prims::erf_inv.default": 1}
    first = load_for_backend(tmp_path / "cum.pt2b", supported_ops=listed, fallback="reference")
    again = load_for_backend(tmp_path / "cum.pt2b", supported_ops=listed, fallback="reference")
    assert (first.from_cache, again.from_cache) == (False, True)
    assert again.fallback == "reference" and again.outside_opset == left == first.outside_opset
    x = torch.randn(3, 4)
    assert torch.equal(again(x), first(x))
    with pytest.raises(OpsetError, match="cannot reach the accepted op set"):  # not served the fallback's entry
        load_for_backend(tmp_path / "cum.pt2b", supported_ops=listed)


def test_a_fallback_pt2b_does_not_know_or_without_a_backend_is_a_clear_error(cumulative):
    path, _ = cumulative
    with pytest.raises(LoweringError, match=r"^fallback='runtime_ref': pt2b falls back on 'reference'"):
        load_for_backend(path, backend="onnx", fallback="runtime_ref")
    with pytest.raises(LoweringError, match=r"^fallback='reference' leaves what a backend cannot take to the "
                                            r"reference beside it: lower with backend=NAME or supported_ops"):
        load_for_backend(path, "core", fallback="reference")


def test_pt2b_lower_and_run_take_fallback(cumulative, capsys, tmp_path):
    from exporter import cli

    path, _ = cumulative
    assert cli.main(["lower", str(path), "--backend", "onnx", "--no-cache"]) != 0
    assert "or lower with fallback='reference'" in capsys.readouterr().err
    assert cli.main(["lower", str(path), "--backend", "onnx", "--fallback", "reference", "--no-cache"]) == 0
    out = capsys.readouterr().out
    assert "left for the reference (fallback='reference'):" in out and "aten::mode.default" in out
    assert cli.main(["lower", str(path), "--to", "onnx", "-o", str(tmp_path / "m.onnx"), "--fallback",
                     "reference", "--no-cache"]) != 0
    assert "cannot hold a program split with the reference: drop --fallback" in capsys.readouterr().err
    assert not (tmp_path / "m.onnx").exists()
    assert cli.main(["run", str(path), "--backend", "onnx", "--fallback", "reference", "--no-cache"]) == 0
    out = capsys.readouterr().out
    assert "hand-off validation passed" in out
    assert "the reference runs aten::mode.default x1, prims::erf_inv.default x1" in out


def test_the_matrix_lowers_again_with_fallback_only_where_ops_cannot_reach_the_list():
    from tools import backend_matrix as bm

    refused = {"status": "fail", "error_type": "OpsetError",
               "error": "lowering with onnx@x: 1 op(s) cannot reach the accepted op set:\n  aten::mode.default"}
    assert bm.lowered_again_with_fallback(refused)
    assert not bm.lowered_again_with_fallback({"status": "ok"})
    assert not bm.lowered_again_with_fallback(dict(refused, error_type="LoweringError"))
    assert not bm.lowered_again_with_fallback(dict(refused, error="lowering with onnx@x: the decomposition of "
                                                                  "aten::x makes the program wrong"))


def test_to_backend_refuses_an_unknown_fallback_as_before(cumulative):
    path, _ = cumulative
    lowered = load_for_backend(path, backend="onnx", cache=False, fallback="reference")
    with pytest.raises(BackendHandOffError, match=r"^fallback='ref': pt2b falls back on 'reference'"):
        backends.to_backend(lowered, fallback="ref")


class MostFrequent(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, x):
        values, indices = torch.mode(self.lin(x), dim=-1)
        return values.relu() * 2, indices


def test_executorch_runs_a_model_with_mode_with_the_mode_on_the_reference(tmp_path):
    """ExecuTorch's portable kernels have no mode, and nothing decomposes it: the lowering leaves it."""
    pytest.importorskip("executorch.extension.pybindings.portable_lib")
    torch.manual_seed(0)
    model = MostFrequent().eval()
    export_model(model, (torch.randn(3, 8),), tmp_path / "mode.pt2b")
    with pytest.raises(OpsetError, match=r"aten::mode.default \(1 call sites\): no decomposition reaches"):
        load_for_backend(tmp_path / "mode.pt2b", backend="executorch", cache=False)
    lowered = load_for_backend(tmp_path / "mode.pt2b", backend="executorch", cache=False, fallback="reference")
    assert lowered.outside_opset == {"aten::mode.default": 1}
    compiled = backends.to_backend(lowered)
    share = compiled.share
    assert share.on_reference == {"aten::mode.default": 1} and share.backend_nodes == share.nodes - 1
    assert compiled.validation.status == "passed"
    x = torch.randn(3, 8)
    (values, indices), (want_values, want_indices) = compiled(x), model(x)
    torch.testing.assert_close(values, want_values, rtol=1e-5, atol=1e-5)
    assert torch.equal(indices, want_indices)
