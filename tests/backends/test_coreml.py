"""Core ML takes pt2b's lowering with its own op list, read from coremltools' torch frontend registry: the
zoo and a small transformers Llama convert to ML programs whose inputs and outputs are checked against
the program's (Core ML runs only on macOS: off it the hand-off check records that it did not run, and a
call is a typed error); the buffers a program writes convert lifted; save() writes the .mlpackage that
coremltools alone reads. coremltools installs in about a minute: these tests run where it is installed
(`pytest -m backends tests/backends/test_coreml.py` in a venv with coremltools)."""

from __future__ import annotations

import dataclasses
import subprocess
import sys

import pytest
import torch

pytest.importorskip("coremltools.converters.mil.frontend.torch")

from exporter import backends, export_model, load_for_backend  # noqa: E402
from exporter.errors import BackendHandOffError, BackendResultError, BackendRunError  # noqa: E402

pytestmark = pytest.mark.backends

OFF_MAC = pytest.mark.skipif(sys.platform == "darwin", reason="Core ML runs here: the tests of its absence do not apply")


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory):
    from tests.support.helpers import zoo_artifacts

    return zoo_artifacts(tmp_path_factory.mktemp("coreml"))


def _mil(compiled):
    """{input name: (shape, dtype)}, {output name: (shape, dtype)} of the converted model's MIL program."""
    from coremltools.converters.mil.mil import types

    main = compiled.native._mil_program.functions["main"]
    typed = lambda v: (tuple(d if isinstance(d, int) else "sym" for d in v.shape), types.builtin_to_string(v.dtype))  # noqa: E731
    return {n: typed(v) for n, v in main.inputs.items()}, {v.name: typed(v) for v in main.outputs}


def test_the_op_list_is_the_frontends_registry():
    from coremltools.converters.mil.frontend.torch.torch_op_registry import _TORCH_OPS_REGISTRY
    from coremltools.converters.mil.frontend.torch.utils import sanitize_op_kind

    import importlib.metadata as md

    b = backends.get("coreml")
    names = set(_TORCH_OPS_REGISTRY.name_to_func_mapping)
    assert b.key == f"coreml@{md.version('coremltools')}" and "_TORCH_OPS_REGISTRY" in b.source
    assert len(b.supported_ops) > 300 and all(n.startswith("aten::") for n in b.supported_ops)
    # every entry is an overload whose name, as the frontend reads a node's target, the registry holds
    assert all(sanitize_op_kind(n.removesuffix(".default")) in names for n in b.supported_ops)
    # a registry name is every overload that comes to it; an overload it tells apart only as it does
    assert {"aten::add.Tensor", "aten::add.Scalar", "aten::sum.dim_IntList", "aten::linear.default"} <= set(b.supported_ops)
    assert "aten::add.out" not in b.supported_ops and "aten::alias.default" not in b.supported_ops
    # coremltools has none of its own: the table is pt2b's repairs (bitwise_or)
    assert list(b.decompositions()) == [torch.ops.aten.bitwise_or.Tensor]
    assert not b.holds_state and b.takes_lifted_state
    assert b.runs_here == (sys.platform == "darwin") and b.file_suffix == ".mlpackage"


@pytest.mark.parametrize("name", ["mlp", "cnn_bn", "transformer_encoder", "multihead_attention", "kwargs_only",
                                  "dynamic_shapes", "lstm", "pytree_io"])
def test_the_zoo_converts_and_its_model_matches_the_program(artifacts, name):
    path, case = artifacts(name)
    lowered = load_for_backend(path, backend="coreml", cache=False)
    assert set(lowered.ops()) <= set(backends.get("coreml").supported_ops)
    compiled = backends.to_backend(lowered)
    ep = lowered.exported_program()
    inputs, outputs = _mil(compiled)
    user = [s.arg.name for s in ep.graph_signature.input_specs if s.kind.name == "USER_INPUT"]
    vals = {n.name: n.meta.get("val") for n in ep.graph.nodes}
    assert list(inputs) == [n for n in user if isinstance(vals[n], torch.Tensor)]
    assert [s for s, _ in inputs.values()] == [tuple(d if isinstance(d, int) else "sym" for d in vals[n].shape)
                                               for n in inputs]
    produced = [v for v in ep.graph.output_node().args[0] if isinstance(v, torch.fx.Node)]
    assert list(outputs) == [v.name for v in produced]
    assert all(len(shape) == vals[n].dim() and dtype == "fp32" for n, (shape, dtype) in outputs.items())
    if sys.platform != "darwin":
        assert compiled.validation.status == "skipped" and "does not run on this system" in compiled.validation.why


def test_dynamic_dims_stay_symbolic_with_the_programs_bounds(artifacts):
    path, _ = artifacts("mlp")
    compiled = backends.to_backend(load_for_backend(path, backend="coreml", cache=False))
    (array,) = compiled.native.get_spec().description.input
    multi = array.type.multiArrayType
    assert array.name == "x" and multi.dataType == multi.FLOAT32
    assert [(r.lowerBound, r.upperBound) for r in multi.shapeRange.sizeRanges][1] == (16, 16)
    assert multi.shapeRange.sizeRanges[0].upperBound > 16  # the batch, dynamic


def test_compute_is_float32_unless_asked(artifacts):
    import coremltools as ct

    path, _ = artifacts("mlp")
    lowered = load_for_backend(path, backend="coreml", cache=False)
    ops = lambda c: {op.op_type for op in c.native._mil_program.functions["main"].operations}  # noqa: E731
    assert "cast" not in ops(backends.to_backend(lowered))
    assert "cast" in ops(backends.to_backend(lowered, compute_precision=ct.precision.FLOAT16))  # fp32 i/o, fp16 inside


def test_a_model_that_does_not_match_the_program_is_a_typed_error(artifacts):
    from exporter.backends.coreml import check_model

    mlp = backends.to_backend(load_for_backend(artifacts("mlp")[0], backend="coreml", cache=False))
    other = load_for_backend(artifacts("dynamic_shapes")[0], backend="coreml", cache=False).exported_program()
    with pytest.raises(BackendHandOffError, match=r"coremltools' model has the inputs \['x'\] where the program "
                                                  r"has \['x', 'y'\]: report it to coremltools"):
        check_model(mlp.native, other)


@OFF_MAC
def test_a_call_off_macos_is_a_typed_error(artifacts):
    path, case = artifacts("mlp")
    compiled = backends.to_backend(load_for_backend(path, backend="coreml", cache=False))
    with pytest.raises(BackendRunError, match=r"Core ML runs only on macOS, and this is linux: save the model "
                                              r"\(compiled.save\('m.mlpackage'\)\) and run it on a Mac"):
        compiled(*case.args)


def test_a_wrong_result_is_caught_at_the_hand_off(artifacts, monkeypatch):
    """Where the backend runs (macOS; here made to), its outputs are compared with the lowered program's."""
    path, case = artifacts("mlp")
    lowered = load_for_backend(path, backend="coreml", cache=False)
    real = backends.get("coreml")

    def nudged(model, ep, args, kwargs, plan=None):  # the program's own run, a little off, as a backend's
        return ep.module()(*args, **kwargs) * 1.01

    monkeypatch.setitem(backends._CACHE, "coreml", dataclasses.replace(real, run=nudged, runs_here=True))
    with pytest.raises(BackendResultError, match=r"coreml@.*: output \(torch.float32\) differs from the lowered "
                                                 r"program's by [0-9.e-]+ \(relative\), beyond 0.001"):
        backends.to_backend(lowered)


class _Alias(torch.nn.Module):
    def forward(self, x):
        return torch.ops.aten.alias(x) * 2 + x


def test_an_alias_converts(tmp_path):
    """coremltools has no conversion for aten.alias; pt2b's lowering reaches view instead (alias is not in
    the list), and the hand-off takes alias out of a program handed over as it is."""
    import coremltools as ct

    x = torch.randn(3, 4)
    ep = torch.export.export(_Alias(), (x,)).run_decompositions({})
    assert any(n.target is torch.ops.aten.alias.default for n in ep.graph.nodes)
    with pytest.raises(NotImplementedError, match="Unsupported fx node alias"):
        ct.convert(ep, convert_to="mlprogram", skip_model_load=True)
    compiled = backends.to_backend("coreml", ep)
    assert any(n.target is torch.ops.aten.alias.default for n in ep.graph.nodes)  # the caller's program unchanged
    assert {op.op_type for op in compiled.native._mil_program.functions["main"].operations} >= {"mul", "add"}
    export_model(_Alias(), (x,), tmp_path / "a.pt2b")
    lowered = load_for_backend(tmp_path / "a.pt2b", backend="coreml", cache=False)
    assert "aten::alias.default" not in lowered.ops()
    backends.to_backend(lowered)


def test_a_none_argument_and_a_none_output_convert(artifacts):
    """coremltools makes a model input of every user input and looks every output up by a node's name:
    a None argument and a None in the returned structure fail it; the hand-off converts without them."""
    import coremltools as ct

    path, _ = artifacts("pytree_io")
    lowered = load_for_backend(path, backend="coreml", cache=False)
    with pytest.raises(NotImplementedError, match="Placeholder val must be a tensor or fake tensor"):
        ct.convert(lowered.exported_program(), convert_to="mlprogram", skip_model_load=True)
    inputs, outputs = _mil(backends.to_backend(lowered))
    assert "maybe" not in inputs and len(inputs) == 5 and len(outputs) == 5


def test_a_dtype_core_ml_lacks_is_a_typed_error(artifacts):
    path, _ = artifacts("dtypes")
    with pytest.raises(BackendHandOffError, match=r"the program's '\w+' is torch.bfloat16, which Core ML does "
                                                  r"not hold .*: export the model in float32 or float16"):
        backends.to_backend(load_for_backend(path, backend="coreml", cache=False))


def test_an_op_coreml_does_not_convert_is_a_typed_error(artifacts):
    """torch.export's own program, with a custom op nothing decomposes, handed over as it is."""
    path, case = artifacts("custom_op")
    ep = torch.export.export(case.pristine, case.args)
    with pytest.raises(BackendHandOffError, match=r"coreml@.* could not take the program: NotImplementedError: "
                                                  r"Unsupported fx node scaled_add"):
        backends.to_backend("coreml", ep)


def test_the_buffers_a_program_writes_convert_lifted(artifacts):
    """Core ML would hold written buffers as float16 states; pt2b hands them over lifted instead: the
    model takes each after the user's inputs (a 0-d one as coremltools wraps it) and returns its new
    value after the user's outputs."""
    from coremltools.converters.mil.frontend.torch.exir_utils import WRAPPED_SCALAR_INPUT_SUFFIX

    path, _ = artifacts("buffer_mutation")
    compiled = backends.to_backend(load_for_backend(path, backend="coreml", cache=False))
    assert sorted(compiled.state) == ["count", "ema"]
    inputs, outputs = _mil(compiled)
    assert inputs == {"x": ((4, 8), "fp32"), f"b_count{WRAPPED_SCALAR_INPUT_SUFFIX}": ((1,), "int32"),
                      "b_ema": ((8,), "fp32")}
    assert len(outputs) == 3 and [dtype for _, dtype in outputs.values()] == ["fp32", "int32", "fp32"]
    assert not compiled.native.get_spec().description.state  # no Core ML state: pt2b carries it


def test_the_program_s_writes_into_its_inputs_convert_as_outputs(tmp_path):
    """The writes are lifted to outputs (pt2b makes them in the caller's tensors after a run)."""
    from tests.support.helpers import WritesItsInput

    export_model(WritesItsInput(), (torch.randn(3),), tmp_path / "w.pt2b", kwargs={"scale": torch.tensor(2.0)})
    compiled = backends.to_backend(load_for_backend(tmp_path / "w.pt2b", backend="coreml", cache=False))
    inputs, outputs = _mil(compiled)
    assert list(inputs) == ["x", "scale_wrapped_as_tensor_for_coreml"] and len(outputs) == 2
    assert compiled.write_back is not None


def test_a_small_llama_converts(tmp_path):
    from tests.support.helpers import tiny_llama

    model, ids, mask = tiny_llama()
    dims = {1: torch.export.Dim("seq", max=32)}
    export_model(model, (), tmp_path / "llama.pt2b", kwargs={"input_ids": ids, "attention_mask": mask},
                 dynamic_shapes={"input_ids": dims, "attention_mask": dims})
    compiled = backends.to_backend(load_for_backend(tmp_path / "llama.pt2b", backend="coreml", cache=False))
    inputs, outputs = _mil(compiled)
    assert inputs == {"input_ids": ((2, "sym"), "int32"), "attention_mask": ((2, "sym"), "int32")}
    assert [shape for shape, _ in outputs.values()] == [(2, "sym", 64)]


def test_its_file_is_read_by_coremltools_alone_in_a_fresh_process(artifacts, tmp_path):
    path, _ = artifacts("mlp")
    compiled = backends.to_backend(load_for_backend(path, backend="coreml", cache=False))
    file = compiled.save(tmp_path / f"m{compiled.backend.file_suffix}")
    output = compiled.native._mil_program.functions["main"].outputs[0].name
    script = ("import sys\nfrom coremltools.models.utils import load_spec\n"
              "spec = load_spec(sys.argv[1])\n"
              "assert not any(m.startswith(('exporter', 'tests')) for m in sys.modules)\n"
              "print(spec.WhichOneof('Type'), [i.name for i in spec.description.input], "
              "[o.name for o in spec.description.output], list(spec.description.input[0].type.multiArrayType.shape))\n")
    done = subprocess.run([sys.executable, "-c", script, file], check=True, capture_output=True, text=True, timeout=120)
    assert done.stdout.strip().splitlines()[-1] == f"mlProgram ['x'] [{output!r}] [1, 16]"


class BoolOr(torch.nn.Module):
    def forward(self, a, b):
        return ((a > 0) | (b > 0)).float() * a


class IntOr(torch.nn.Module):
    def forward(self, a, b):
        return a.long() | b.long()


def test_a_bool_or_converts_as_logical_or(tmp_path, monkeypatch):
    """coremltools converts no bitwise_or, and torch's decomposition ends in prims::bitwise_or: pt2b's
    repair makes a bool one logical_or; an integer one stays a typed error naming it."""
    from exporter.errors import OpsetError

    args = (torch.randn(3), torch.randn(3))
    export_model(BoolOr(), args, tmp_path / "or.pt2b")
    lowered = load_for_backend(tmp_path / "or.pt2b", backend="coreml", cache=False)
    assert "aten::logical_or.default" in lowered.ops() and lowered.validation.status == "passed"
    inputs, outputs = _mil(backends.to_backend(lowered))
    assert list(inputs) == ["a", "b"] and len(outputs) == 1
    export_model(IntOr(), args, tmp_path / "int_or.pt2b")
    with pytest.raises(OpsetError, match=r"aten::bitwise_or.Tensor \(1 call sites\): no decomposition reaches"):
        load_for_backend(tmp_path / "int_or.pt2b", backend="coreml", cache=False)
    monkeypatch.setattr(backends, "_CACHE", {**backends._CACHE, "coreml": dataclasses.replace(
        backends.get("coreml"), decompositions=dict)})
    with pytest.raises(OpsetError, match=r"prims::bitwise_or.default"):
        load_for_backend(tmp_path / "or.pt2b", backend="coreml", cache=False)


def test_a_check_of_a_value_read_from_a_tensor_converts(tmp_path, monkeypatch):
    from tests.support.helpers import a_check_of_a_value_is_taken

    compiled = a_check_of_a_value_is_taken("coreml", tmp_path, monkeypatch)
    assert {op.op_type for op in compiled.native._mil_program.functions["main"].operations} >= {"mul", "add"}


def test_a_grad_mode_region_converts(tmp_path, monkeypatch):
    """Core ML's frontend converts no torch._C._set_grad_enabled ("Unsupported fx node"): the hand-off
    leaves a no_grad region's markers out (checked by a run where Core ML runs)."""
    from tests.support.helpers import a_grad_mode_region_is_taken

    a_grad_mode_region_is_taken("coreml", tmp_path, monkeypatch)
