"""A crafted artifact (valid checksums) cannot make pt2b evaluate text or call arbitrary Python:
node targets must be operators, symbolic expressions plain arithmetic."""

import json

import pytest
import torch
from torch._export.serde import schema as S

from exporter import export_model, load, names
from exporter.errors import CorruptArtifactError
from exporter.serialize import reader
from exporter.serialize.read import untrusted
from exporter.serialize.write import encode_schema


class Dyn(torch.nn.Module):
    def forward(self, x):
        return x.reshape(x.shape[0] * 2, -1) + 1


def test_expression_grammar():
    for ok in ["Mul(Integer(2), Symbol('s77', positive=True, integer=True))", "s77", "Min(4, 4*s27)", "FloorDiv(s0, 2) + u3", "Eq(u0, 1)", "-s0 + 2*s1**2", "zuf0 >= 1.5e-3", "True"]:
        untrusted.check_expr(ok, "t")
    for bad in ["__import__('os').system('echo hi')", "s0.__class__", "lambda: 1", "[s0]", "'a.b'", "open",
                "sympify('1')", "Symbol('x').__class__", "Symbol('x')._eval", "lambdify"]:
        with pytest.raises(CorruptArtifactError, match="not arithmetic over symbols|does not parse"):
            untrusted.check_expr(bad, "t")


def test_target_allowlist():
    for ok in ["torch.ops.aten.add.Tensor", "torch.ops.higher_order.cond", "_operator.getitem", "_operator.mul",
               "torch.sym_max", "math.trunc"]:
        untrusted.check_target(ok, "t")
    for bad in ["torch.os.system", "torch.load", "builtins.eval", "torch.ops.aten.__class__.__init__", "os.system"]:
        with pytest.raises(CorruptArtifactError, match="neither an operator registered with this torch"):
            untrusted.check_target(bad, "t")


def _tamper(path, edit, edit_table=None):
    """Apply ``edit`` to the decoded program (and ``edit_table`` to the FlatBuffers program table)
    and write it back with valid checksums."""
    import flatbuffers
    import zlib

    from exporter.layout.container import FILE_IDENTIFIER, Header

    art = reader.open_artifact(path)
    ep = reader.decode_graph(art)
    edit(ep)
    art.program.exportedProgram = encode_schema.Packed(ep)
    if edit_table is not None:
        edit_table(art.program)
    b = flatbuffers.Builder(1 << 16)
    b.Finish(art.program.Pack(b), file_identifier=FILE_IDENTIFIER)
    program = bytes(b.Output())
    data = bytearray(path.read_bytes()[: art.header.program_offset])
    h = art.header
    header = Header(h.major, h.minor, h.data_offset, h.data_size, h.program_offset, len(program), zlib.crc32(program))
    data[:64] = header.pack()
    path.write_bytes(bytes(data) + program)


def test_crafted_target_and_expression_refused(tmp_path, capfd):
    path = tmp_path / "m.pt2b"
    export_model(Dyn(), (torch.randn(4, 6),), path, dynamic_shapes={"x": {0: torch.export.Dim("b", max=64)}})
    load(path)

    def evil_target(ep):
        node = next(n for n in ep.graph_module.graph.nodes if "add" in n.target)
        node.target = "torch.os.system"

    _tamper(path, evil_target)
    with pytest.raises(CorruptArtifactError, match="'torch.os.system', which is neither an operator registered with this torch"):
        load(path).check()

    path2 = tmp_path / "m2.pt2b"
    export_model(Dyn(), (torch.randn(4, 6),), path2, dynamic_shapes={"x": {0: torch.export.Dim("b", max=64)}})

    def evil_expr(ep):
        meta = next(iter(ep.graph_module.graph.tensor_values.values()))
        meta.sizes[0] = S.SymInt.create(as_expr=S.SymExpr("__import__('os').system('echo PWNED')"))

    _tamper(path2, evil_expr)
    with pytest.raises(CorruptArtifactError, match="not arithmetic over symbols"):
        load(path2).check()
    assert "PWNED" not in capfd.readouterr().out


class StrInput(torch.nn.Module):
    def forward(self, x, mode: str):
        return x * 2 if mode == "a" else x


class DictInput(torch.nn.Module):
    def forward(self, inputs):
        return inputs["a"] + 1


def _pwned(capfd):
    return "PWNED" in capfd.readouterr().out


@pytest.mark.parametrize("guard", [
    "print('PWNED') is None",
    "torch.os.system('echo PWNED') == 0",
    "L['x'].__class__.__init__ is None",
    "L['z'].size()[0] == 4",  # not an argument: torch's guard function would die with NameError
    "L['x'].size()[0] == 9**9**9",
    "L['flat_args'].size()[0] == 64",  # flat_args is only a prefix torch rewrites (fuzzer, seed 4)
    "L['flat_args'][1].size()[0] == 4",  # there is one input
    "L['x']['k'].size()[0] == 4",
])
def test_guards_code_is_checked_before_ep_module_executes_it(tmp_path, capfd, guard):
    """ep.module() exec()s the program's guards_code; only shape comparisons may come from a file."""
    path = tmp_path / "m.pt2b"
    export_model(Dyn(), (torch.randn(4, 6),), path)
    # the shape of what torch writes (the new tracer's sources name flat_args)
    legit = ["(L['x'].size()[0] % 2) == 0", "L['x'].size()[0] <= 64", "L['flat_args'][0].size()[1] == 6"]

    def set_guards(codes):
        def edit(ep):
            ep.guards_code = codes
        return edit

    _tamper(path, set_guards(legit))
    ep = load(path).exported_program()
    assert ep._guards_code == legit
    x = torch.randn(4, 6)
    assert torch.equal(ep.module()(x), Dyn()(x))
    with pytest.raises(AssertionError, match="Guard failed"):
        ep.module()(torch.randn(3, 6))  # the stored guards do run
    _tamper(path, set_guards(legit + [guard]))
    with pytest.raises(CorruptArtifactError, match="guards_code: guard .* (accepts only shape comparisons|which is not "
                                                   "an input of the program)"):
        load(path).check()
    assert not _pwned(capfd)


def test_string_inputs_cannot_break_out_of_torchs_guard_code(tmp_path, capfd):
    """A str input becomes `L['mode'] == '<value>'` in the guard function ep.module() executes."""
    path = tmp_path / "m.pt2b"
    export_model(StrInput(), (torch.randn(3), "a"), path)
    x = torch.randn(3)
    assert torch.equal(load(path).exported_program().module()(x, "a"), x * 2)
    payload = "a' or print('PWNED') or '"

    def evil(ep):
        spec = ep.graph_module.signature.input_specs[1]
        spec.constant_input.value = S.ConstantValue.create(as_string=payload)
        ep.graph_module.graph.inputs[1] = S.Argument.create(as_string=payload)

    _tamper(path, evil)
    with pytest.raises(CorruptArtifactError, match="string input value .* holds a quote"):
        load(path).check()
    assert not _pwned(capfd)


def test_example_input_keys_cannot_break_out_of_torchs_guard_code(tmp_path, capfd):
    path = tmp_path / "m.pt2b"
    x = torch.randn(3)
    export_model(DictInput(), ({"a": x},), path)
    assert torch.equal(load(path).exported_program().module()({"a": x}), x + 1)
    evil_key = 'a"+print("PWNED")+"'

    def evil(table):
        spec = json.loads(reader.text(table.exampleInputsSpec))
        spec[1]["children_spec"][0]["children_spec"][0]["context"] = json.dumps([evil_key])
        table.exampleInputsSpec = json.dumps(spec)

    _tamper(path, lambda ep: None, evil)
    with pytest.raises(CorruptArtifactError, match="example inputs: dict key .* holds a quote"):
        load(path).check()
    assert not _pwned(capfd)


def test_dunder_state_paths_never_reach_python_internals(tmp_path):
    """Unlifting walks state paths with getattr/setattr: "lin.__class__.__init__" would reach
    nn.Module itself (found by the fuzzer, seed 3). Such a path is now accepted (nn.Module-style
    names are not refused) but its reserved components get safe aliases in memory: the program
    loads, runs, keeps the path as written in the file, and nn.Module is untouched."""
    path = tmp_path / "m.pt2b"
    lin = torch.nn.Linear(3, 2)
    export_model(lin, (torch.randn(1, 3),), path)
    bad = "lin.__class__.__init__"

    def rename(ep):
        for spec in ep.graph_module.signature.input_specs:
            if spec.type == "parameter" and spec.parameter.parameter_name == "weight":
                spec.parameter.parameter_name = bad

    def rename_tensor(program):
        for rec in program.tensors:
            if reader.text(rec.name) == "weight":
                rec.name = bad

    _tamper(path, rename, rename_tensor)
    init = torch.nn.Module.__init__
    prog = load(path)
    assert torch.nn.Module.__init__ is init  # untouched
    x = torch.randn(1, 3)
    assert torch.equal(prog(x), lin(x))
    aliased = names.safe_path(bad)
    assert aliased == "lin._pt2b_x5f5f636c6173735f5f._pt2b_x5f5f696e69745f5f"
    assert aliased in prog.exported_program().state_dict
    assert names.original_path(aliased) == bad
    again = tmp_path / "again.pt2b"
    export_model(prog.exported_program(), path=again)  # written back under the file's own name
    assert bad in {reader.text(r.name) for r in reader.open_artifact(again).program.tensors}


def test_symint_arithmetic_on_a_tensor_is_refused(tmp_path):
    """torch.sym_max(tensor, 0) would die mid-run on torch's internal assertion (fuzzer, seed 3)."""
    path = tmp_path / "m.pt2b"
    export_model(Dyn(), (torch.randn(4, 6),), path, dynamic_shapes={"x": {0: torch.export.Dim("b", max=64)}})

    def retarget(ep):
        node = next(n for n in ep.graph_module.graph.nodes if n.target == "torch.ops.aten.sym_size.int")
        node.target = "torch.sym_max"

    _tamper(path, retarget)
    with pytest.raises(CorruptArtifactError, match="calls torch.sym_max on a tensor"):
        load(path).check()


def test_signature_must_name_the_graphs_placeholders(tmp_path):
    """Fuzz finding (seed 7, mutant 39102 of the default models): a user input's argument retagged
    from as_tensor to as_floats left placeholder 'x' unnamed by the signature; load accepted it and
    runtime_ref failed with KeyError while planning. Load now refuses it."""
    path = tmp_path / "m.pt2b"
    export_model(Dyn(), (torch.randn(4, 6),), path, dynamic_shapes={"x": {0: torch.export.Dim("b", max=64)}})
    load(path)

    def retag(ep):
        spec = next(s for s in ep.graph_module.signature.input_specs if s.type == "user_input")
        spec.user_input.arg = S.Argument.create(as_floats=[])

    _tamper(path, retag)
    with pytest.raises(CorruptArtifactError, match=r"signature's input 0 names '' but the graph's placeholder 0 is 'x'"):
        load(path).check()
