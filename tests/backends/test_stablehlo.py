"""StableHLO through torchax and JAX: the preset is torchax's own registry of ATen ops it lowers to JAX
with its own decompositions before torch's; the hand-off is torchax's StableHLO export run by JAX on the
CPU, checked against the lowered program, close to eager on the zoo and a small Llama at other sizes,
the buffers a program writes carried between calls; the module's own file runs with JAX alone. torchax
needs its own venv beside torch 2.13 (`pytest -m backends tests/backends/test_stablehlo.py` there)."""

from __future__ import annotations

import copy
import dataclasses
import subprocess
import sys

import pytest
import torch

pytest.importorskip("torchax.export")
pytest.importorskip("jax")

from exporter import backends, export_model, load_for_backend  # noqa: E402
from exporter.errors import BackendHandOffError, BackendResultError, BackendRunError  # noqa: E402

pytestmark = pytest.mark.backends
TOL = dict(rtol=1e-4, atol=1e-4)


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory):
    from tests.support.helpers import zoo_artifacts

    return zoo_artifacts(tmp_path_factory.mktemp("stablehlo"))


def _eager(case, args=None):
    with torch.no_grad():
        return copy.deepcopy(case.pristine)(*(case.args if args is None else args), **(case.kwargs or {}))


def test_the_op_list_and_decompositions_are_torchaxs_own():
    from torchax.decompositions import DECOMPOSITIONS
    from torchax.ops import all_aten_jax_ops

    from exporter.ops import op_name

    b = backends.get("stablehlo")
    import importlib.metadata as md

    assert b.key == f"stablehlo@{md.version('torchax')}+jax{md.version('jax')}"
    registered = all_aten_jax_ops()
    listed = set(b.supported_ops)
    assert len(listed) > 500 and "aten::addmm.default" in listed
    # a packet torchax registers is every overload of it; an op it runs through torch's dispatcher is none
    assert torch.ops.aten.addmm in registered and {op_name(getattr(torch.ops.aten.addmm, o))
                                                   for o in torch.ops.aten.addmm.overloads()} <= listed
    assert torch.ops.aten.add_ not in registered and "aten::add_.Tensor" not in listed
    expanded = set()
    for key in registered:
        if isinstance(key, torch._ops.OpOverload):
            expanded.add(op_name(key))
        elif isinstance(key, torch._ops.OpOverloadPacket):
            expanded.update(op_name(getattr(key, o)) for o in key.overloads())
    assert listed <= expanded and len(expanded - listed) < 10  # only the PrimTorch views left out
    assert set(b.decompositions()) == {op for op in DECOMPOSITIONS if isinstance(op, torch._ops.OpOverload)}


@pytest.mark.parametrize("name", ["mlp", "transformer_encoder", "kwargs_only", "inplace_ops", "cnn_bn",
                                  "multihead_attention"])
def test_the_zoo_runs_on_stablehlo_close_to_eager(artifacts, name):
    path, case = artifacts(name)
    lowered = load_for_backend(path, backend="stablehlo", cache=False)
    assert set(lowered.ops()) <= set(backends.get("stablehlo").supported_ops)
    compiled = backends.to_backend(lowered)
    assert compiled.validation.status == "passed" and compiled.validation.max_rel <= compiled.validation.bound
    assert "stablehlo" in compiled.native.mlir_module()  # the module JAX runs is StableHLO
    torch.testing.assert_close(compiled(*case.args, **(case.kwargs or {})), _eager(case), **TOL)


def test_two_dynamic_dims_stay_symbolic_at_other_sizes(artifacts):
    """torchax's own exporter gives each dynamic dim a symbolic scope of its own, which jax.export
    refuses for two of them; the hand-off makes one scope, and the program runs at other sizes."""
    from torchax.export import exported_program_to_stablehlo

    path, case = artifacts("dynamic_shapes")
    lowered = load_for_backend(path, backend="stablehlo", cache=False)
    with pytest.raises(ValueError, match="Invalid mixing of symbolic scopes"):
        exported_program_to_stablehlo(lowered.exported_program())
    compiled = backends.to_backend(lowered)
    torch.manual_seed(1)
    for b, n in ((7, 2), (2, 11)):
        args = (torch.randn(b, n, 4), torch.randn(b, 8))
        torch.testing.assert_close(compiled(*args), _eager(case, args), **TOL)


class _Valid(torch.nn.Module):
    """SigLIP's patch embedding (``padding="valid"``): a convolution whose padding is one element."""

    def __init__(self):
        super().__init__()
        self.patches, self.mix = torch.nn.Conv2d(3, 4, 2, stride=2, padding="valid"), torch.nn.Conv1d(4, 2, 3, padding=1)

    def forward(self, x):
        return self.mix(self.patches(x).flatten(2))


def test_a_one_element_convolution_padding_is_handed_over_in_full(tmp_path):
    """torchax widens padding [0] by writing into fx's immutable list; the hand-off writes it out."""
    from torchax.export import exported_program_to_stablehlo

    torch.manual_seed(0)
    model, x = _Valid().eval(), torch.randn(2, 3, 8, 8)
    export_model(model, (x,), tmp_path / "v.pt2b")
    lowered = load_for_backend(tmp_path / "v.pt2b", backend="stablehlo", cache=False)
    with pytest.raises(TypeError, match="'immutable_list' object does not support mutation"):
        exported_program_to_stablehlo(lowered.exported_program())
    with torch.no_grad():
        torch.testing.assert_close(backends.to_backend(lowered)(x), model(x), **TOL)


def test_a_small_llama_runs_at_another_batch_and_length(tmp_path):
    from tools.corpus.programs import capture_real
    from tools.corpus.transformers_zoo import make_case as make_real

    case = make_real("llama/causal-lm")
    pristine = copy.deepcopy(case.model)
    export_model(capture_real(case, {}), path=tmp_path / "m.pt2b")
    compiled = backends.to_backend(load_for_backend(tmp_path / "m.pt2b", backend="stablehlo", cache=False))
    assert compiled.validation.status == "passed"
    shorter = {k: v[:, :-3] if isinstance(v, torch.Tensor) and v.dim() == 2 else v for k, v in case.kwargs.items()}
    for kwargs in (case.kwargs, shorter):  # the sequence length is dynamic
        with torch.no_grad():
            want = pristine(**kwargs)
        torch.testing.assert_close(compiled(**kwargs)["logits"], want["logits"], rtol=1e-3, atol=1e-3)
    wider = {k: torch.cat([v, v]) if isinstance(v, torch.Tensor) and v.dim() == 2 else v for k, v in case.kwargs.items()}
    with pytest.raises(BackendRunError, match=r"the StableHLO module refused the call: ValueError: Shape mismatch"):
        compiled(**wider)  # the batch was exported static


def test_the_buffers_a_program_writes_carry_from_call_to_call(artifacts, tmp_path):
    """torchax's module returns none of the buffers a program writes: pt2b lifts them to inputs and
    outputs and carries them, so three calls give what three eager calls give."""
    from tests.support.helpers import buffers_carry_from_call_to_call

    path, case = artifacts("buffer_mutation")
    compiled, eager = buffers_carry_from_call_to_call("stablehlo", path, case)
    assert not compiled.backend.holds_state
    # its file takes the state after the user's inputs and returns the new state after the outputs
    import jax

    file = compiled.save(tmp_path / "s.jax_exported")
    with jax.enable_x64(True):
        y, count, ema = jax.export.deserialize(bytearray(open(file, "rb").read())).call(
            case.args[0].numpy(), compiled.state["count"].numpy(), compiled.state["ema"].numpy())
    want = eager(*case.args)
    assert int(count) == 4
    torch.testing.assert_close(torch.from_dlpack(y), want, **TOL)
    torch.testing.assert_close(torch.from_dlpack(ema), eager.ema, **TOL)


def test_a_wrong_result_is_caught_at_the_hand_off(artifacts, monkeypatch):
    path, case = artifacts("mlp")
    lowered = load_for_backend(path, backend="stablehlo", cache=False)
    real = backends.get("stablehlo")
    nudged = lambda *a, **k: real.run(*a, **k) * 1.01  # noqa: E731
    monkeypatch.setattr(backends, "_CACHE", {**backends._CACHE, "stablehlo": dataclasses.replace(real, run=nudged)})
    with pytest.raises(BackendResultError, match=r"stablehlo@.*: output.* differs from the lowered program's by "
                                                 r"[0-9.e-]+ \(relative\), beyond 0.001"):
        backends.to_backend(lowered)


def test_torchaxs_own_exporter_takes_the_lowered_program(artifacts):
    """pt2b's lowered program carries what torch's run_decompositions output carries, each input's
    tensor_meta included, which torchax's exporter reads."""
    from torchax.export import exported_program_to_stablehlo

    path, case = artifacts("mlp")
    weights, exported = exported_program_to_stablehlo(load_for_backend(path, backend="stablehlo", cache=False)
                                                      .exported_program())
    assert "stablehlo.dot_general" in exported.mlir_module()


def test_an_op_torchax_does_not_lower_is_a_typed_error(artifacts):
    """torch.export's own program, with a custom op nothing decomposes, handed over as it is."""
    path, case = artifacts("custom_op")
    ep = torch.export.export(case.pristine, case.args)
    with pytest.raises(BackendHandOffError, match=r"stablehlo@.* could not take the program: AssertionError: "
                                                  r"pt2b_zoo.scaled_add"):
        backends.to_backend("stablehlo", ep)


def test_its_file_runs_with_jax_alone_in_a_fresh_process(artifacts, tmp_path):
    path, case = artifacts("mlp")
    compiled = backends.to_backend(load_for_backend(path, backend="stablehlo", cache=False))
    file = compiled.save(tmp_path / f"m{compiled.backend.file_suffix}")
    import jax

    assert "batch" in str(jax.export.deserialize(bytearray(open(file, "rb").read())).in_avals[0].shape)
    x = torch.randn(9, 16)  # another batch: the file keeps the dim symbolic
    script = ("import sys, numpy as np, jax\n"
              "exp = jax.export.deserialize(bytearray(open(sys.argv[1], 'rb').read()))\n"
              "np.save(sys.argv[3], np.asarray(exp.call(np.load(sys.argv[2]))[0]))\n"
              "assert not any(m.startswith(('exporter', 'torch')) for m in sys.modules)\n")
    import numpy as np

    np.save(tmp_path / "x.npy", x.numpy())
    subprocess.run([sys.executable, "-c", script, file, tmp_path / "x.npy", tmp_path / "y.npy"], check=True,
                   capture_output=True)
    torch.testing.assert_close(torch.from_numpy(np.load(tmp_path / "y.npy")), _eager(case, (x,)), **TOL)


def test_the_program_s_writes_into_its_inputs_reach_the_caller(tmp_path):
    """Handed over with the writes lifted to outputs, which pt2b makes in the caller's tensors."""
    from tests.support.helpers import input_writes_reach_the_caller

    input_writes_reach_the_caller("stablehlo", tmp_path)


def test_a_tiny_llama_generates_token_for_token_what_transformers_generates(tmp_path):
    """Prefill and decode handed over on one state (the cache lifted, carried by pt2b): greedy tokens
    equal transformers' own generate()."""
    import pathlib

    from tests.support.helpers import generates_what_transformers_generates

    # once torchax is imported, torch.export's strict capture of the decoder fails ("PyTorch is not linked
    # with support for jax devices"): the artifact is exported by an interpreter that has not imported it
    root = pathlib.Path(__file__).resolve().parents[2]
    subprocess.run([sys.executable, "-c", "import sys; from tests.support.helpers import export_decoder_case; "
                    "export_decoder_case(sys.argv[1])", str(tmp_path / "llama.pt2b")], check=True, cwd=root,
                   capture_output=True, timeout=600)
    generates_what_transformers_generates(("stablehlo",), tmp_path, exported=True)
