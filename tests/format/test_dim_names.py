"""Issue 39: the user's Dim names (torch.export.Dim("batch")) survive into the artifact: load(), a lowered
program, runtime_ref and `pt2b inspect` name a dynamic dim by them ("batch (s17)"), where torch
writes only its symbol."""

from __future__ import annotations

import re

import pytest
import torch

from exporter import export_model, load, load_for_backend
from exporter.cli.inspect import summarize
from tools.corpus.zoo import make_case
from exporter.errors import RuntimeInputError
from runtime_ref import Runtime, runtimes


@pytest.fixture(scope="module")
def artifact(tmp_path_factory):
    case = make_case("dynamic_shapes")  # Dim("batch", min=2, max=32) shared by x and y, Dim("seq", 2..64)
    path = tmp_path_factory.mktemp("dims") / "dyn.pt2b"
    export_model(case.model, case.args, path, dynamic_shapes=case.dynamic_shapes)
    return path


def _symbols(program) -> dict[str, str]:
    """Dim name -> symbol, read from the program's placeholders (what torch itself records)."""
    ep = program.exported_program()
    x = next(n for n in ep.graph.nodes if n.name == "x")
    b, s, _ = x.meta["val"].shape
    return {"batch": str(b.node.expr), "seq": str(s.node.expr)}


def test_the_artifact_records_the_names(artifact):
    prog = load(artifact)
    sym = _symbols(prog)
    assert {k: v for k, v in prog.provenance.items() if k.startswith("dim:")} == \
        {f"dim:{sym['batch']}": "batch", f"dim:{sym['seq']}": "seq"}
    text = summarize(artifact)
    assert f"  {sym['batch']} (batch): [2, 32]" in text and f"  {sym['seq']} (seq): [2, 64]" in text


@pytest.mark.parametrize("how", ["load", "lowered", "runtime_ref"])
def test_out_of_range_errors_use_the_names(artifact, how):
    prog = load(artifact)
    sym = _symbols(prog)
    run = {"load": lambda: prog, "lowered": lambda: load_for_backend(artifact, "core", cache=False),
           "runtime_ref": lambda: Runtime(load_for_backend(artifact, "core", cache=False))}[how]()
    with pytest.raises(RuntimeInputError, match=re.escape(f"outside the range [2, 32] of its dynamic dim batch "
                                                          f"({sym['batch']})")):
        run(torch.randn(40, 5, 4), torch.randn(40, 8))
    with pytest.raises(RuntimeInputError, match=re.escape(f"outside the range [2, 64] of its dynamic dim seq "
                                                          f"({sym['seq']})")):
        run(torch.randn(3, 1, 4), torch.randn(3, 8))


def test_each_method_keeps_its_own_names(tmp_path):
    class Two(torch.nn.Module):
        def forward(self, x):
            return x * 2

    m, dim = Two(), torch.export.Dim
    export_model({"rows": (m, (torch.randn(4, 3),)), "cols": (m, (torch.randn(3, 4),))}, tmp_path / "two.pt2b",
                 dynamic_shapes={"rows": ({0: dim("n_rows", max=10)},), "cols": ({1: dim("n_cols", max=10)},)})
    rt = runtimes(load(tmp_path / "two.pt2b"))
    with pytest.raises(RuntimeInputError, match=r"dynamic dim n_rows \(s\d+\)"):
        rt["rows"](torch.randn(11, 3))
    with pytest.raises(RuntimeInputError, match=r"dynamic dim n_cols \(s\d+\)"):
        rt["cols"](torch.randn(3, 11))
    text = summarize(tmp_path / "two.pt2b")
    assert re.search(r"s\d+ \(n_rows\): \[\d+, 10\]", text) and re.search(r"s\d+ \(n_cols\): \[\d+, 10\]", text)



def test_methods_sharing_a_symbol_keep_their_own_names_when_lowered_and_written_again(tmp_path):
    """Two methods dynamic in the same input dim get the same symbol from torch, under different names;
    lowered and written again (what `pt2b lower -o` does), each still names its own."""
    class Two(torch.nn.Module):
        def forward(self, x):
            return x * 2

    m, dim = Two(), torch.export.Dim
    export_model({"small": (m, (torch.randn(4, 3),)), "large": (m, (torch.randn(5, 3),))}, tmp_path / "two.pt2b",
                 dynamic_shapes={"small": ({0: dim("small_batch", max=10)},),
                                 "large": ({0: dim("large_batch", max=20)},)})
    prog = load(tmp_path / "two.pt2b")
    assert set(prog["small"].dim_names) == set(prog["large"].dim_names)  # one symbol, two names
    export_model(load_for_backend(tmp_path / "two.pt2b", "core", cache=False).methods, tmp_path / "low.pt2b")
    for path in (tmp_path / "two.pt2b", tmp_path / "low.pt2b"):
        rt = runtimes(load(path))
        with pytest.raises(RuntimeInputError, match=r"dynamic dim small_batch \(s\d+\)"):
            rt["small"](torch.randn(11, 3))
        with pytest.raises(RuntimeInputError, match=r"dynamic dim large_batch \(s\d+\)"):
            rt["large"](torch.randn(21, 3))


def test_a_program_without_names_keeps_torchs_symbols(tmp_path):
    """A program read back from a file and written again has no capturing process to ask: torch's symbols."""
    case = make_case("dynamic_shapes")
    ep = torch.export.export(case.model, case.args, dynamic_shapes=case.dynamic_shapes)
    torch.export.save(ep, tmp_path / "dyn.pt2")
    export_model(torch.export.load(tmp_path / "dyn.pt2"), path=tmp_path / "again.pt2b")
    prog = load(tmp_path / "again.pt2b")
    assert not [k for k in prog.provenance if k.startswith("dim:")]
    with pytest.raises(RuntimeInputError, match=r"of its dynamic dim s\d+\.$"):
        prog(torch.randn(40, 5, 4), torch.randn(40, 8))
