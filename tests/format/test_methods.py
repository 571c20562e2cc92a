"""Artifacts with several entry points (format 1.2): methods captured from one model share its
weights (one segment per storage), load as ``prog.methods``, lower with one request, and run on
runtime_ref over one state, so a decode step continues what prefill wrote to the KV cache."""

from __future__ import annotations

import copy

import pytest
import torch

from tests.support.artifact_surgery import damage_graph_table
from exporter import export_model, load, load_for_backend
from exporter.errors import CorruptArtifactError, ExportError, MethodNotFoundError
from exporter.serialize import reader
from exporter.versioning.formats import FORMAT_VERSION
from tools.corpus.methods import MAX_LEN, TinyKV
from runtime_ref import Runtime, runtimes

PROMPT = torch.tensor([3, 14, 15, 9])


def methods_of(m):
    return {"prefill": (m, (PROMPT, torch.arange(4))), "decode": (m, (torch.tensor([7]), torch.tensor([4])))}


def generate(call, n_new: int = 6) -> list[int]:
    """Greedy tokens: prefill the prompt, then one decode step per token, through ``call(method, *args)``."""
    token = int(call("prefill", PROMPT, torch.arange(len(PROMPT)))[-1].argmax())
    out = [token]
    for pos in range(len(PROMPT), len(PROMPT) + n_new - 1):
        token = int(call("decode", torch.tensor([token]), torch.tensor([pos]))[-1].argmax())
        out.append(token)
    return out


def eager_tokens() -> list[int]:
    m = TinyKV().eval()
    return generate(lambda name, *a: m(*a))


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    d = tmp_path_factory.mktemp("methods")
    m = TinyKV().eval()
    export_model(m, (PROMPT, torch.arange(4)), d / "single.pt2b")
    eps = export_model(methods_of(m), d / "two.pt2b")
    assert list(eps) == ["prefill", "decode"]
    assert not m.k_cache.any(), "capturing a method must not run it"
    return d


def test_methods_load_share_storage_and_generate_as_eager(written):
    prog = load(written / "two.pt2b")
    assert list(prog.methods) == ["prefill", "decode"] and prog.method == "prefill"
    assert prog["decode"].method == "decode" and prog.format_version == FORMAT_VERSION
    expected = eager_tokens()
    assert len(set(expected)) > 1
    assert generate(lambda name, *a: prog[name](*a)) == expected  # the KV cache is one set of mapped bytes
    # the same weights and the same cache, once; only the methods' example inputs are their own
    single, two = (reader.open_artifact(written / f"{n}.pt2b") for n in ("single", "two"))
    state = [{r.name: r.segment for r in reader.method(two, n).program.tensors if r.kind != 3} for n in two.method_names]
    assert state[0] == state[1] and len(state[0]) == 7
    assert len(two.program.segments) == len(single.program.segments) + 2  # decode's ids and position
    assert two.header.data_size == single.header.data_size + 2 * 64


def test_each_method_is_bitwise_its_exported_program(written):
    m = TinyKV().eval()
    eps = {name: torch.export.export(mod, args) for name, (mod, args) in methods_of(m).items()}
    prog = load(written / "two.pt2b")
    for name, (_, args) in methods_of(TinyKV()).items():
        assert torch.equal(prog[name](*args), eps[name].module()(*args))
        assert prog[name].ops() == load(written / "single.pt2b").ops()


@pytest.mark.parametrize("cached", [False, True])
def test_lowered_methods_run_over_one_state_on_runtime_ref(written, tmp_path, monkeypatch, cached):
    monkeypatch.setenv("PT2B_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("PT2B_CACHE", raising=False)
    lowered = load_for_backend(written / "two.pt2b", "core")
    assert not any(low.from_cache for low in lowered.methods.values())
    if cached:
        lowered = load_for_backend(written / "two.pt2b", "core")
        assert all(low.from_cache for low in lowered.methods.values())
    assert list(lowered.methods) == ["prefill", "decode"]
    assert all(low.validation.status == "passed" for low in lowered.methods.values())
    rts = runtimes(lowered)
    assert generate(lambda name, *a: rts[name](*a)) == eager_tokens()
    assert rts["decode"].state_dict()["k_cache"] is rts["prefill"].state_dict()["k_cache"]
    assert rts["decode"].state_dict()["emb.weight"] is rts["prefill"].state_dict()["emb.weight"]
    assert rts["decode"].state_dict()["k_cache"][:len(PROMPT) + 5].all(-1).all()  # written by both
    # separate runtimes each hold their own copy of the cache: decode then sees no prefill
    alone = {name: Runtime(low) for name, low in lowered.methods.items()}
    assert generate(lambda name, *a: alone[name](*a)) != eager_tokens()
    # the loaded program itself is never written to
    assert not load_for_backend(written / "two.pt2b", "core").exported_program().state_dict["k_cache"].any()


def test_one_method_lowered_by_name(written, tmp_path, monkeypatch):
    monkeypatch.setenv("PT2B_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("PT2B_CACHE", raising=False)
    low = load_for_backend(written / "two.pt2b", "core", method="decode")
    assert load_for_backend(written / "two.pt2b", "core", method="decode").from_cache
    assert low.method == "decode" and list(low.methods) == ["decode"]
    with pytest.raises(MethodNotFoundError, match=r"no method 'verify'; the artifact holds prefill, decode\."):
        load_for_backend(written / "two.pt2b", "core", method="verify")


def test_missing_method_is_a_typed_key_error(written):
    prog = load(written / "two.pt2b")
    with pytest.raises(KeyError) as info:
        prog["embed"]
    assert isinstance(info.value, MethodNotFoundError)
    assert str(info.value).endswith("no method 'embed'; the artifact holds prefill, decode.")


def test_bound_methods_and_programs_as_methods(tmp_path):
    m = TinyKV().eval()
    ids = torch.tensor([1, 2, 3])
    ep = torch.export.export(m, (PROMPT, torch.arange(4)))
    export_model({"forward": ep, "embed": (m.embed, (ids,))}, tmp_path / "a.pt2b")
    prog = load(tmp_path / "a.pt2b")
    assert torch.equal(prog["embed"](ids), m.embed(ids))
    assert [k for k in prog["embed"].exported_program().state_dict] == ["emb.weight"]  # what it reads
    export_model({"forward": ep, "embed": (m.embed, (ids,))}, tmp_path / "b.pt2b", keep_unused_weights=True)
    assert [k for k in load(tmp_path / "b.pt2b")["embed"].exported_program().state_dict] == [
        "emb.weight", "k.weight", "k.bias", "v.weight", "v.bias", "k_cache", "v_cache"]  # the owner's, by name


def test_single_method_artifacts_are_unchanged(written):
    art = reader.open_artifact(written / "single.pt2b")
    assert art.program.defaultMethod is None and art.program.methods is None
    assert art.method_names == ("forward",)
    assert list(load(written / "single.pt2b").methods) == ["forward"]


def test_older_format_refuses_several_methods(tmp_path):
    with pytest.raises(ExportError, match=r"format 1\.1 cannot hold this program: .*Program\.methods \(the program's "
                                          r"other entry points"):
        export_model(methods_of(TinyKV()), tmp_path / "a.pt2b", format_version="1.1")
    assert not (tmp_path / "a.pt2b").exists()
    export_model({"forward": methods_of(TinyKV())["prefill"]}, tmp_path / "b.pt2b", format_version="1.1")
    assert load(tmp_path / "b.pt2b").format_version == (1, 1)


@pytest.mark.parametrize("names, message", [
    ({"pre fill": 0}, r"method name 'pre fill' is not a Python identifier"),
    ({"class": 0}, r"method name 'class' is not a Python identifier"),
    ({}, r"an artifact needs at least one method"),
])
def test_bad_method_names_are_refused(tmp_path, names, message):
    m = TinyKV()
    spec = {name: methods_of(m)["prefill"] for name in names}
    with pytest.raises(ExportError, match=message):
        export_model(spec, tmp_path / "a.pt2b")


def test_bad_method_entries_are_refused(tmp_path):
    m = TinyKV()
    with pytest.raises(ExportError, match=r"method 'decode' must be \(module_or_bound_method, args\[, kwargs\]\)"):
        export_model({"decode": m}, tmp_path / "a.pt2b")
    with pytest.raises(ExportError, match=r"method 'decode' must be an nn.Module or a bound method of one"):
        export_model({"decode": (len, (PROMPT,))}, tmp_path / "a.pt2b")
    with pytest.raises(ExportError, match=r"dynamic_shapes is a dict by method name \(prefill, decode\)"):
        export_model(methods_of(m), tmp_path / "a.pt2b", dynamic_shapes={"verify": None})
    with pytest.raises(ExportError, match=r"give each method's example inputs in its entry"):
        export_model(methods_of(m), (PROMPT,), tmp_path / "a.pt2b")


def test_dynamic_shapes_by_method(tmp_path):
    m = TinyKV().eval()
    seq = torch.export.Dim("seq", max=MAX_LEN)
    export_model(methods_of(m), tmp_path / "a.pt2b", dynamic_shapes={"prefill": ({0: seq}, {0: seq})})
    prog = load(tmp_path / "a.pt2b")
    out = prog["prefill"](PROMPT[:3], torch.arange(3))
    assert torch.equal(out, TinyKV().eval()(PROMPT[:3], torch.arange(3)))


def test_a_damaged_method_graph_is_refused_at_its_first_use(written, tmp_path):
    path = damage_graph_table(tmp_path, written / "two.pt2b", method="decode")
    prog = load(path)  # the op tables and records are sound; the graphs are walked on first use
    assert torch.equal(prog(PROMPT, torch.arange(4)), load(written / "two.pt2b")(PROMPT, torch.arange(4)))
    for _ in range(2):
        with pytest.raises(CorruptArtifactError, match=r"program section is malformed: Program\.methods\[0\]\."
                                                       r"exported_program \(ExportedProgram\) vtable at byte"):
            prog["decode"].check()


def test_upgrade_keeps_every_method(written, tmp_path):
    from exporter.cli.upgrade import upgrade_file

    res = upgrade_file(written / "two.pt2b", tmp_path / "up.pt2b", to=(1, 2))
    new = load(tmp_path / "up.pt2b", verify=True)
    assert list(new.methods) == ["prefill", "decode"]
    assert generate(lambda name, *a: new[name](*a)) == eager_tokens()
    assert not res.changes or res.written


def test_cli_inspect_lower_and_run_by_method(written, tmp_path, capsys):
    from exporter import cli

    assert cli.main(["inspect", str(written / "two.pt2b")]) == 0
    out = capsys.readouterr().out
    assert "methods (2): prefill, decode (default: prefill)" in out
    assert "method decode (7 tensors shared with other methods):" in out
    assert "    buffer     k_cache: float32[12, 16] (shared with prefill)" in out
    assert cli.main(["lower", str(written / "two.pt2b"), "--no-cache", "-o", str(tmp_path / "low.pt2b")]) == 0
    out = capsys.readouterr().out
    assert "method prefill: " in out and "method decode: " in out
    low = load(tmp_path / "low.pt2b")
    assert list(low.methods) == ["prefill", "decode"] and low["decode"].lowering["request"].startswith("core")
    assert cli.main(["run", str(written / "two.pt2b"), "--no-cache", "--method", "decode"]) == 0
    assert capsys.readouterr().out.startswith("output 0: float32[1, 50]  min ")
    assert cli.main(["run", str(written / "two.pt2b"), "--no-cache", "--method", "verify"]) == 2
    assert "no method 'verify'; the artifact holds prefill, decode." in capsys.readouterr().err


def test_coverage_and_explorer_count_every_method(written):
    from exporter.explorer import coverage
    from exporter.explorer.corpus import artifact_corpus
    from exporter.explorer.page import build_data

    single_ops = load_for_backend(written / "single.pt2b", "core", cache=False).ops()
    row, = coverage.measure([written / "two.pt2b"], "core")
    assert row.covered and row.ops == {op: 2 * n for op, n in single_ops.items()}  # prefill's and decode's
    prog, = artifact_corpus([written / "two.pt2b"])
    assert len(prog.more) == 1
    one, = artifact_corpus([written / "single.pt2b"])
    data = build_data([prog, one])
    two_model, one_model = data["models"]
    assert len(two_model["trees"]) == 2 * len(one_model["trees"]) > 0
    assert two_model["leaves"] == one_model["leaves"]


def test_verify_walks_every_method(written, tmp_path, capsys):
    from exporter import cli

    assert cli.main(["verify", str(written / "two.pt2b")]) == 0
    assert "OK (2 methods and " in capsys.readouterr().out
    path = damage_graph_table(tmp_path, written / "two.pt2b", method="decode")
    assert cli.main(["verify", str(path)]) == 2
    assert "Program.methods[0].exported_program (ExportedProgram) vtable at byte" in capsys.readouterr().err


def test_the_reader_refuses_bad_method_names(tmp_path, monkeypatch):
    """What the writer's own check would refuse, the reader refuses too (the writer reads every file back)."""
    from exporter.serialize import writer

    monkeypatch.setattr(writer, "check_method_names", lambda names: None)
    m = TinyKV()
    with pytest.raises(ExportError, match=r"pt2b would refuse to load what it was about to write, so .* was not "
                                          r"written: CorruptArtifactError: .*: method name 'class' is not a Python "
                                          r"identifier; the file is damaged\."):
        export_model({"prefill": methods_of(m)["prefill"], "class": methods_of(m)["decode"]}, tmp_path / "a.pt2b")
    assert not list(tmp_path.iterdir())


def test_a_1_1_reader_sees_the_default_method(written):
    """The 1.1 schema reads a multi-method artifact's program section as a well-formed 1.1 program: the
    default method, complete (a minor bump's promise, checked with the released 1.1 schema's layout)."""
    import pathlib

    from exporter.layout import fbs
    from exporter.serialize.read import buffer_bounds

    old = fbs.parse((pathlib.Path(__file__).parents[2] / "schemas/history/1.1/pt2b.fbs").read_text())
    assert "Method" not in old.tables and "Method" in fbs.layout().tables
    art = reader.open_artifact(written / "two.pt2b")
    h = art.header
    program = (written / "two.pt2b").read_bytes()[h.program_offset:h.program_offset + h.program_size]
    assert buffer_bounds.problem(program, old) is None
    assert buffer_bounds.problem(program) is None
    fields = [f.name for f in old.tables["Program"]]
    later = [f.name for f in fbs.layout().tables["Program"] if f.since is not None and f.since > (1, 1)]
    assert later == ["default_method", "methods", "weight_digests", "tensor_subclasses"]
    assert "methods" not in fields and len(fields) == len(fbs.layout().tables["Program"]) - len(later)
