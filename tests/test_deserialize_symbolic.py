"""The reader's cheaper parsing of symbolic sizes (exporter/serialize/deserialize.py: an expression
met again returns what torch parsed for it the first time) rebuilds exactly what torch's own loader
rebuilds: every node's symbolic sizes and strides, hints, the range constraints, and the outputs."""

from __future__ import annotations

import torch

import exporter
from helpers import assert_bitwise


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
