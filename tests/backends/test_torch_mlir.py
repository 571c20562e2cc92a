"""torch-mlir takes pt2b's lowering with its own op list (its torch dialect's ops) and decompositions: the
hand-off is its FX importer to linalg-on-tensors, run by pt2b's driver (the wheel's reference-backend
passes, MLIR's ExecutionEngine, the buffers it returns freed), close to eager on the zoo and a small Llama,
token-exact on a static-cache one, with the importer's and the conversion's defects routed around; the
hand-off check catches a wrong result; the buffers a program writes are carried; save() writes the
module that torch-mlir alone runs. torch-mlir needs its own venv
beside torch 2.13 (`pytest -m backends tests/backends/test_torch_mlir.py` there)."""

from __future__ import annotations

import copy
import dataclasses
import subprocess
import sys

import pytest
import torch

pytest.importorskip("torch_mlir.fx")

from exporter import backends, export_model, load_for_backend  # noqa: E402
from exporter.errors import BackendHandOffError, BackendResultError, BackendRunError  # noqa: E402

pytestmark = pytest.mark.backends
TOL = dict(rtol=1e-4, atol=1e-4)


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory):
    from tests.support.helpers import zoo_artifacts

    return zoo_artifacts(tmp_path_factory.mktemp("torch_mlir"))


def _eager(case, args=None):
    with torch.no_grad():
        return copy.deepcopy(case.pristine)(*(case.args if args is None else args), **(case.kwargs or {}))


def test_the_op_list_and_decompositions_are_torch_mlirs_own():
    from importlib.metadata import version

    from torch_mlir.dialects import torch as dialect
    from torch_mlir.extras.fx_decomp_util import get_decomposition_table

    b = backends.get("torch_mlir")
    assert b.key == f"torch_mlir@{version('torch-mlir')}" and "OPERATION_NAME" in b.source
    names = {getattr(c, "OPERATION_NAME", None) for c in vars(dialect).values()}
    listed = set(b.supported_ops)
    assert len(listed) > 500 and {"aten::addmm.default", "aten::add.Tensor", "prims::convert_element_type.default"} <= listed
    # each listed op is one of the dialect's (no overload: the default one), and ATen or PrimTorch
    assert all(f"torch.{n.replace('::', '.').removesuffix('.default')}" in names
               or f"torch.{n.replace('::', '.')}" in names for n in listed)
    assert "torch.prim.ListConstruct" in names and not any(n.startswith("prim::") for n in listed)
    assert set(b.decompositions()) == set(get_decomposition_table())
    assert not b.holds_state and b.takes_lifted_state and b.file_suffix == ".mlir"


@pytest.mark.parametrize("name", ["mlp", "cnn_bn", "transformer_encoder", "transformer_decoder",
                                  "multihead_attention", "kwargs_only", "tied_weights", "custom_op"])
def test_the_zoo_runs_on_torch_mlir_close_to_eager(artifacts, name):
    path, case = artifacts(name)
    lowered = load_for_backend(path, backend="torch_mlir", cache=False)
    assert set(lowered.ops()) <= set(backends.get("torch_mlir").supported_ops)
    compiled = backends.to_backend(lowered)
    assert compiled.validation.status == "passed" and compiled.validation.max_rel <= compiled.validation.bound
    assert "linalg." in str(compiled.native)  # the module the driver runs is linalg-on-tensors
    torch.testing.assert_close(compiled(*case.args, **(case.kwargs or {})), _eager(case), **TOL)


class _Merge(torch.nn.Module):
    def forward(self, x):
        b, n, d = x.shape
        return x.reshape(b * n, d) * 2


def test_a_view_that_merges_dynamic_dims_runs_right(artifacts):
    """torch-mlir's conversion narrows one of two merged dynamic dims to 1 (a (3, 5, 4) tensor viewed as
    (15, 4) comes out (3, 4), and the compiled code then writes out of bounds, so it is not run here);
    the hand-off views the flattened tensor instead, and the zoo's two dynamic dims run at other sizes."""
    from torch_mlir.fx import export_and_import

    x = torch.randn(3, 5, 4)
    dims = ({0: torch.export.Dim("b", min=2, max=32), 1: torch.export.Dim("n", min=2, max=64)},)
    ep = torch.export.export(_Merge(), (x,), dynamic_shapes=dims).run_decompositions({})
    own = str(export_and_import(ep, output_type="linalg-on-tensors", decomposition_table={}))
    assert "tensor<?x?x4xf32> to tensor<?x1x4xf32>" in own  # torch-mlir on its own: n taken as 1
    torch.testing.assert_close(backends.to_backend("torch_mlir", ep)(x), x.reshape(15, 4) * 2, rtol=0, atol=0)

    path, case = artifacts("dynamic_shapes")
    compiled = backends.to_backend(load_for_backend(path, backend="torch_mlir", cache=False))
    torch.manual_seed(1)
    for b, n in ((7, 2), (2, 11)):
        args = (torch.randn(b, n, 4), torch.randn(b, 8))
        torch.testing.assert_close(compiled(*args), _eager(case, args), **TOL)


class _Rotary(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("inv_freq", torch.arange(4.0), persistent=False)

    def forward(self, x):
        return x * self.inv_freq


def test_a_non_persistent_buffer_is_handed_over():
    """torch-mlir's import looks every buffer up in the state_dict, where torch keeps a non-persistent one
    among the constants (a Llama's rotary inv_freq); the hand-off gives it as a persistent one."""
    from torch_mlir.fx import export_and_import

    x = torch.randn(2, 4)
    ep = torch.export.export(_Rotary(), (x,))
    with pytest.raises(AssertionError, match="Could not find state mapping for buffer"):
        export_and_import(ep, output_type="linalg-on-tensors", decomposition_table={})
    compiled = backends.to_backend("torch_mlir", ep)
    torch.testing.assert_close(compiled(x), _Rotary()(x), rtol=0, atol=0)
    assert "inv_freq" in ep.constants and len(list(ep.graph.nodes)) == 4  # the program handed over is unchanged


class _Mask(torch.nn.Module):
    def forward(self, y):
        return y.new_ones([], dtype=torch.bool) & y & y.flip(0)


def test_a_true_bool_literal_and_the_bool_operators_are_routed_around():
    """torch-mlir folds ``new_ones([], dtype=torch.bool)`` (transformers' causal mask) into a bool literal
    its conversion to linalg refuses, and converts ``bitwise_and`` but not ``&`` on tensors: the hand-off
    rewrites both; the result is bit-exact."""
    from torch_mlir.fx import export_and_import

    y = torch.rand(3, 4) > 0.5
    ep = torch.export.export(_Mask(), (y,))
    with pytest.raises(Exception, match="Lowering Torch Backend IR -> Linalg-on-Tensors"):
        export_and_import(ep, output_type="linalg-on-tensors", decomposition_table={})
    compiled = backends.to_backend("torch_mlir", ep)
    torch_dialect = backends.to_backend("torch_mlir", ep, output_type="torch", validate=False).native
    assert "torch.aten.__and__" not in str(torch_dialect)
    for y in (y, torch.rand(3, 4) > 0.5):
        assert torch.equal(compiled(y), _Mask()(y))


def test_a_small_llama_runs_close_to_eager_at_another_batch_and_length(tmp_path):
    """A transformers Llama with a left-padded mask (those rows attend to nothing), batch and length
    dynamic: its rotary inv_freq, causal mask and merged views all routed around."""
    from tests.support.helpers import tiny_llama

    model, ids, mask = tiny_llama(padded=2)
    dims = {0: torch.export.Dim("batch", max=8), 1: torch.export.Dim("seq", max=32)}
    export_model(model, (), tmp_path / "llama.pt2b", kwargs={"input_ids": ids, "attention_mask": mask},
                 dynamic_shapes={"input_ids": dims, "attention_mask": dims})
    lowered = load_for_backend(tmp_path / "llama.pt2b", backend="torch_mlir", cache=False)
    assert any("inv_freq" in name for name in lowered.exported_program().constants)
    compiled = backends.to_backend(lowered)
    assert compiled.validation.status == "passed" and compiled.validation.max_rel <= compiled.validation.bound
    ids, mask = torch.randint(0, 64, (3, 11)), torch.ones(3, 11, dtype=torch.long)
    mask[0, :4] = 0
    with torch.no_grad():
        want = model(input_ids=ids, attention_mask=mask).logits
    torch.testing.assert_close(compiled(input_ids=ids, attention_mask=mask).logits, want, **TOL)


def test_a_static_cache_llama_generates_what_transformers_generates(tmp_path):
    from tests.support.helpers import generates_what_transformers_generates

    generates_what_transformers_generates(("torch_mlir",), tmp_path)


class _Big(torch.nn.Module):
    def forward(self, x):
        y = x * 2
        return x, y, y, y[:, 1:]


def test_the_buffers_the_compiled_code_returns_are_freed():
    """Each call's outputs (an input returned, one result returned twice, a slice: 3 MiB) are copied and
    their buffers freed: the process does not grow by them call after call."""
    import os

    def resident_mib():
        return int(open("/proc/self/statm").read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20

    x = torch.randn(256, 1024)
    compiled = backends.to_backend("torch_mlir", torch.export.export(_Big(), (x,)))
    for _ in range(10):  # the allocator settles
        compiled(x)
    before = resident_mib()
    for _ in range(60):  # 180 MiB, were they kept
        out = compiled(x)
    assert resident_mib() - before < 60
    torch.testing.assert_close(out, _Big()(x), rtol=0, atol=0)


def test_a_wrong_result_is_caught_at_the_hand_off(artifacts, monkeypatch):
    path, _ = artifacts("mlp")
    lowered = load_for_backend(path, backend="torch_mlir", cache=False)
    real = backends.get("torch_mlir")
    nudged = lambda *a, **k: real.run(*a, **k) * 1.01  # noqa: E731
    monkeypatch.setattr(backends, "_CACHE", {**backends._CACHE, "torch_mlir": dataclasses.replace(real, run=nudged)})
    with pytest.raises(BackendResultError, match=r"torch_mlir@.*: output \(torch.float32\) differs from the lowered "
                                                 r"program's by [0-9.e-]+ \(relative\), beyond 0.001"):
        backends.to_backend(lowered)
    assert backends.to_backend(lowered, validate=False).validation is None


def test_the_buffers_a_program_writes_carry_from_call_to_call(artifacts):
    """The frozen import binds buffers as constants: pt2b lifts the ones the program writes and carries them."""
    from tests.support.helpers import buffers_carry_from_call_to_call

    path, case = artifacts("buffer_mutation")
    compiled, _ = buffers_carry_from_call_to_call("torch_mlir", path, case)
    assert not compiled.backend.holds_state


def test_the_program_s_writes_into_its_inputs_reach_the_caller(tmp_path):
    from tests.support.helpers import input_writes_reach_the_caller

    input_writes_reach_the_caller("torch_mlir", tmp_path)


_SPECTRAL = """
import json, sys, torch
from exporter import backends, export_model, load_for_backend

class Cast(torch.nn.Module):
    def forward(self, x):
        return torch.ops.aten._to_copy.default(x * 2, dtype=torch.complex64)

class Spectral(torch.nn.Module):  # FNet's mixing: the real part of a 2-D FFT between two linears
    def __init__(self):
        super().__init__()
        self.a, self.b = torch.nn.Linear(8, 8), torch.nn.Linear(8, 8)

    def forward(self, x):
        return self.b(torch.fft.fftn(self.a(x), dim=(1, 2)).real)

torch.manual_seed(0)
x = torch.randn(2, 5, 8)
cast = backends.to_backend("torch_mlir", torch.export.export(Cast(), (x,)))
model = Spectral().eval()
export_model(model, (x,), sys.argv[1])
lowered = load_for_backend(sys.argv[1], backend="torch_mlir", fallback="reference", cache=False)
split = backends.to_backend(lowered, fallback="reference")
with torch.no_grad():
    print(json.dumps({"cast": torch.equal(cast(x), Cast()(x)), "on_reference": split.share.on_reference,
                      "nodes": [split.share.backend_nodes, split.share.nodes], "checked": split.validation.status,
                      "diff": (split(x) - model(x)).abs().max().item()}))
"""


def test_a_cast_to_complex_is_routed_around_and_fnet_s_mixing_runs_split(tmp_path):
    """torch-mlir aborts the process on a cast of a real tensor to complex (what ``fft`` of a real input
    lowers to): the hand-off makes it ``aten.complex`` of the value and zeros, which it converts. FNet's
    mixing then runs split with the reference taking the FFT alone (torch-mlir converts no ``_fft_c2c``),
    its complex part outputs checked within their float bound (run in a child: the abort ends it)."""
    import json

    run = subprocess.run([sys.executable, "-c", _SPECTRAL, str(tmp_path / "fnet.pt2b")], capture_output=True,
                         text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-2000:]
    got = json.loads(run.stdout.strip().splitlines()[-1])
    assert got["cast"] and got["checked"] == "passed" and got["diff"] < 1e-4
    assert got["on_reference"] == {"aten::_fft_c2c.default": 1} and got["nodes"][0] == got["nodes"][1] - 1


def test_what_torch_mlir_does_not_lower_is_a_typed_error(artifacts):
    """An op of the dialect that the conversion to linalg does not handle (the LSTM's), and another
    output type, which pt2b hands over but does not run."""
    path, case = artifacts("lstm")
    with pytest.raises(BackendHandOffError, match=r"torch_mlir@.* could not take the program: TorchMlirCompilerError: "
                                                  r"Lowering Torch Backend IR -> Linalg-on-Tensors"):
        backends.to_backend(load_for_backend(path, backend="torch_mlir", cache=False))
    path, case = artifacts("mlp")
    lowered = load_for_backend(path, backend="torch_mlir", cache=False)
    with pytest.raises(BackendHandOffError, match="torch-mlir has no output type 'llvm'"):
        backends.to_backend(lowered, output_type="llvm")
    tosa = backends.to_backend(lowered, output_type="tosa", validate=False)
    assert "tosa." in str(tosa.native)
    with pytest.raises(BackendRunError, match="pt2b runs torch-mlir's linalg-on-tensors output only"):
        tosa(*case.args)


def test_its_file_runs_with_torch_mlir_alone_in_a_fresh_process(artifacts, tmp_path):
    """The .mlir file parsed by torch-mlir's own ir, lowered by the reference-backend passes and run by
    its ExecutionEngine in a process with neither pt2b nor torch imported."""
    import numpy as np

    from exporter.backends.torch_mlir import PIPELINE, RETURN_PREFIX

    path, case = artifacts("mlp")
    compiled = backends.to_backend(load_for_backend(path, backend="torch_mlir", cache=False))
    file = compiled.save(tmp_path / f"m{compiled.backend.file_suffix}")
    x = torch.randn(9, 16)  # another batch: the module keeps the dim dynamic
    np.save(tmp_path / "x.npy", x.numpy())
    script = f"""import ctypes, sys, numpy as np
from torch_mlir import ir
import torch_mlir.dialects.torch  # registers torch-mlir's own passes (the reference backend's)
from torch_mlir.passmanager import PassManager
from torch_mlir.execution_engine import ExecutionEngine
from torch_mlir.runtime import UnrankedMemRefDescriptor, get_unranked_memref_descriptor, unranked_memref_to_numpy
with ir.Context():
    module = ir.Module.parse(open(sys.argv[1]).read())
    PassManager.parse({PIPELINE!r}).run(module.operation)
engine, out = ExecutionEngine(module), []
take = ctypes.CFUNCTYPE(None, ctypes.POINTER(UnrankedMemRefDescriptor))(
    lambda m: out.append(unranked_memref_to_numpy(m, np.float32).copy()))
engine.register_runtime({RETURN_PREFIX + "mrf32"!r}, take)
x = get_unranked_memref_descriptor(np.load(sys.argv[2]))
engine.invoke("main", ctypes.pointer(ctypes.pointer(x)))
np.save(sys.argv[3], out[0])
assert not any(m.startswith(("exporter", "torch.")) or m == "torch" for m in sys.modules)
"""
    done = subprocess.run([sys.executable, "-c", script, file, tmp_path / "x.npy", tmp_path / "y.npy"],
                          capture_output=True, timeout=120)
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    torch.testing.assert_close(torch.from_numpy(np.load(tmp_path / "y.npy")), _eager(case, (x,)), **TOL)


def test_a_grad_mode_region_runs(tmp_path, monkeypatch):
    """torch-mlir's importer converts no torch._C._set_grad_enabled ("Unimplemented call_function"): the
    hand-off leaves a no_grad region's markers out."""
    from tests.support.helpers import NoGrad, a_grad_mode_region_is_taken

    x = torch.randn(3, 4)
    compiled = a_grad_mode_region_is_taken("torch_mlir", tmp_path, monkeypatch)
    torch.testing.assert_close(compiled(x), NoGrad()(x), rtol=1e-5, atol=1e-5)


def test_checks_the_importer_cannot_convert_run_by_ops_or_are_left_out_where_proved(tmp_path, monkeypatch):
    """torch-mlir's importer converts no ``torch.sym_not`` nor ``|`` of checks, nor a Python call whose
    value the program's shapes fix (``8 >= 8``: "Unimplemented call_function"): the hand-off computes the
    first by ops, which the compiled module runs, and leaves out the proved ones."""
    from exporter.backends import torch_mlir

    from tests.support.helpers import CheckedCount, PlacedFeatures, placed_features_args

    x = torch.randn(6, 3)
    export_model(PlacedFeatures(), placed_features_args(), tmp_path / "p.pt2b")
    compiled = {}
    for model, program, python in (
            (CheckedCount(), torch.export.export(CheckedCount(), (x, torch.tensor([2, 2]))), "function sym_not"),
            (PlacedFeatures(), load_for_backend(tmp_path / "p.pt2b", backend="torch_mlir", cache=False),
             "built-in function ge")):
        with monkeypatch.context() as m:
            m.setattr(torch_mlir, "FX_IMPORTER_REPAIRS", ())
            with pytest.raises(BackendHandOffError, match=f"Unimplemented call_function: target=<{python}"):
                backends.to_backend("torch_mlir", program)
        compiled[type(model)] = backends.to_backend("torch_mlir", program)
        assert compiled[type(model)].validation.status == "passed"
    for counts in (torch.tensor([4, 0]), torch.tensor([0, 0])):
        torch.testing.assert_close(compiled[CheckedCount](x, counts), CheckedCount()(x, counts))
    y, ids, features = torch.randn(2, 5, 4), torch.tensor([[1, 7, 1, 1, 1], [1, 1, 1, 1, 7]]), torch.randn(2, 4)
    torch.testing.assert_close(compiled[PlacedFeatures](y, ids, features), PlacedFeatures()(y, ids, features))


def test_a_check_of_a_value_read_from_a_tensor_runs(tmp_path, monkeypatch):
    """The read's range checks follow it as ``ite >= 0``, whose value the program fixes (True), which the
    importer does not convert: left out, with the sym_ite given as ops; the others run."""
    from tests.support.helpers import CheckedIds, a_check_of_a_value_is_taken

    compiled = a_check_of_a_value_is_taken("torch_mlir", tmp_path, monkeypatch)
    for x, ids in ((torch.randn(3), torch.tensor([1, 2])), (torch.ones(3), torch.tensor([4, 0]))):
        torch.testing.assert_close(compiled(x, ids), CheckedIds()(x, ids))
