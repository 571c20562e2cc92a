"""Issue 38: ONNX (torch.onnx + onnxruntime) and OpenVINO take pt2b's lowering with their own preset,
read from the installed backend; the hand-off runs close to eager on the zoo and on real models, at
other shapes where the program is dynamic; a backend's failure is a typed error naming it."""

from __future__ import annotations

import copy
import dataclasses
import subprocess
import sys

import pytest
import torch

from exporter import backends, export_model, load_for_backend
from exporter.errors import BackendHandOffError, BackendResultError, BackendRunError, OpsetError
from exporter.ops import op_name

pytest.importorskip("onnxruntime")
pytest.importorskip("onnxscript")
pytest.importorskip("openvino")

TOL = dict(rtol=1e-4, atol=1e-4)


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory):
    from tests.support.helpers import zoo_artifacts

    return zoo_artifacts(tmp_path_factory.mktemp("handoff"))


def _eager(case, args=None, kwargs=None):
    """Eager from the model's state at export: the backends run the program as a function of its inputs,
    a buffer the model updates starting from its exported value at every call."""
    with torch.no_grad():
        return copy.deepcopy(case.pristine)(*(case.args if args is None else args), **(case.kwargs if kwargs is None else kwargs) or {})


def test_the_onnx_backend_is_torchlibs_registry():
    from torch.onnx._internal.exporter import _registration

    from exporter.lowering import tables

    b = backends.get("onnx")
    registry = {op_name(m.fx_target) for metas in _registration.ONNXRegistry.from_torchlib().functions.values()
                for m in metas if isinstance(m.fx_target, torch._ops.OpOverload)}
    views = {op_name(op) for op in tables.view_prims_via_aten()}  # never handed over (backends.retraceable)
    assert registry - views <= set(b.supported_ops) and not views & set(b.supported_ops)
    assert {"aten::convolution.default", "aten::abs.default", "aten::scaled_dot_product_attention.default"} <= registry
    assert b.version.startswith(__import__("onnxscript").__version__)


def test_the_openvino_preset_is_convert_models_own_table():
    """convert_model decomposes with torch's default table minus ops_to_not_decompose(): the preset is
    that table, and an op OpenVINO translates itself (linear, silu) stays undecomposed."""
    from openvino.frontend.pytorch.torchdynamo.export_decompositions import ops_to_not_decompose

    b = backends.get("openvino")
    assert b.takes_what_its_table_leaves
    from exporter.lowering.tables import torch_default_table

    table = b.decompositions()
    # torch's default table as pt2b gathers it, once a process (ops a later import registers join a fresh
    # torch.export.default_decompositions(), not the table every lowering in the process used)
    default = torch_default_table()
    kept = [op for op in ops_to_not_decompose() if op in default]
    assert kept and not set(kept) & set(table)
    assert set(table) == {op for op in default if op not in set(ops_to_not_decompose())}
    assert {op_name(op) for op in kept} <= set(b.supported_ops)


# the zoo through each backend: the case, and a second call with other sizes where the program is dynamic
ZOO = ["mlp", "cnn_bn", "transformer_encoder", "kwargs_only", "pytree_io", "buffer_mutation", "dynamic_shapes",
       "multihead_attention", "lstm"]
STATEFUL = {"buffer_mutation"}  # programs that write their buffers
# the backend's own limits, met the same way on torch.export's program (test_backend_limits_are_the_backends)
LIMITS = {("openvino", "pytree_io"): "dynamic rank"}


@pytest.mark.parametrize("backend", ["onnx", "openvino"])
@pytest.mark.parametrize("name", ZOO)
def test_the_zoo_runs_on_the_backend_close_to_eager(artifacts, backend, name):
    if (backend, name) in LIMITS:
        pytest.skip(f"{backend}'s own limit: {LIMITS[backend, name]}")
    path, case = artifacts(name)
    lp = load_for_backend(path, backend=backend, cache=False)
    assert lp.lowered_for == backends.get(backend).key and lp.backend == backend
    # a program writing its buffers is handed over with them as constants only when asked (STATEFUL)
    compiled = backends.to_backend(backend, lp, frozen_state=name in STATEFUL)
    assert compiled.backend.name == backend and compiled.native is not None
    assert compiled.validation.status == "passed" and compiled.validation.max_rel <= compiled.validation.bound
    torch.testing.assert_close(compiled(*case.args, **(case.kwargs or {})), _eager(case), **TOL)


@pytest.mark.parametrize("backend", ["onnx", "openvino"])
def test_a_dynamic_program_runs_at_other_sizes(artifacts, backend):
    """The program's batch and sequence Dims stay symbolic through the lowering and the hand-off."""
    path, case = artifacts("dynamic_shapes")
    compiled = backends.to_backend(backend, load_for_backend(path, backend=backend, cache=False))
    torch.manual_seed(1)
    for b, n in ((7, 2), (2, 11)):
        args = (torch.randn(b, n, 4), torch.randn(b, 8))
        torch.testing.assert_close(compiled(*args), _eager(case, args), **TOL)


class _Chunks(torch.nn.Module):
    """mamba2's chunked scan in small: a dynamic sequence padded to chunks of 8, a running sum per
    chunk, each chunk's last sum minus the running sums (a slice of size 1 broadcast against 8)."""

    def forward(self, x):
        x = torch.nn.functional.pad(x, (0, 0, 0, (8 - x.shape[1] % 8) % 8))
        cs = torch.cumsum(x.reshape(x.shape[0], -1, 8, x.shape[2]).permute(0, 3, 1, 2), -1)
        return cs[:, :, :, -1:] - cs


def test_a_lowered_program_carries_no_shape_results_of_its_lowering(tmp_path):
    """torch.onnx retraces with backed_size_oblivious=True; fake-tensor results cached on the program's
    ShapeEnv by pt2b's lowering (keyed without that setting) made it size the slice
    Max(0, L - Max(0, L - 1)) instead of 1, and the subtraction failed to broadcast (mamba2, bamba,
    falcon_h1). The lowered program hands over a ShapeEnv without them, and runs at other lengths."""
    model, x = _Chunks(), torch.randn(2, 12, 4)
    ep = torch.export.export(model, (x,), dynamic_shapes=({1: torch.export.Dim.DYNAMIC},))
    path = str(tmp_path / "chunks.pt2b")
    export_model(ep, path=path)
    compiled = backends.to_backend("onnx", load_for_backend(path, backend="onnx", cache=False))
    for n in (12, 21):
        x = torch.randn(2, n, 4)
        torch.testing.assert_close(compiled(x), model(x), **TOL)


class _RmsByVariance(torch.nn.Module):
    """xlstm's layer norm in small: a weight, then var over the last dimension, kept. var.dim has no
    ONNX function; torch's reference makes it prims::var and prims::broadcast_in_dim."""

    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(8))

    def forward(self, x):
        return (x * self.w).var(dim=-1, keepdim=True, unbiased=False) + x


def test_a_backend_is_never_handed_a_primtorch_view(tmp_path):
    """torch.onnx retraces the program it is handed, and torch's functionalization refuses a non-ATen op
    returning a view ("Found a custom (non-ATen) operator whose output has alias annotations:
    prims::broadcast_in_dim", xlstm on onnx). The ONNX preset does not accept the view prims although
    onnxscript lists two; the closure reaches ATen's unsqueeze and expand through the prim's own ATen
    implementation, and the program runs on onnxruntime close to eager."""
    from exporter.lowering import tables

    assert "prims::broadcast_in_dim.default" in {_qualified(m.qualified_name) for m in _torchlib_declared()}
    for name in ("onnx", "inductor"):
        listed = set(backends.get(name).supported_ops)
        assert not {op_name(op) for op in tables.view_prims_via_aten()} & listed
        assert "prims::var.default" in listed  # not a view: translated as it comes
    model, x = _RmsByVariance(), torch.randn(2, 3, 8)
    path = str(tmp_path / "rms.pt2b")
    export_model(model, (x,), path)
    lp = load_for_backend(path, backend="onnx", cache=False)
    assert "prims::broadcast_in_dim.default" not in lp.ops()
    assert {"prims::var.default", "aten::unsqueeze.default", "aten::expand.default"} <= set(lp.ops())
    with torch.no_grad():
        torch.testing.assert_close(backends.to_backend("onnx", lp)(x), model(x), **TOL)


def _torchlib_declared():
    from onnxscript._framework_apis import torch_2_5

    return torch_2_5.get_torchlib_ops()


def _qualified(name: str) -> str:
    return name if "." in name.partition("::")[2] else f"{name}.default"


def test_openvino_lowers_train_mode_batch_norm_as_convert_model_does(artifacts):
    """Read as an op list (core + ops_to_not_decompose), OpenVINO cannot be reached from train-mode batch
    norm (its decompositions end at prims); its own table leaves _native_batch_norm_legit_functional,
    which it translates, and the model runs."""
    path, case = artifacts("cnn_bn_train")
    with pytest.raises(OpsetError, match="prims::"):
        load_for_backend(path, supported_ops=list(backends.get("openvino").supported_ops), cache=False)
    lp = load_for_backend(path, backend="openvino", cache=False)
    assert "aten::_native_batch_norm_legit_functional.default" in lp.ops()
    compiled = backends.to_backend("openvino", lp, frozen_state=True)  # (train mode: running stats written)
    torch.testing.assert_close(compiled(*case.args), _eager(case), **TOL)


def test_to_backend_takes_an_exported_program_too(artifacts):
    _, case = artifacts("mlp")
    ep = torch.export.export(case.model, case.args)
    torch.testing.assert_close(backends.to_backend("onnx", ep)(*case.args), _eager(case), **TOL)


def test_a_backend_that_cannot_take_the_program_is_a_typed_error(artifacts):
    """A custom op torch.onnx has no translation for (kept whole: keep= forbids lowering it through its
    kernel): the error names the backend and torch.onnx's reason in one line; the backend's own
    exception is chained."""
    path, _ = artifacts("custom_op")
    lp = load_for_backend(path, backend="onnx", keep=["pt2b_zoo::scaled_add"], cache=False)
    with pytest.raises(BackendHandOffError, match=r"onnx@.* could not take the program: ConversionError: "
                                                  r"DispatchError: No ONNX function found for .*pt2b_zoo.scaled_add") as e:
        backends.to_backend("onnx", lp)
    assert type(e.value.__cause__).__name__ == "ConversionError"


def test_calling_with_the_wrong_inputs_is_a_typed_error(artifacts):
    path, case = artifacts("pytree_io")
    compiled = backends.to_backend("onnx", load_for_backend(path, backend="onnx", cache=False))
    with pytest.raises(BackendRunError, match="the call does not match the program's inputs"):
        compiled(torch.randn(2, 3))


def test_pt2b_does_not_need_any_backend(tmp_path):
    """With onnx, onnxscript, onnxruntime and openvino absent, pt2b exports, lowers and runs; asking for
    the backend names the extra to install."""
    code = f"""
import sys
for m in ("onnx", "onnxscript", "onnxruntime", "openvino"):
    sys.modules[m] = None
import torch
from exporter import backends, export_model, load_for_backend
from exporter.errors import BackendUnavailableError
m = torch.nn.Linear(4, 2)
export_model(m, (torch.randn(3, 4),), {str(tmp_path / 'm.pt2b')!r})
lp = load_for_backend({str(tmp_path / 'm.pt2b')!r}, "core", cache=False)
torch.testing.assert_close(lp(torch.ones(3, 4)), m(torch.ones(3, 4)))
for name in ("onnx", "openvino"):
    try:
        backends.get(name)
    except BackendUnavailableError as e:
        print(e)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "backend 'onnx' is not installed here" in out.stdout and "pip install pt2b[onnx]" in out.stdout
    assert "pip install pt2b[openvino]" in out.stdout


def test_backend_limits_are_the_backends(artifacts):
    """The zoo case OpenVINO cannot run fails the same way on torch.export's own program: its limit, not
    pt2b's (the matrix attributes failures so, tools/backend_matrix.py)."""
    path, case = artifacts("pytree_io")
    ep = torch.export.export(case.model, case.args, kwargs=case.kwargs)
    for program in (load_for_backend(path, backend="openvino", cache=False), ep):
        with pytest.raises(BackendHandOffError, match="dynamic rank"):
            backends.to_backend("openvino", program)


# real transformers models, one decoder with a static KV cache and one encoder (the matrix runs them all),
# and the whole-corpus sweep's failures that were pt2b's (doge: a view's -1 OpenVINO could not infer)
REAL = ["llama/causal-lm", "bert"]
WERE_PT2BS = [("openvino", "doge/static-cache")]


@pytest.mark.parametrize("backend,name", [(b, n) for n in REAL for b in ("onnx", "openvino")] + WERE_PT2BS)
def test_real_models_run_on_the_backend_close_to_eager(tmp_path, backend, name):
    from tools.corpus.programs import capture_real
    from tools.corpus.transformers_zoo import make_case as make_real

    case = make_real(name)
    pristine = copy.deepcopy(case.model)
    path = tmp_path / "m.pt2b"
    export_model(capture_real(case, {}), path=path)
    lowered = load_for_backend(path, backend=backend, cache=False)
    stateful = bool(lowered.exported_program().graph_signature.buffers_to_mutate)  # (a static KV cache)
    compiled = backends.to_backend(backend, lowered, frozen_state=stateful)
    torch.manual_seed(0)
    got = compiled(*case.args, **(case.kwargs or {}))
    torch.manual_seed(0)
    with torch.no_grad():
        want = pristine(*case.args, **(case.kwargs or {}))
    got_leaves, want_leaves = (torch.utils._pytree.tree_leaves(o) for o in (got, want))
    assert len(got_leaves) == len(want_leaves)
    for g, w in zip(got_leaves, want_leaves):
        torch.testing.assert_close(g, w, rtol=1e-3, atol=1e-3)


@pytest.mark.parametrize("backend", ["onnx", "openvino"])
def test_a_program_writing_its_buffers_carries_them_from_call_to_call(artifacts, backend):
    """The backends hold no state of their own: the buffers the program writes (a counter, a moving
    average) are lifted to inputs and outputs and the Compiled carries them, call after call, as eager
    does (tests/backends/test_lifted_state.py has the rest)."""
    from tests.support.helpers import buffers_carry_from_call_to_call

    buffers_carry_from_call_to_call(backend, *artifacts("buffer_mutation"))


def test_a_backend_result_that_differs_is_caught_at_the_hand_off(artifacts, monkeypatch):
    """A backend that computes something else (here its outputs nudged by 1%) is a BackendResultError
    naming the output, from to_backend's run on the stored example inputs; validate=False skips it."""
    from exporter.errors import BackendResultError

    path, case = artifacts("pytree_io")
    lowered = load_for_backend(path, backend="onnx", cache=False)
    onnx = backends.get("onnx")
    real_run = onnx.run

    def nudged(*a, **k):
        out = real_run(*a, **k)
        return torch.utils._pytree.tree_map(lambda t: t * 1.01 if isinstance(t, torch.Tensor) else t, out)

    monkeypatch.setattr(backends, "_CACHE", {**backends._CACHE, "onnx": dataclasses.replace(onnx, run=nudged)})
    with pytest.raises(BackendResultError, match=r"onnx@.*: output\[.*\] \(torch.float32\) differs from the lowered "
                                                 r"program's by [0-9.e-]+ \(relative\), beyond 0.001"):
        backends.to_backend(lowered)
    unchecked = backends.to_backend(lowered, validate=False)
    assert unchecked.validation is None


@pytest.mark.parametrize("backend", ["onnx", "openvino"])
def test_the_program_s_writes_into_its_inputs_reach_the_caller(tmp_path, backend):
    """The program writes its input in place. A backend computes the write but never makes it (ONNX
    Runtime and OpenVINO copy their inputs in): pt2b hands the program over with the new value as an
    extra output and writes it into the caller's tensor after each call, as the program does. Without
    that copy the hand-off check names the input, where the outputs alone compare equal."""
    from exporter.backends import validation
    from exporter.errors import BackendResultError
    from exporter.lowering.verdicts import WRONG_REL
    from tests.support.helpers import input_writes_reach_the_caller

    compiled = input_writes_reach_the_caller(backend, tmp_path)
    lowered = load_for_backend(tmp_path / f"writes-{backend}.pt2b", backend=backend, cache=False).exported_program()
    dropped = dataclasses.replace(compiled, write_back=_OutputsOnly(), validation=None)
    with pytest.raises(BackendResultError, match=r"the program writes its input args\[0\] in place, and after the "
                                                 r"call the caller's tensor differs from what the lowered program "
                                                 r"leaves there by 1 \(relative\)"):
        validation.validated_hand_off(dropped, lowered, WRONG_REL)


class _OutputsOnly:
    """A write-back that drops the writes: what a backend that copies its inputs in does alone."""

    def call(self, run, args, kwargs):
        return run(args, kwargs)[0]


class _Spectrum(torch.nn.Module):
    def forward(self, x):
        return torch.fft.fft(x) * 3


@pytest.mark.parametrize("dtype", [torch.complex64, torch.complex128])
def test_a_complex_output_is_checked_within_its_parts_bound(dtype):
    """A complex output is compared as its real and imaginary parts, within their dtype's bound: a backend's
    rounding passes where a bitwise comparison refused it, a wrong imaginary part is still caught."""
    from exporter.backends import Backend, Compiled, validation
    from exporter.errors import BackendResultError
    from exporter.lowering.verdicts import WRONG_REL

    x = torch.randn(4, 16, dtype=torch.float64 if dtype == torch.complex128 else torch.float32)
    ep = torch.export.export(_Spectrum(), (x,))
    ulp = torch.finfo(x.dtype).eps

    def backend(nudge):
        run = lambda native, program, args, kwargs: program.module()(*args, **kwargs) * nudge  # noqa: E731
        return Backend("nudged", "1", (), "", dict, lambda ep: (None, ep), run)

    rounded = validation.validated_hand_off(Compiled(backend(1 + 4 * ulp), None, ep), ep, WRONG_REL)
    assert rounded.status == "passed" and 0 < rounded.max_rel < WRONG_REL[x.dtype]
    with pytest.raises(BackendResultError, match=rf"nudged@1: output \({dtype}\) differs from the lowered program's "
                                                 r"by [0-9.e-]+ \(relative\), beyond"):
        validation.validated_hand_off(Compiled(backend(complex(1, 0.01)), None, ep), ep, WRONG_REL)


@pytest.mark.parametrize("name", ["onnx", "openvino", "inductor"])
def test_a_model_output_built_out_of_its_field_order_comes_back_as_built(name):
    """torch's retrace (torch.onnx's run_decompositions, OpenVINO's table, AOTInductor's) rebuilds a
    ModelOutput from its keys in its fields' order and reorders the graph's outputs under the program's
    structure (AyaVision's image outputs): each key came back holding another key's value."""
    from tests.support.helpers import an_output_class_comes_back_as_built

    compiled = an_output_class_comes_back_as_built(name)
    assert compiled.validation.status == "passed"


def test_only_outputs_that_do_not_flatten_back_are_handed_in_plain_containers():
    """handed_spec: a structure whose values flatten back to it (a ModelOutput set in its fields' order,
    tuples, dicts) is handed as it is; one that does not becomes tuples of the same leaves in order."""
    pytest.importorskip("transformers")
    from exporter.backends.program_copy import handed_spec
    from exporter._torch.pytree import pytree
    from tests.support.helpers import model_output_built_out_of_field_order

    model, args = model_output_built_out_of_field_order()
    x = args[0]
    built = model(x)
    spec = pytree.tree_structure(built)
    plain = handed_spec(spec)
    assert plain != spec and plain.num_leaves == spec.num_leaves == 3
    assert pytree.tree_leaves(pytree.tree_unflatten(pytree.tree_leaves(built), plain)) == pytree.tree_leaves(built)
    in_order = type(built)(first=x, second=x * 2, third=x.sum(0))
    for value in (in_order, (x, {"a": x, "b": [x, None]}), x):
        assert handed_spec(pytree.tree_structure(value)) == pytree.tree_structure(value)


class _TwiceAndWeight(torch.nn.Module):
    """Returns one value twice (BLIP-2's, FLAVA's and BridgeTower's outputs share tensors) and a weight
    as it is."""

    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(4))

    def forward(self, x):
        y = x + self.w
        return y, y * 2, y, self.w


@pytest.mark.parametrize("name", ["onnx", "openvino", "inductor"])
def test_a_value_returned_twice_and_a_weight_returned_as_it_is_come_back(name):
    """OpenVINO's converter stopped on a value returned twice ("Check 'is_number(name)' failed"); ONNX
    and OpenVINO named a returned weight by its attribute ('w'), which the run did not find among the
    program's outputs ('p_w')."""
    model, x = _TwiceAndWeight(), torch.randn(3, 4)
    compiled = backends.to_backend(name, torch.export.export(model, (x,)))
    assert compiled.validation.status == "passed"
    x2 = torch.randn(3, 4)
    got, want = compiled(x2), model(x2)
    assert len(got) == 4
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w)


class _SizesBeside(torch.nn.Module):
    """Returns its hidden states with the spatial sizes and a scale beside them, Python numbers that
    torch.export records as constant outputs (MaskFormer's Swin backbone returns its sizes so)."""

    def __init__(self):
        super().__init__()
        self.register_buffer("calls", torch.zeros(()))

    def forward(self, x):
        self.calls.add_(1)
        h, w = x.shape[-2:]
        return {"hidden": x.flatten(2) * self.calls, "sizes": ((h, w), (h // 2, w // 2)), "scale": 0.5,
                "pooled": x.mean((2, 3))}


def test_a_program_without_its_constant_outputs_gets_them_back_in_its_structure():
    """without_constant_outputs leaves the written buffer and the computed outputs as they are, the
    numbers out of the structure; with_constant_outputs puts the numbers back at their places
    in the program's structure."""
    from exporter.backends import calling
    from exporter.backends.constant_outputs import (constant_outputs, with_constant_outputs,
                                                    without_constant_outputs)

    x = torch.randn(2, 3, 4, 6)
    ep = torch.export.export(_SizesBeside(), (x,)).run_decompositions({})  # (the write an output of its own)
    constants = constant_outputs(ep)
    assert constants == {1: 4, 2: 6, 3: 2, 4: 3, 5: 0.5}
    given = without_constant_outputs(ep, calling.out_spec(ep))
    kinds = [s.kind.name for s in given.graph_signature.output_specs]
    assert kinds == ["BUFFER_MUTATION", "USER_OUTPUT", "USER_OUTPUT"]
    out = given.module()(x)
    assert list(out) == ["hidden", "pooled"]  # (the numbers' keys left out with them)
    torch.testing.assert_close(out["hidden"], x.flatten(2))
    back = with_constant_outputs(given, constants, calling.out_spec(ep))
    got, want = back.module()(x), _SizesBeside()(x)
    assert got["sizes"] == want["sizes"] == ((4, 6), (2, 3)) and got["scale"] == 0.5
    torch.testing.assert_close(got["pooled"], want["pooled"])
    assert with_constant_outputs(given, {**constants, 6: 1}, calling.out_spec(ep)) is None


@pytest.mark.parametrize("name", ["onnx", "openvino", "inductor"])
def test_a_program_returning_numbers_beside_its_tensors_runs_on_the_backend(name):
    """torch.onnx's translation stopped on a constant output ("'int' object has no attribute 'name'")
    and OpenVINO's converter too ("5 is not in list"): maskformer-swin failed on both. The backend gets
    the computed outputs; the numbers come back from the program. The count it keeps is a 0-d buffer."""
    model, x = _SizesBeside(), torch.randn(2, 3, 4, 6)
    compiled = backends.to_backend(name, torch.export.export(copy.deepcopy(model), (x,)))
    assert compiled.validation.status == "passed"
    x2 = torch.randn(2, 3, 4, 6)
    got, want = compiled(x2), copy.deepcopy(model)(x2)
    assert got["sizes"] == ((4, 6), (2, 3)) and got["scale"] == 0.5 and list(got) == list(want)
    torch.testing.assert_close(got["hidden"], want["hidden"])
    torch.testing.assert_close(got["pooled"], want["pooled"])
    # (OpenVINO's CPU plugin holds the 0-d count as a variable of shape (1,): it comes back as the buffer's)
    torch.testing.assert_close(compiled.state["calls"], torch.tensor(1.0))


class _FirstInputChecked(torch.nn.Module):
    def forward(self, ids, x, w):
        torch.ops.aten._assert_tensor_metadata.default(ids, dtype=torch.int64)
        return torch.tanh(x @ w)


class _FirstInputUnused(torch.nn.Module):
    def forward(self, ids, x, w):
        return torch.tanh(x @ w)


@pytest.mark.parametrize("model", [_FirstInputChecked(), _FirstInputUnused()], ids=["checked", "unused"])
def test_an_input_openvinos_model_leaves_out_is_not_fed_to_it(model):
    """OpenVINO's converter leaves out a first input that nothing but a runtime check reads: a split's part
    takes such tensors from the reference's part before it (tapas, the `.to()` checks of its ids), and
    the inputs after it went one port off ("vector::_M_range_check"). Each input reaches its own port."""
    args = (torch.arange(6).view(2, 3), torch.randn(2, 4), torch.randn(4, 5))
    compiled = backends.to_backend("openvino", torch.export.export(model, args))
    assert compiled.validation.status == "passed"
    args2 = (torch.arange(6).view(2, 3), torch.randn(2, 4), torch.randn(4, 5))
    torch.testing.assert_close(compiled(*args2), model(*args2))


@pytest.mark.parametrize("kernel", [16, (8, 16), 7])
def test_a_pool_whose_window_covers_the_whole_input_runs_on_openvino(kernel):
    """EfficientNet's pooler (AvgPool2d(hidden_dim, ceil_mode=True)) over a feature map smaller than its
    kernel: OpenVINO's CPU plugin refuses the kernel ("Check 'cmp::le(kernel, dim.get_length())'"), and
    the hand-off gives it the mean over the window torch clips to the input."""
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 3, 1), torch.nn.AvgPool2d(kernel, ceil_mode=True))
    x = torch.randn(2, 3, 5, 7)
    compiled = backends.to_backend("openvino", torch.export.export(model, (x,)))
    assert compiled.validation.status == "passed"
    x2 = torch.randn(2, 3, 5, 7)
    torch.testing.assert_close(compiled(x2), model(x2))


class _Windows(torch.nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.dim = dim

    def forward(self, x):
        return x.unfold(self.dim, 3, 2) * 2


@pytest.mark.parametrize("dim", [-1, -2, 1])
def test_windows_along_a_dim_counted_from_the_end_run_on_openvino(dim, monkeypatch):
    """inkling2's local windows, x.unfold(-1, ...): OpenVINO's converter fails on an unfold along a dim
    counted from the end ("Conversion is failed for: aten.unfold.default") and takes the same dim counted
    from the front."""
    from exporter.backends import openvino

    model, x = _Windows(dim), torch.randn(2, 7, 9)
    if dim < 0:
        with monkeypatch.context() as m:
            m.delitem(openvino._REWRITES, torch.ops.aten.unfold.default)
            with pytest.raises(BackendHandOffError, match="aten.unfold"):
                backends.to_backend("openvino", torch.export.export(model, (x,)))
    compiled = backends.to_backend("openvino", torch.export.export(model, (x,)))
    assert compiled.validation.status == "passed"
    x2 = torch.randn(2, 7, 9)
    assert torch.equal(compiled(x2), model(x2))


_EXPAND_OF_NOTHING = """
import torch
from exporter import backends

class Tokens(torch.nn.Module):  # DINOv3's embeddings where the config has no register tokens
    def __init__(self):
        super().__init__()
        self.cls_token = torch.nn.Parameter(torch.randn(1, 1, 8))
        self.register_tokens = torch.nn.Parameter(torch.zeros(1, 0, 8))

    def forward(self, x):
        b = x.shape[0]
        return torch.cat([self.cls_token.expand(b, -1, -1), self.register_tokens.expand(b, -1, -1), x], 1)

model, x = Tokens(), torch.randn(2, 3, 8)
compiled = backends.to_backend("openvino", torch.export.export(model, (x,)))  # (static: a dynamic batch converts)
assert compiled.validation.status == "passed"
x2 = torch.randn(2, 3, 8)
torch.testing.assert_close(compiled(x2), model(x2))
print("ran", tuple(compiled(x2).shape))
"""


def test_an_expand_of_a_tensor_with_no_elements_does_not_kill_the_process():
    """OpenVINO's converter dies of SIGFPE (the caller's process with it) on the broadcast of a tensor with
    a dim of size 0 (DINOv3 without register tokens); the hand-off gives it a ``full`` of the expanded
    shape. In a process of its own: without the rewrite it is killed."""
    done = subprocess.run([sys.executable, "-c", _EXPAND_OF_NOTHING], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == "ran (2, 4, 8)"


class _PickByScore(torch.nn.Module):
    """Rows picked by their scores' topk and gathered, as DETR-style detectors pick their queries."""

    def __init__(self, constant_scores: bool):
        super().__init__()
        self.constant_scores = constant_scores

    def forward(self, x):
        scores = (x * 0 if self.constant_scores else x).sum(-1)  # (constant weights score every row alike)
        picked = scores.topk(5, dim=-1).indices
        return torch.gather(x, 1, picked[..., None].expand(-1, -1, x.shape[-1])) * 2


def test_a_result_that_differs_where_the_program_picks_among_equal_values_says_so():
    """D-FINE's and DEIMv2's query selection with random weights scores every anchor alike: which of
    equal values topk puts first is unspecified, and ONNX Runtime picks others than torch. The hand-off
    check still refuses the result, and says that the pick was among ties, not that the backend computes
    something else."""
    pytest.importorskip("onnxruntime")
    x = torch.randn(2, 20, 4)
    with pytest.raises(BackendResultError, match=r"the program's topk picks among equal values: which of equal "
                                                 r"values comes first is unspecified"):
        backends.to_backend("onnx", torch.export.export(_PickByScore(True), (x,)))
    compiled = backends.to_backend("onnx", torch.export.export(_PickByScore(False), (x,)))  # (no ties: no doubt)
    assert compiled.validation.status == "passed"
    x2 = torch.randn(2, 20, 4)
    assert torch.equal(compiled(x2), _PickByScore(False)(x2))


def test_tied_picks_names_the_ops_whose_pick_ties_decide():
    from exporter.backends.validation import tied_picks

    class Picks(torch.nn.Module):
        def forward(self, x, stable: bool):
            return (x.argmax(-1), torch.sort(x, dim=-1, stable=stable).indices, x.topk(2, dim=-1).indices,
                    x.max(dim=0).indices)

    tied = torch.tensor([[1.0, 3.0, 3.0, 0.0], [1.0, 5.0, 4.0, 6.0]])  # (a tie along each dim)
    ep = torch.export.export(Picks(), (tied, False))
    assert tied_picks(ep, (tied, False), {}) == "argmax, sort, topk, max"
    assert tied_picks(torch.export.export(Picks(), (tied, True)), (tied, True), {}) == "argmax, topk, max"
    distinct = torch.tensor([[1.0, 3.0, 2.0, 0.0], [2.0, 6.0, 4.0, 5.0]])
    assert tied_picks(ep, (distinct, False), {}) == ""


class _SqueezeMaybe(torch.nn.Module):
    """parakeet's joint network squeezes a dim whose size is not 1, which torch leaves as it is."""

    def forward(self, x):
        return x.squeeze(2) * 2, x.squeeze((1, 3)) + 1, x[:, :, :1].squeeze(2)


def test_a_squeeze_of_a_dim_whose_size_is_not_1_runs_on_onnx(monkeypatch):
    """torchlib removes the dim a squeeze names whatever its size, and ONNX Runtime refuses the model
    ("Dimension of input 2 must be 1 instead of 6"): the hand-off gives it the squeeze of the dims of
    size 1 only, or a view of the same shape."""
    pytest.importorskip("onnxruntime")
    from exporter.backends import onnx as onnx_backend

    model, x = _SqueezeMaybe(), torch.randn(2, 1, 6, 1)
    ep = torch.export.export(model, (x,))
    with monkeypatch.context() as m:
        m.setattr(onnx_backend, "_for_torchlib", lambda ep: ep)
        # (ONNX Runtime refuses the model when it builds its session, on the hand-off's first run)
        with pytest.raises(BackendHandOffError, match=r"took the program but could not run it on the stored "
                                                      r"example inputs: .*must be 1 instead of 6"):
            backends.to_backend("onnx", ep)
        # with the fallback, a run the backend cannot make is split as a wrong result is
        split = backends.to_backend("onnx", ep, fallback="reference")
        assert split.share.on_reference == {"aten::squeeze.dim": 1, "aten::squeeze.dims": 1}
    compiled = backends.to_backend("onnx", ep)
    assert compiled.validation.status == "passed"
    x2 = torch.randn(2, 1, 6, 1)
    for got, want in zip(compiled(x2), model(x2)):
        assert got.shape == want.shape and torch.equal(got, want)


class _EmptyRopeHalf(torch.nn.Module):
    """glm5_next splits its keys into a part and an empty rope half, which it views as (b, 1, s, 0)."""

    def forward(self, x):
        b, s, _ = x.shape
        q, rope = x.split([6, 0], dim=-1)
        return q * 2, rope.view(b, 1, s, 0).transpose(1, 2), x.view(b, s, 2, 3)


def test_a_view_to_a_size_with_a_0_runs_on_onnx(monkeypatch):
    """onnxscript's optimizer writes a -1 into the shape of a reshape with a symbolic size, which ONNX Runtime
    refuses beside a 0 ("Product cannot be 0 in combination with -1"): the hand-off gives it the empty
    tensor of that size instead; views of other sizes stay views."""
    pytest.importorskip("onnxruntime")
    from exporter.backends import onnx as onnx_backend

    model, x = _EmptyRopeHalf(), torch.randn(2, 5, 6)
    ep = torch.export.export(model, (x,), dynamic_shapes=({1: torch.export.Dim("s", min=2, max=64)},))
    with monkeypatch.context() as m:
        m.setattr(onnx_backend, "_for_torchlib", lambda ep: ep)
        with pytest.raises(BackendHandOffError, match=r"could not run it on the stored example inputs: .*"
                                                      r"Product cannot be 0 in combination with -1"):
            backends.to_backend("onnx", ep)
    rewritten = onnx_backend._for_torchlib(ep)
    views = [n.args[1] for n in rewritten.graph.nodes if n.target is torch.ops.aten.view.default]
    assert len(views) == 1 and 0 not in views[0]
    compiled = backends.to_backend("onnx", ep)
    assert compiled.validation.status == "passed"
    x2 = torch.randn(2, 9, 6)
    for got, want in zip(compiled(x2), model(x2)):
        assert got.shape == want.shape and got.dtype == want.dtype and torch.equal(got, want)


class _OneMinus(torch.nn.Module):
    """timesfm weighs by ``1.0 - mask`` (an integer mask) and ``1 - x``."""

    def forward(self, x, mask):
        return (1.0 - mask) * x, 1 - x


def test_a_number_minus_a_tensor_runs_on_onnx(tmp_path, monkeypatch):
    """torch's decomposition of rsub records ``1.0 - t`` as ``sub.Tensor(1.0, t)``, which torch.onnx's
    dispatcher matches to no overload, on torch's own program too: the hand-off gives it ``-t + 1.0``, the
    same numbers bit for bit (a zero's sign too) in the same dtype."""
    pytest.importorskip("onnxruntime")
    from exporter.backends import onnx as onnx_backend

    model, args = _OneMinus(), (torch.tensor([[0.5, 1.0, -2.0, 3.0]]), torch.tensor([[1, 0, 1, 1]]))
    export_model(model, args, tmp_path / "m.pt2b")
    lowered = load_for_backend(tmp_path / "m.pt2b", backend="onnx", cache=False)
    assert any(n.target is torch.ops.aten.sub.Tensor and not isinstance(n.args[0], torch.fx.Node)
               for n in lowered.exported_program().graph.nodes)
    with monkeypatch.context() as m:
        m.setattr(onnx_backend, "_FOR_TORCHLIB", {op: entry for op, entry in onnx_backend._FOR_TORCHLIB.items()
                                                 if op is not torch.ops.aten.sub.Tensor})
        with pytest.raises(BackendHandOffError, match="Cannot find a compatible OpOverload for aten.sub"):
            backends.to_backend(lowered)
    compiled = backends.to_backend(lowered)
    x, mask = torch.tensor([[1.0, 1.0, -0.0, 7.5]]), torch.tensor([[1, 1, 0, 1]])
    for got, want in zip(compiled(x, mask), model(x, mask)):
        assert got.dtype == want.dtype and torch.equal(got, want) and torch.equal(got.signbit(), want.signbit())


class _HalvesOfADynamicDim(torch.nn.Module):
    """prophetnet splits its streams by a size read from a dynamic dim."""

    def forward(self, x):
        a, b = x.split(x.shape[1] // 2, dim=1)
        return a * 2 + b


def test_a_program_onnxscript_s_optimizer_fails_on_is_handed_over_unoptimized(monkeypatch):
    """onnxscript's constant folding fails on a SplitToSequence whose sizes are not constants (PassError);
    the translated model is right, and the hand-off goes on with it unoptimized, saying so."""
    pytest.importorskip("onnxruntime")
    from torch.export import Dim

    from exporter.backends import onnx as onnx_backend
    from exporter.errors import LibraryTableWarning

    model = _HalvesOfADynamicDim()
    ep = torch.export.export(model, (torch.randn(2, 8, 3),), dynamic_shapes=({1: Dim("s", min=2, max=64) * 2},))
    with monkeypatch.context() as m:
        m.setattr(onnx_backend, "_optimizer_failed", lambda e: False)
        with pytest.raises(BackendHandOffError, match="PassError"):
            backends.to_backend("onnx", ep)
    with pytest.warns(LibraryTableWarning, match="onnxscript's optimizer failed on this program"):
        compiled = backends.to_backend("onnx", ep)
    assert compiled.validation.status == "passed"
    for n in (4, 10):
        x = torch.randn(2, n, 3)
        torch.testing.assert_close(compiled(x), model(x))
