"""What `pt2b verify` and the writer's read-back skip without checking less: verify finds a transformers
output type by its module's source and never imports transformers (a load imports it where it builds the
program); the read-back builds the program as load() does, generating no Python code for its graph modules."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys
import textwrap

import pytest
import torch

from exporter import cli, export_model, load
from exporter._torch.deferred_codegen import is_deferred
from exporter.serialize.read import pytree_types, reader
from tests.support.helpers import file_naming_pytree_type, tiny_bert_artifact

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_verify_of_a_transformers_output_file_does_not_import_transformers(tmp_path):
    _, _ = tiny_bert_artifact(tmp_path / "bert.pt2b")
    code = textwrap.dedent("""
        import sys
        from exporter import cli
        code = cli.main(["verify", "bert.pt2b"])
        print("exit", code, "transformers imported:", "transformers" in sys.modules)
    """)
    run = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(ROOT)},
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    lines = run.stdout.splitlines()
    assert lines[0].startswith("bert.pt2b: OK (program and ")
    assert lines[-1] == "exit 0 transformers imported: False"
    assert ("  pytree type transformers.modeling_outputs.BaseModelOutputWithPoolingAndCrossAttentions: registered "
            "by transformers.modeling_outputs (pt2b imports it where transformers is installed)") in lines


def test_a_transformers_type_its_release_does_not_define_is_refused_by_verify(tmp_path, monkeypatch, capsys):
    """Found without importing: the module's source defines no such class, so a load would fail."""
    pytest.importorskip("transformers")
    name = "transformers.modeling_outputs.NoSuchModelOutput"
    path = file_naming_pytree_type(tmp_path, monkeypatch, name)
    assert pytree_types.unfindable({name}) == [name]
    assert cli.main(["verify", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"pt2b: artifact error (MissingPytreeTypeError): {path}: the program's inputs or outputs use "
                          f"the Python type {name!r}, which no imported module registers with torch's pytree: this "
                          f"transformers release's transformers.modeling_outputs defines no class NoSuchModelOutput: "
                          f"use the transformers release the file was written with."), err


def test_a_defined_transformers_type_is_found_without_import():
    pytest.importorskip("transformers")
    assert pytree_types.unfindable({"transformers.modeling_outputs.BaseModelOutputWithPast",
                                    "transformers.models.llama.modeling_llama.LlamaModel",
                                    "transformers.models.llama.modeling_llama.NoSuchOutput",
                                    "builtins.tuple"}) == ["transformers.models.llama.modeling_llama.NoSuchOutput"]


def test_the_read_back_generates_no_code_and_the_program_still_runs(tmp_path, monkeypatch):
    """The writer's read-back (reader.read_programs) builds each graph module without generating its
    Python code, as load() does; the program it returns generates it on its first run."""
    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(4, 3)

        def forward(self, x):
            return torch.relu(self.lin(x)) * 2

    m, x = M().eval(), torch.randn(2, 4)
    path = tmp_path / "m.pt2b"
    export_model(m, (x,), path)
    made = []
    real = torch.fx.Graph.python_code
    monkeypatch.setattr(torch.fx.Graph, "python_code", lambda self, *a, **k: made.append(1) or real(self, *a, **k))
    ep = reader.read_programs(path)["forward"]
    assert made == [] and is_deferred(ep.graph_module)
    assert torch.equal(ep.module()(x), m(x))
    assert made  # generated once run
    assert torch.equal(load(path)(x), m(x))
