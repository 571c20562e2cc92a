"""Nothing from a file reaches a parser or a recursive walk nested deeper than pt2b reads: each hostile
file of issue 63 (items 1 and 9) rebuilt here, each gets a typed error from every command it reaches,
and what real programs and torch's own schemas hold stays far within the caps."""

import json
import pathlib
import re
import subprocess
import sys

import msgpack
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.support.artifact_surgery import rewrite_artifact
from exporter import export_model, load, load_for_backend
from exporter.cli import main as cli
from tools.corpus.zoo import make_case
from exporter.errors import CorruptArtifactError, ExportError, SchemaDriftError
from exporter.lowering.validate import Validation
from exporter.serialize import reader
from exporter.serialize.read import untrusted
from exporter.util import nesting
from exporter.versioning import schema_drift

ROOT = pathlib.Path(__file__).resolve().parents[2]
TYPED = "pt2b: artifact error (CorruptArtifactError): "


def _exported(tmp_path, case="mlp", name="m.pt2b", **kw) -> pathlib.Path:
    c = make_case(case)
    path = tmp_path / name
    export_model(c.model, c.args, path, kwargs=c.kwargs, dynamic_shapes=c.dynamic_shapes, **kw)
    return path


def _nested(levels: int, leaf=1):
    for _ in range(levels):
        leaf = [leaf]
    return leaf


def _cli(capsys, *argv) -> tuple[int, str]:
    code = cli(["--quiet", *map(str, argv)])
    out = capsys.readouterr()
    assert "Traceback" not in out.err + out.out
    return code, out.err


# ---- the helper itself ----

def test_bracket_depth_reads_string_literals_as_the_parser_does():
    assert nesting.bracket_depth("a(b[c]{d})") == 2
    assert nesting.bracket_depth("") == 0
    # closers inside literals cannot hide the nesting outside them
    assert nesting.bracket_depth('[ "]" [ "]" [ "]" [', '"') == 4
    assert nesting.bracket_depth('[ "]" [ "]" [ "]" [') == 1  # (what a scan that ignored literals would see)
    assert nesting.bracket_depth(r'["a\"]]" [1]]', '"') == 2  # an escaped quote does not end the literal
    assert nesting.bracket_depth("x='(' ((y))", "\"'") == 2
    assert nesting.bracket_depth('(("((((', '"') == 2  # a literal left open runs to the end (refused there)


@settings(max_examples=200, deadline=None)
@given(st.recursive(st.none() | st.integers() | st.text(alphabet='[]{}()"\\\' ab'),
                    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner, max_size=3),
                    max_leaves=30))
def test_bracket_depth_of_json_is_the_depth_of_the_value(value):
    """Exact for JSON: strings full of brackets, quotes and backslashes count nothing."""
    depth = 0 if not isinstance(value, (list, dict)) else next(
        d for d in range(1, 100) if not nesting.deeper_than(value, d))
    assert nesting.bracket_depth(json.dumps(value), '"') == depth


def test_deeper_than_counts_levels_without_recursing():
    assert not nesting.deeper_than(1, 0)
    assert nesting.deeper_than([], 0) and not nesting.deeper_than([], 1)
    assert nesting.deeper_than(_nested(5), 4) and not nesting.deeper_than(_nested(5), 5)
    deep = {}
    for _ in range(100_000):  # far past Python's recursion limit
        deep = {"a": deep}
    assert nesting.deeper_than(deep, untrusted.MAX_DATA_DEPTH)
    assert nesting.deeper_than({(("k",),): 1}, 2)  # tuple keys count


# ---- item 1: op schemas (torch's C++ parser) ----

def test_every_schema_of_the_running_torch_is_far_within_the_caps():
    schemas = [str(s) for s in torch._C._jit_get_all_schemas()]
    assert len(schemas) > 1000
    assert [s for s in schemas if schema_drift.nesting_problem(s) is not None] == []
    deepest = max(nesting.bracket_depth(s, "\"'") for s in schemas)
    marks = max(map(schema_drift.type_marks, schemas))
    assert deepest >= 2 and marks >= 2  # (the scan sees torch's nesting at all)
    assert deepest * 4 <= schema_drift.MAX_SCHEMA_DEPTH and marks * 2 <= schema_drift.MAX_TYPE_MARKS, (deepest, marks)
    assert max(map(len, schemas)) * 16 <= schema_drift.MAX_SCHEMA_LEN


@pytest.mark.parametrize("schema, why", [
    ("aten::f(" + "(" * 17 + "int" + ")" * 17 + " a) -> Tensor", "nests brackets 18 levels deep, more than 16"),
    ("aten::f(int" + "[]" * 9 + " a) -> Tensor", "puts 9 list or optional marks in a row, more than 8"),
    ("aten::f(int [ ] [ ] [ ]?[][ ] [] [ ] [] a) -> Tensor", "puts 9 list or optional marks"),
    ("aten::f(int? a) -> Tensor # (((", "holds a comment"),
    ('aten::f(str a="""x)""") -> Tensor', "triple quote"),
    ("aten::f(str a='x\n') -> Tensor", "control character"),
    ("aten::f(Tensor a) -> Tensor" + " " * (1 << 16), "characters long, more than 65536"),
])
def test_schemas_past_the_caps_never_reach_torchs_parser(schema, why):
    assert why in schema_drift.nesting_problem(schema)
    with pytest.raises(ValueError, match=re.escape(why)):
        schema_drift.parse(schema)


def test_real_schema_spellings_pass():
    for schema in ["aten::f(Tensor(a!)[] self, Dict(str, Tensor[]) d, int[2]? x=None) -> (Tensor(a!)[], int)",
                   # brackets and escaped quotes inside literals are not nesting
                   "aten::f(str chars=\" )))]]]\", str b='(((\\'') -> Tensor"]:
        assert schema_drift.nesting_problem(schema) is None, schema
        schema_drift.parse(schema)


_CHILD = """
import sys
from exporter import load, load_for_backend
from exporter.cli import main
for p in sys.argv[1:]:
    for step, run in (("load", lambda: load(p)), ("load_for_backend", lambda: load_for_backend(p, cache=False))):
        try:
            run()
            print(step, "accepted", p)
        except Exception as e:
            print(step, type(e).__name__, str(e).splitlines()[0])
    for cmd in ("verify", "upgrade"):
        print(cmd, main(["--quiet", cmd, p]))
"""


def test_a_schema_nested_thousands_deep_is_a_typed_error_not_a_crash(tmp_path):
    """The op table's schema of aten::linear with its argument type nested 4,000 parentheses deep
    (torch's C++ parser overflows the stack and kills the process), and one with 20,000 list marks in a
    row (torch parses it, and printing the type overflows): load, load_for_backend, `pt2b verify` and
    `pt2b upgrade` each refuse it. Run in a child process: a regression crashes the child, not the
    test run."""
    deep = _exported(tmp_path, name="deep.pt2b")
    marks = _exported(tmp_path, name="marks.pt2b")
    rest = " input, Tensor weight, Tensor? bias=None) -> Tensor"
    op = ("aten::linear", "default")
    rewrite_artifact(deep, deep, ops={op: "aten::linear(" + "(" * 4000 + "Tensor" + ")" * 4000 + rest})
    rewrite_artifact(marks, marks, ops={op: "aten::linear(Tensor" + "[]" * 20000 + rest})
    before = {p: p.read_bytes() for p in (deep, marks)}
    out = subprocess.run([sys.executable, "-c", _CHILD, str(deep), str(marks)], capture_output=True, text=True,
                         timeout=600, cwd=ROOT)  # a hang guard only
    assert out.returncode == 0, (out.returncode, out.stdout, out.stderr[-2000:])
    assert "Traceback" not in out.stderr
    lines = out.stdout.splitlines()
    for path, why in ((deep, "nests brackets 4001 levels deep, more than 16"),
                      (marks, "puts 20000 list or optional marks in a row, more than 8")):
        refusal = f"{path}: the op table's schema of aten::linear.default {why}; pt2b never hands such text"
        steps = [ln.split(" ", 1) for ln in lines if str(path) in ln]
        assert [(step, rest.startswith(f"CorruptArtifactError {refusal}")) for step, rest in steps] == [
            ("load", True), ("load_for_backend", True)], lines
        assert out.stderr.count(f"{TYPED}{refusal}") == 2, out.stderr
    assert lines.count("verify 2") == 2 and lines.count("upgrade 2") == 2, lines
    assert {p: p.read_bytes() for p in before} == before  # upgrade left them as they were


@pytest.mark.parametrize("default, why", [
    ("int x=" + "9" * 40, "(IndexError: stoll)"),
    ("float x=1e" + "9" * 40, "(IndexError: stod)"),
])
def test_a_default_past_the_parsers_range_is_a_typed_error(tmp_path, capsys, default, why):
    """torch's schema parser reads numeric defaults with std::stoll / std::stod, whose out_of_range
    reaches Python as an IndexError: a recorded schema with such a default is refused like any other
    that does not parse (the semantic fuzzer's parser_schema kind found it)."""
    path = _exported(tmp_path)
    rewrite_artifact(path, path, ops={("aten::linear", "default"):
                                      f"aten::linear(Tensor input, Tensor weight, Tensor? bias=None, {default}) -> Tensor"})
    with pytest.raises(ValueError, match=re.escape(why)):
        schema_drift.parse(f"aten::f(Tensor self, {default}) -> Tensor")
    with pytest.raises(SchemaDriftError, match=re.escape(f"does not parse with this torch (a default value is out of range or malformed {why})")):
        load(path)
    code, err = _cli(capsys, "verify", path)
    assert code == 2 and err.startswith("pt2b: artifact error (SchemaDriftError): ") and why in err, err


# ---- item 9: example inputs and metadata (recursive Python walks) ----

def _example_leaf_nested(tmp_path, levels: int) -> pathlib.Path:
    """dynamic_shapes (a program with guards: check walks its example inputs) with its first example
    input's leaf replaced by a value nested ``levels`` lists deep."""
    path = _exported(tmp_path, "dynamic_shapes")

    def edit(serialized, program):
        leaves = msgpack.unpackb(bytes(program.exampleInputsLeaves))
        leaves[0] = {"v": _nested(levels)}
        program.exampleInputsLeaves = np.frombuffer(msgpack.packb(leaves), dtype=np.uint8)

    return pathlib.Path(rewrite_artifact(path, path, edit=edit))


def test_an_example_input_nested_700_deep_is_a_typed_error(tmp_path, capsys):
    path = _example_leaf_nested(tmp_path, 700)
    why = "example inputs are malformed: leaf 0 holds a list, where a leaf is the index of a stored tensor"
    with pytest.raises(CorruptArtifactError, match=why):
        load(path).check()
    with pytest.raises(CorruptArtifactError, match=why):
        load_for_backend(path, cache=False)
    for cmd in ("verify", "upgrade"):
        code, err = _cli(capsys, cmd, path)
        assert code == 2 and err.startswith(f"{TYPED}{path}: {why}"), (cmd, err)


@pytest.mark.parametrize("leaves, why", [
    ([{"t": 7}], "leaf 0 names tensor 7 of 1 stored"),
    ([{"t": 0}, {"t": [0]}], "leaf 1 names a tensor by a list"),
    ([{"t": 0}, {"v": 1, "t": 0}], "leaf 1 is a dict of 2 entries"),
    ([{"t": 0}, {"v": {"a": 1}}], "leaf 1 holds a dict"),
    ({"t": 0}, "their leaves are not a list"),
])
def test_example_input_leaves_are_what_the_writer_stores(tmp_path, leaves, why):
    path = _exported(tmp_path)

    def edit(serialized, program):
        program.exampleInputsLeaves = np.frombuffer(msgpack.packb(leaves), dtype=np.uint8)

    rewrite_artifact(path, path, edit=edit)
    with pytest.raises(CorruptArtifactError, match=why):
        load(path).check()


def test_metadata_nested_1000_deep_is_a_typed_error(tmp_path, capsys):
    path = _exported(tmp_path, metadata={"a": 1})

    def edit(serialized, program):
        program.metadata = np.frombuffer(msgpack.packb({"a": _nested(1000)}), dtype=np.uint8)

    rewrite_artifact(path, path, edit=edit)
    why = f"metadata nests more than {untrusted.MAX_DATA_DEPTH} levels deep"
    with pytest.raises(CorruptArtifactError, match=why):
        load(path)
    with pytest.raises(CorruptArtifactError, match=why):
        load_for_backend(path, cache=False)
    for cmd in ("inspect", "verify", "upgrade"):
        code, err = _cli(capsys, cmd, path)
        assert code == 2 and err.startswith(f"{TYPED}{path}: {why}"), (cmd, err)


def test_metadata_at_the_cap_is_written_and_read_one_level_more_is_not(tmp_path, capsys):
    cap = untrusted.MAX_DATA_DEPTH
    path = _exported(tmp_path, metadata={"a": _nested(cap - 1)})  # the map itself is a level
    assert load(path).metadata == {"a": _nested(cap - 1)}
    code, _ = _cli(capsys, "inspect", path)
    assert code == 0
    with pytest.raises(ExportError, match=f"metadata nests more than {cap} levels deep"):
        _exported(tmp_path, name="over.pt2b", metadata={"a": _nested(cap)})
    assert not (tmp_path / "over.pt2b").exists()


# ---- JSON text torch's deserializer parses: pytree specs, node and graph metadata ----

def _spec(levels: int, context: str = "null") -> str:
    """treespec_dumps's JSON of a tuple of a tuple ... (``levels`` of them) of one leaf."""
    node = '{"type": "builtins.tuple", "context": %s, "children_spec": [' % json.dumps(context)
    return "[1, " + node * levels + '{"type": null, "context": null, "children_spec": []}' + "]}" * levels + "]"


def _set_example_spec(spec):
    def edit(serialized, program):
        program.exampleInputsSpec = spec
    return edit


def _set_in_spec(serialized, program):
    serialized.graph_module.module_call_graph[0].signature.in_spec = _spec(500)


def _set_node_meta(key):
    def edit(serialized, program):
        serialized.graph_module.graph.nodes[0].metadata[key] = "[" * 10_000 + "]" * 10_000
    return edit


def _set_graph_custom(serialized, program):
    serialized.graph_module.metadata["custom"] = json.dumps(_nested(200))


@pytest.mark.parametrize("edit, why", [
    (_set_example_spec(_spec(500)), "example inputs: pytree spec nests brackets 1003 levels deep, more than the 128"),
    (_set_example_spec(_spec(1, context="[" * 300 + "]" * 300)), "example inputs: pytree spec context nests brackets 300"),
    (_set_in_spec, "module_call_graph '': in_spec nests brackets 1003 levels deep"),
    (_set_node_meta("custom"), "node .*: metadata custom nests brackets 10000 levels deep"),
    (_set_node_meta("from_node"), "node .*: metadata from_node nests brackets 10000 levels deep"),
    (_set_graph_custom, "graph module: metadata custom nests brackets 200 levels deep"),
])
def test_json_text_nested_past_the_cap_is_refused_before_parsing(tmp_path, capsys, edit, why):
    path = _exported(tmp_path)
    rewrite_artifact(path, path, edit=edit)
    with pytest.raises(CorruptArtifactError, match=why):
        load(path).check()
    with pytest.raises(CorruptArtifactError, match=why):
        load_for_backend(path, cache=False)
    code, err = _cli(capsys, "verify", path)
    assert code == 2 and err.startswith(TYPED), err


def test_inputs_nested_at_the_cap_export_load_run_and_lower_one_level_more_is_refused(tmp_path):
    """60 tuples deep (a pytree spec nested 127 deep): torch's pytree walks, the first call, module() and
    the lowering all work; 61 deep is refused by the writer, which never writes what the reader refuses."""
    class Unwrap(torch.nn.Module):
        def forward(self, x):
            while isinstance(x, tuple):
                x = x[0]
            return x + 1

    def wrapped(levels):
        x = torch.arange(3.0)
        for _ in range(levels):
            x = (x,)
        return x

    path = tmp_path / "deep.pt2b"
    export_model(Unwrap(), (wrapped(60),), path)
    art = reader.open_artifact(path)
    assert nesting.bracket_depth(reader.text(art.program.exampleInputsSpec), '"') == 127 <= untrusted.MAX_DATA_DEPTH
    expected = torch.arange(3.0) + 1
    prog = load(path)
    assert torch.equal(prog(wrapped(60)), expected)
    assert torch.equal(prog.exported_program().module()(wrapped(60)), expected)
    assert torch.equal(load_for_backend(path, cache=False)(wrapped(60)), expected)
    with pytest.raises(ExportError, match="in_spec nests brackets 129 levels deep, more than the 128"):
        export_model(Unwrap(), (wrapped(61),), tmp_path / "over.pt2b")


@pytest.fixture(scope="module")
def lowered(tmp_path_factory):
    """mlp_strict lowered and written: its nodes carry torch's from_node provenance."""
    tmp = tmp_path_factory.mktemp("lowered")
    src = _exported(tmp, "mlp_strict")
    path = tmp / "lowered.pt2b"
    export_model(load_for_backend(src, cache=False), path=path)
    return path


def test_real_programs_nest_far_within_the_cap(tmp_path, lowered):
    """What torch writes for nested inputs and outputs and for a lowered program's provenance."""
    deepest = {}
    for path in (_exported(tmp_path, "pytree_io"), _exported(tmp_path, "lstm", name="lstm.pt2b"), lowered):
        art = reader.open_artifact(path)
        serialized = reader.decode_graph(art)
        sig = serialized.graph_module.module_call_graph[0].signature
        texts = {"example inputs": reader.text(art.program.exampleInputsSpec), "in_spec": sig.in_spec,
                 "out_spec": sig.out_spec}
        texts.update((f"node {k}", v) for n in serialized.graph_module.graph.nodes for k, v in n.metadata.items()
                     if k in ("custom", "from_node"))
        for what, text in texts.items():
            deepest[what] = max(deepest.get(what, 0), nesting.bracket_depth(text, '"'))
    assert deepest["in_spec"] >= 5 and deepest["node from_node"] >= 3, deepest  # (each kind measured)
    assert max(deepest.values()) * 4 <= untrusted.MAX_DATA_DEPTH, deepest


def test_provenance_chains_at_the_cap_load_run_and_lower(tmp_path, lowered):
    """Every node's from_node made a chain 63 sources long (JSON nested 127 deep): torch's recursive
    NodeSource reader, module(), a deep copy of the graph and a second lowering all work."""
    import copy

    path = tmp_path / "chains.pt2b"

    depths = []

    def edit(serialized, program):
        for node in serialized.graph_module.graph.nodes:
            if node.metadata.get("from_node"):
                one, chain = json.loads(node.metadata["from_node"])[0], []
                for _ in range(63):
                    chain = [dict(one, from_node=chain)]
                node.metadata["from_node"] = json.dumps(chain)
                depths.append(nesting.bracket_depth(node.metadata["from_node"], '"'))

    rewrite_artifact(lowered, path, edit=edit)
    assert depths and set(depths) == {127}
    x = make_case("mlp_strict").args[0]
    expected = load(lowered)(x)
    ep = load(path).exported_program()
    lengths = []
    for node in ep.graph.nodes:
        source, n = (node.meta.get("from_node") or [None])[0], 0
        while source is not None:
            n, source = n + 1, (source.from_node or [None])[0]
        lengths.append(n)
    assert max(lengths) == 63
    assert torch.equal(ep.module()(x), expected)
    assert copy.deepcopy(ep.graph_module) is not None
    assert torch.allclose(load_for_backend(path, cache=False)(x), expected)


def test_a_cache_entrys_validation_text_is_read_only_as_deep_as_written():
    """The lowering cache reads a validation verdict back from an entry's metadata (a file): JSON
    nested deeper than the verdict is written is not parsed (json.loads would raise RecursionError)."""
    verdict = Validation("passed", verdict="exact", kept={"aten::gelu.default": "why"})
    assert Validation.from_json(verdict.to_json()) == verdict
    assert Validation.from_json("[" * 100_000 + "]" * 100_000) is None
    assert Validation.from_json(json.dumps({"status": "passed", "why": [[["x"]]]})) is None
