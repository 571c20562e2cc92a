"""The reader's cheaper parsing of symbolic sizes (exporter/serialize/read/deserialize.py: an expression
met again returns what torch parsed for it the first time) rebuilds exactly what torch's own loader
rebuilds: every node's symbolic sizes and strides, hints, the range constraints, and the outputs."""

from __future__ import annotations

import pytest
import torch

import exporter
from tests.support.helpers import assert_bitwise


class Compound(torch.nn.Module):
    """Sizes that are deep expressions over two dynamic dims, each met many times: concatenations,
    flattening, padding to a multiple, and a reshape that divides."""

    def forward(self, a, b):
        c = torch.cat([a, b, a], dim=0)  # 2*s0 + s1 rows
        for _ in range(6):
            c = torch.cat([c, c[:1]], dim=0)
        flat = c.reshape(-1)
        pad = (-flat.shape[0]) % 8
        padded = torch.nn.functional.pad(flat, (0, pad))
        return padded.reshape(-1, 8).sum(-1), c.t() @ c


def _program(tmp_path):
    a, b = torch.randn(5, 3), torch.randn(4, 3)
    dims = ({0: torch.export.Dim("s0", min=2, max=64)}, {0: torch.export.Dim("s1", min=2, max=64)})
    ep = torch.export.export(Compound(), (a, b), dynamic_shapes=dims)
    path = tmp_path / "m.pt2b"
    exporter.export_model(ep, path=path)
    torch.export.save(ep, tmp_path / "m.pt2")
    return ep, exporter.load(path).exported_program(), torch.export.load(tmp_path / "m.pt2")


def _shapes(ep):
    out = []
    for node in ep.graph.nodes:
        for v in torch.utils._pytree.tree_leaves(node.meta.get("val")):
            if isinstance(v, torch.Tensor):
                out.append((node.name, [str(s) for s in v.shape], [str(s) for s in v.stride()],
                            [s.node.hint if isinstance(s, torch.SymInt) else s for s in v.shape]))
            elif isinstance(v, torch.SymInt):
                out.append((node.name, str(v), v.node.hint))
    return out


def test_symbolic_sizes_equal_torch_loaders(tmp_path):
    ep, ours, theirs = _program(tmp_path)
    shapes = _shapes(ours)
    assert shapes == _shapes(theirs)
    assert sum(1 for s in shapes if any("*" in d or "+" in d for d in s[1])) >= 8  # compound ones
    assert {str(k): str(v) for k, v in ours.range_constraints.items()} == \
        {str(k): str(v) for k, v in theirs.range_constraints.items()}


def test_outputs_equal_for_several_sizes(tmp_path):
    ep, ours, _ = _program(tmp_path)
    for n0, n1 in [(5, 4), (2, 9), (17, 3)]:
        a, b = torch.randn(n0, 3), torch.randn(n1, 3)
        assert_bitwise(ours.module()(a, b), ep.module()(a, b))


def test_an_expression_met_again_is_not_parsed_again(tmp_path, monkeypatch):
    """What makes it cheaper: torch's loader sympifies each expression and every sub-expression of it
    each time it meets one; pt2b's does so once per distinct one (lara_mini's load: 29 s -> 2.5 s)."""
    import sympy

    ep = _program(tmp_path)[0]
    calls = []
    real = sympy.sympify
    monkeypatch.setattr(sympy, "sympify", lambda *a, **k: calls.append(1) or real(*a, **k))
    exporter.load(tmp_path / "m.pt2b").exported_program()
    ours, calls[:] = len(calls), []
    torch.export.load(tmp_path / "m.pt2")
    assert 0 < ours * 3 < len(calls)


class DataDependent(torch.nn.Module):
    """Sizes read from data (unbacked symbols): nonzero's count, and an item() used as a size."""

    def forward(self, x, n):
        idx = torch.nonzero(x > 0)
        k = n.item()
        torch._check(k >= 0)
        torch._check(k <= x.shape[0])
        return idx.float().sum(0), x[:k] * 2, torch.zeros(k, 3)


def _bindings(ep):
    return [(n.name, {str(s): str(p) for s, p in n.meta["unbacked_bindings"].items()})
            for n in ep.graph.nodes if "unbacked_bindings" in n.meta]


def test_unbacked_bindings_equal_torch_loaders(tmp_path):
    """pt2b's loader skips torch's walk for unbacked symbols once none is pending: every node that
    binds one still records the same bindings as torch's loader, and the program runs alike."""
    x, n = torch.tensor([1.0, -2.0, 3.0, 0.5, -1.0]), torch.tensor(3)
    ep = torch.export.export(DataDependent(), (x, n))
    exporter.export_model(ep, path=tmp_path / "d.pt2b")
    torch.export.save(ep, tmp_path / "d.pt2")
    ours = exporter.load(tmp_path / "d.pt2b").exported_program()
    theirs = torch.export.load(tmp_path / "d.pt2")
    bindings = _bindings(ours)
    assert bindings == _bindings(theirs)
    assert len(bindings) >= 2  # nonzero's size and item()'s value
    for x, n in [(x, n), (torch.tensor([-1.0, 2.0, 2.0, 2.0, 4.0]), torch.tensor(5))]:
        assert_bitwise(ours.module()(x, n), ep.module()(x, n))


def test_the_walk_is_skipped_only_while_pt2b_reads(tmp_path):
    """Outside pt2b's loader (after it ran once and wrapped the walk), and with something pending,
    torch's walk runs as before; inside it, a walk with nothing pending returns at once."""
    from torch.fx.experimental import symbolic_shapes

    from exporter.serialize.read import deserialize

    _program(tmp_path)  # (reads a program: the walk is wrapped now)
    walk = symbolic_shapes._free_unbacked_symbols_with_path
    assert walk._pt2b_wrapped
    with torch._subclasses.fake_tensor.FakeTensorMode(shape_env=symbolic_shapes.ShapeEnv()) as mode:
        u = mode.shape_env.create_unbacked_symint()
        val = torch.empty(u, 2)
    for reading in (False, True):
        deserialize._STATE.reading = reading
        try:
            pending = {u.node.expr}
            assert walk(val, (), pending=pending) == {u.node.expr: walk(val, (), pending={u.node.expr})[u.node.expr]}
            assert not pending
            assert walk(val, (), pending=set()) == {}
            if reading:  # (torch's walk refuses a real tensor: it does not run)
                assert walk(torch.ones(2), (), pending=set()) == {}
            else:
                with pytest.raises(AssertionError, match="Expected FakeTensor"):
                    walk(torch.ones(2), (), pending=set())
        finally:
            deserialize._STATE.reading = False
