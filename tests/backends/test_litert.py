"""LiteRT through litert-torch: the preset is litert-torch's own registry of ATen ops it lowers with its own
decompositions; the hand-off is its conversion to a TFLite flatbuffer, run by ai-edge-litert's
interpreter, checked against the lowered program, close to eager on the zoo and a small Llama; static
shapes only (a dynamic program is specialized on request); the buffers a program writes carried between
calls; the .tflite file runs with ai-edge-litert alone. litert-torch needs its own venv beside torch 2.13
(`pytest -m backends tests/backends/test_litert.py` there)."""

from __future__ import annotations

import copy
import dataclasses
import subprocess
import sys

import pytest
import torch

pytest.importorskip("litert_torch.backend.lowerings")
pytest.importorskip("ai_edge_litert.interpreter")

from exporter import backends, export_model, load_for_backend  # noqa: E402
from exporter.errors import BackendHandOffError, BackendResultError, BackendRunError, OpsetError  # noqa: E402

pytestmark = pytest.mark.backends
TOL = dict(rtol=1e-4, atol=1e-4)


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory):
    from tests.support.helpers import zoo_artifacts

    return zoo_artifacts(tmp_path_factory.mktemp("litert"))


def _eager(case, args=None):
    with torch.no_grad():
        return copy.deepcopy(case.pristine)(*(case.args if args is None else args), **(case.kwargs or {}))


def test_the_op_list_and_decompositions_are_litert_torchs_own():
    import importlib.metadata as md

    from litert_torch.backend.lowerings import registry
    from litert_torch.fx_infra import decomp

    from exporter.ops import op_name

    b = backends.get("litert")
    assert b.key == f"litert@{md.version('litert-torch')}+litert{md.version('ai-edge-litert')}"
    registered = {op_name(op) for op in registry.global_registry.registered_ops
                  if isinstance(op, torch._ops.OpOverload)}
    listed = set(b.supported_ops)
    assert len(listed) > 400 and listed <= registered
    assert {"aten::mm.default", "aten::convolution.default", "aten::_softmax.default"} <= listed
    # TorchScript's overloads of a registered packet, which no dispatcher registers, are left out
    assert "aten::acos.Scalar" in registered and "aten::acos.Scalar" not in listed
    assert not b.holds_state and b.takes_lifted_state and b.file_suffix == ".tflite"
    table = {**decomp.pre_convert_decomp(), **decomp.pre_lower_decomp()}
    assert set(b.decompositions()) == set(table) - {torch.ops.aten._safe_softmax.default}


@pytest.mark.parametrize("name", ["mlp", "cnn_bn", "transformer_encoder", "multihead_attention", "kwargs_only",
                                  "dynamic_shapes", "tied_weights", "inplace_ops"])
def test_the_zoo_runs_on_litert_close_to_eager(artifacts, name):
    path, case = artifacts(name)
    lowered = load_for_backend(path, backend="litert", cache=False)
    assert lowered.lowered_for == backends.get("litert").key  # the lowering record names litert-torch's version
    assert set(lowered.ops()) <= set(backends.get("litert").supported_ops) | {"aten::_assert_tensor_metadata.default"}
    compiled = backends.to_backend(lowered, specialize=True)
    assert compiled.validation.status == "passed" and compiled.validation.max_rel <= compiled.validation.bound
    assert compiled.native[4:8] == b"TFL3"  # the flatbuffer's file identifier
    torch.testing.assert_close(compiled(*case.args, **(case.kwargs or {})), _eager(case), **TOL)


def test_a_dynamic_program_is_refused_unless_specialized(artifacts):
    """The converter takes static shapes only: the dynamic dims are named, and specialize=True converts
    the program at its example inputs' sizes, which the compiled model then takes alone."""
    path, case = artifacts("dynamic_shapes")
    lowered = load_for_backend(path, backend="litert", cache=False)
    with pytest.raises(BackendHandOffError, match=r"static shapes only, and the program's inputs have dynamic dims "
                                                  r"x\[0\] \(s\d+\), x\[1\] \(s\d+\), y\[0\] \(s\d+\): "
                                                  r"to_backend\(\.\.\., specialize=True\)"):
        backends.to_backend(lowered)
    compiled = backends.to_backend(lowered, specialize=True)
    x, y = case.args
    with pytest.raises(BackendRunError, match=r"the LiteRT model's input 'x' is \(\d+, \d+, 4\) and the call gives "
                                              r"\(7, 2, 4\): the model was converted at static sizes"):
        compiled(torch.randn(7, 2, 4), torch.randn(7, 8))


def test_litert_torchs_safe_softmax_gives_nan_where_torch_gives_zero():
    """litert-torch's table decomposes _safe_softmax as softmax: a fully masked row is NaN, not torch's 0.
    The preset leaves that entry out (torch's own decomposition applies)."""
    from litert_torch.fx_infra import decomp

    x = torch.tensor([[0.5, -1.0, 2.0], [float("-inf")] * 3])
    theirs = decomp.pre_convert_decomp()[torch.ops.aten._safe_softmax.default](x, -1)
    want = torch.ops.aten._safe_softmax(x, -1)
    assert want[1].eq(0).all() and theirs[1].isnan().all()
    torch.testing.assert_close(theirs[0], want[0])
    assert torch.ops.aten._safe_softmax.default not in backends.get("litert").decompositions()


class Accumulates(torch.nn.Module):
    """index_put accumulating (``x[idx] += v``, index_add) and scatter_add, with repeated and negative indices."""

    def forward(self, x, idx, index):
        y = x.index_put((idx,), torch.arange(idx.shape[0] * x.shape[1], dtype=x.dtype).view(-1, x.shape[1]),
                        accumulate=True)
        return y.scatter_add(1, index, torch.full(index.shape, 2.0)).index_add(0, idx[:2], torch.ones(2, x.shape[1]))


def test_a_scatter_add_runs_without_the_scatter_litert_refuses(tmp_path, monkeypatch):
    """The converter makes every scatter-add a STABLEHLO_SCATTER whose add the TFLite runtime refuses;
    the hand-off computes them with one-hot sums instead, repeated indices summed as torch sums them."""
    from exporter.backends import litert

    args = (torch.randn(4, 6), torch.tensor([0, 2, 0, -1]), torch.tensor([[0, 5, 5], [1, 1, 0]]))
    export_model(Accumulates(), args, tmp_path / "a.pt2b")
    lowered = load_for_backend(tmp_path / "a.pt2b", backend="litert", cache=False)
    assert {"aten::index_put.default", "aten::scatter_add.default"} <= set(lowered.ops())
    compiled = backends.to_backend(lowered)
    torch.testing.assert_close(compiled(*args), Accumulates()(*args), **TOL)
    monkeypatch.setattr(litert, "_SUMMED", {})  # litert-torch's own conversion of the same program
    with pytest.raises(BackendHandOffError, match=r"litert@.* could not take the program: RuntimeError: Only update, "
                                                  r"Add, Multiply, Maximum and Minimum operations are currently "
                                                  r"supported for stablehlo.scatter"):
        backends.to_backend(lowered)


def _llama(tmp_path):
    from tests.support.helpers import tiny_llama

    model, ids, mask = tiny_llama(padded=2)  # left padding: the padded rows attend to nothing
    export_model(model, (), tmp_path / "llama.pt2b", kwargs={"input_ids": ids, "attention_mask": mask})
    return model, tmp_path / "llama.pt2b"


def test_a_small_left_padded_llama_runs_close_to_eager(tmp_path):
    """With litert-torch's own _safe_softmax the lowering is wrong on the padded rows (the lowering's own
    check finds it); with the preset's table it runs, its int64 inputs narrowed to int32 by the
    converter and fed so."""
    from litert_torch.fx_infra import decomp

    model, path = _llama(tmp_path)
    theirs = {torch.ops.aten._safe_softmax.default: decomp.pre_convert_decomp()[torch.ops.aten._safe_softmax.default]}
    with pytest.raises(OpsetError, match="nan/inf where the op has a number"):
        load_for_backend(path, backend="litert", cache=False, decompositions=theirs)
    compiled = backends.to_backend(load_for_backend(path, backend="litert", cache=False))
    assert compiled.validation.status == "passed"
    import numpy as np

    assert [d["dtype"] for d in compiled.plan.get_input_details()] == [np.int32, np.int32]
    torch.manual_seed(1)
    ids, mask = torch.randint(0, 64, (2, 7)), torch.ones(2, 7, dtype=torch.long)
    mask[0, :3] = 0
    with torch.no_grad():
        want = model(input_ids=ids, attention_mask=mask).logits
    torch.testing.assert_close(compiled(input_ids=ids, attention_mask=mask).logits, want, **TOL)


def test_a_wrong_result_is_caught_at_the_hand_off(artifacts, monkeypatch):
    path, case = artifacts("kwargs_only")
    lowered = load_for_backend(path, backend="litert", cache=False)
    real = backends.get("litert")
    nudged = lambda *a, **k: real.run(*a, **k) * 1.01  # noqa: E731
    monkeypatch.setattr(backends, "_CACHE", {**backends._CACHE, "litert": dataclasses.replace(real, run=nudged)})
    with pytest.raises(BackendResultError, match=r"litert@.*: output.* differs from the lowered program's by "
                                                 r"[0-9.e-]+ \(relative\), beyond 0.001"):
        backends.to_backend(lowered)


def test_the_buffers_a_program_writes_carry_from_call_to_call(artifacts):
    """The lowering returns none of the buffers a program writes: pt2b lifts them to inputs and outputs
    and carries them (the int64 counter narrowed to int32 by the converter, cast back)."""
    from tests.support.helpers import buffers_carry_from_call_to_call

    path, case = artifacts("buffer_mutation")
    compiled, _ = buffers_carry_from_call_to_call("litert", path, case)
    assert compiled.state["count"].dtype == torch.int64
    names = [d["name"] for d in compiled.plan.get_signature_runner().get_input_details().values()]
    assert sorted(compiled.plan.get_signature_list()["serving_default"]["inputs"]) == ["state.count", "state.ema", "x"]
    assert len(names) == 3


def test_the_program_s_writes_into_its_inputs_reach_the_caller(tmp_path):
    """Handed over with the writes lifted to outputs, which pt2b makes in the caller's tensors."""
    from tests.support.helpers import input_writes_reach_the_caller

    input_writes_reach_the_caller("litert", tmp_path)


def test_an_op_litert_does_not_lower_is_a_typed_error(artifacts):
    """torch.cond, which litert-torch has no lowering for, kept by the lowering as it is."""
    path, case = artifacts("cond")
    with pytest.raises(BackendHandOffError, match=r"litert@.* could not take the program: RuntimeError: Lowering "
                                                  r"not found: cond"):
        backends.to_backend(load_for_backend(path, backend="litert", cache=False))


def test_its_file_runs_with_ai_edge_litert_alone_in_a_fresh_process(artifacts, tmp_path):
    path, case = artifacts("mlp")
    compiled = backends.to_backend(load_for_backend(path, backend="litert", cache=False), specialize=True)
    file = compiled.save(tmp_path / f"m{compiled.backend.file_suffix}")
    (x,) = case.args
    import numpy as np

    np.save(tmp_path / "x.npy", x.numpy())
    script = ("import sys, numpy as np\n"
              "from ai_edge_litert.interpreter import Interpreter\n"
              "runner = Interpreter(model_path=sys.argv[1]).get_signature_runner('serving_default')\n"
              "out = runner(x=np.load(sys.argv[2]))\n"
              "assert list(out) == ['output_0'], list(out)\n"
              "np.save(sys.argv[3], out['output_0'])\n"
              "assert not any(m.startswith(('exporter', 'torch', 'litert_torch')) for m in sys.modules)\n")
    subprocess.run([sys.executable, "-c", script, file, tmp_path / "x.npy", tmp_path / "y.npy"], check=True,
                   capture_output=True, timeout=120)
    torch.testing.assert_close(torch.from_numpy(np.load(tmp_path / "y.npy")), _eager(case), **TOL)


def test_a_tiny_llama_generates_token_for_token_what_transformers_generates(tmp_path):
    """Prefill and decode handed over on one state (the cache lifted, carried by pt2b): greedy tokens
    equal transformers' own generate()."""
    from tests.support.helpers import generates_what_transformers_generates

    generates_what_transformers_generates(("litert",), tmp_path)
