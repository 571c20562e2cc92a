"""A crafted artifact (valid checksums) cannot make pt2b evaluate text or call arbitrary Python:
node targets must be operators, symbolic expressions plain arithmetic."""

import pytest
import torch
from torch._export.serde import schema as S

from exporter import export_model, load
from exporter.errors import CorruptArtifactError
from exporter.serialize import program_codec, reader, untrusted


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
        with pytest.raises(CorruptArtifactError, match="neither a torch.ops operator"):
            untrusted.check_target(bad, "t")


def _tamper(path, edit):
    """Apply ``edit`` to the decoded program and write it back with valid checksums."""
    import flatbuffers
    import zlib

    from exporter.serialize.container import FILE_IDENTIFIER, Header

    art = reader.open_artifact(path)
    ep = reader.decode_graph(art)
    edit(ep)
    art.program.exportedProgram = program_codec.encode(ep)
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
    with pytest.raises(CorruptArtifactError, match="'torch.os.system', which is neither a torch.ops operator"):
        load(path)

    path2 = tmp_path / "m2.pt2b"
    export_model(Dyn(), (torch.randn(4, 6),), path2, dynamic_shapes={"x": {0: torch.export.Dim("b", max=64)}})

    def evil_expr(ep):
        meta = next(iter(ep.graph_module.graph.tensor_values.values()))
        meta.sizes[0] = S.SymInt.create(as_expr=S.SymExpr("__import__('os').system('echo PWNED')"))

    _tamper(path2, evil_expr)
    with pytest.raises(CorruptArtifactError, match="not arithmetic over symbols"):
        load(path2)
    assert "PWNED" not in capfd.readouterr().out
