"""What a file needs to load, said before it fails: a file whose outputs are transformers' types loads
wherever transformers is installed without --import (pt2b imports only a well-known library's output
types, never a module a file names otherwise); `pt2b verify` and Pt2bProgram.needs() list the pytree types,
custom ops, tensor subclasses and device-specific ops a file needs; a drift golden `pt2b verify` calls OK
fails in `pt2b run` with a typed error saying what to do, not torch's dispatcher traceback."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys
import textwrap

import pytest
import torch

from exporter import cli, export_model, load
from exporter.errors import MissingPytreeTypeError, OpsetError
from exporter.serialize.read import pytree_types
from runtime_ref import Runtime
from tests.support.helpers import file_naming_pytree_type, tiny_bert_artifact

ROOT = pathlib.Path(__file__).resolve().parents[2]
DRIFT = ROOT / "tests" / "golden" / "drift"
MPS_ONLY = "aten::_scaled_dot_product_attention_math_for_mps.default"


def test_a_transformers_output_file_loads_without_import_where_transformers_is_installed(tmp_path):
    model, ids = tiny_bert_artifact(tmp_path / "bert.pt2b")
    torch.save({"ids": ids, "want": model(ids).last_hidden_state}, tmp_path / "io.pt")
    code = textwrap.dedent("""
        import sys, torch
        from exporter import load
        io = torch.load("io.pt")
        prog = load("bert.pt2b")
        before = "transformers" in sys.modules
        out = prog(io["ids"])
        print(before, type(out).__module__, type(out).__name__, torch.equal(out.last_hidden_state, io["want"]))
    """)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    run = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.split() == ["False", "transformers.modeling_outputs", "BaseModelOutputWithPoolingAndCrossAttentions",
                                  "True"]


def test_a_type_of_any_other_module_is_never_imported(tmp_path, monkeypatch):
    """A module the file names, on the path and registering the type when imported, stays unimported: a
    file never chooses the code pt2b runs."""
    (tmp_path / "needs_probe_lib.py").write_text("IMPORTED = True\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    path = file_naming_pytree_type(tmp_path, monkeypatch, "needs_probe_lib.Out")
    with pytest.raises(MissingPytreeTypeError, match=r"o\.pt2b: the program's inputs or outputs use the Python type "
                                                     r"'needs_probe_lib\.Out', which no imported module registers "
                                                     r"with torch's pytree: import the library that defines it first"):
        load(path)(torch.randn(2))
    assert "needs_probe_lib" not in sys.modules


def test_verify_refuses_a_file_whose_type_this_process_lacks(tmp_path, monkeypatch, capsys):
    """`pt2b verify` called such a file OK, and its first call failed."""
    path = file_naming_pytree_type(tmp_path, monkeypatch, "needs_probe_other.Out")
    assert cli.main(["verify", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"pt2b: artifact error (MissingPytreeTypeError): {path}: the program's inputs or outputs use the "
                          "Python type 'needs_probe_other.Out'") and "pt2b --import MODULE" in err
    assert load(path).needs().missing == {"needs_probe_other.Out": (
        "not registered: import the library that defines it first (from the command line: pt2b --import MODULE ...); "
        "pt2b imports only a well-known library's output types by itself (transformers' model outputs)")}


def test_a_library_module_that_is_not_there_says_what_to_do():
    assert pytree_types.library_module("transformers.modeling_outputs.X") == ("transformers", "transformers.modeling_outputs")
    assert pytree_types.library_module("transformers.models.llama.modeling_llama.X") == (
        "transformers", "transformers.models.llama.modeling_llama")
    assert pytree_types.library_module("transformers.utils.X") is None  # only output-type modules
    assert pytree_types.library_module("os.X") is None
    pytest.importorskip("transformers")
    name = "transformers.models.no_such_model.modeling_no_such_model.Out"
    assert pytree_types.advice(name) == ("this transformers release has no module "
                                         "transformers.models.no_such_model.modeling_no_such_model: use the "
                                         "transformers release the file was written with")
    assert pytree_types.register_from_libraries({name}) == {}


def test_verify_and_needs_list_what_a_transformers_file_needs(tmp_path, capsys):
    path = tmp_path / "bert.pt2b"
    tiny_bert_artifact(path)
    name = "transformers.modeling_outputs.BaseModelOutputWithPoolingAndCrossAttentions"
    needs = load(path).needs()
    how = "registered by transformers.modeling_outputs (pt2b imports it where transformers is installed)"
    assert needs.pytree_types == {name: how} and not needs.missing
    assert needs.custom_ops == {} and needs.tensor_subclasses == {} and needs.device_ops == {}
    assert cli.main(["verify", str(path)]) == 0
    out = capsys.readouterr().out.split("\n")
    assert out[0].startswith(f"{path}: OK (program and ") and out[1:3] == [
        f"{path}: needs to load:", f"  pytree type {name}: {how}"]


def test_a_file_of_torch_alone_needs_nothing_more(tmp_path, capsys):
    path = tmp_path / "m.pt2b"
    export_model(torch.nn.Linear(2, 2), (torch.randn(1, 2),), path)
    assert load(path).needs().lines() == []
    assert cli.main(["verify", str(path)]) == 0
    assert capsys.readouterr().out.split("\n")[1:] == [""]  # the verdict alone


@pytest.mark.parametrize("golden", sorted(DRIFT.glob("*/sdpa_math_for_mps.pt2b")), ids=lambda p: p.parent.name)
def test_a_drift_golden_with_an_mps_only_op_says_so_in_verify_and_is_an_opset_error_in_run(golden, capsys):
    if not torch.backends.mps.is_available():
        assert load(golden).needs().device_ops == {MPS_ONLY: []}
        with pytest.raises(OpsetError, match=rf"program calls 1 operator\(s\) this torch has no cpu kernel for, so the "
                                             rf"reference runtime cannot run them on cpu:\n  {MPS_ONLY}: no kernel"):
            Runtime(load(golden))
    assert cli.main(["verify", str(golden)]) == 0
    assert f"  device-specific op {MPS_ONLY}: " in capsys.readouterr().out


def test_pt2b_run_of_the_mps_only_golden_is_a_typed_error(capsys):
    """Every other drift golden runs (tests/releases); this one ended in torch's NotImplementedError."""
    if torch.backends.mps.is_available():
        pytest.skip("this torch runs the op")
    assert cli.main(["run", str(DRIFT / "torch-2.13.0" / "sdpa_math_for_mps.pt2b"), "--no-cache"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("pt2b: error (OpsetError): program calls 1 operator(s) this torch has no cpu kernel for")
    assert "load_for_backend(..., decompositions={op: fn})" in err and "Traceback" not in err
