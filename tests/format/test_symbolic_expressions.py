"""What torch writes, pt2b writes and reads back: the reader's expression checks (bounded work on a
hostile file) admit every sympy function torch's symbolic shapes are written with, drawn from torch
itself, and the programs that make them round-trip and lower as torch's own run_decompositions does."""

from __future__ import annotations

import pytest
import sympy
import torch
from torch.export import Dim
from torch.utils._sympy import functions as torch_sympy

from exporter import export_model, load, load_for_backend
from exporter._torch.symbolic import sympy_function_names
from exporter.errors import CorruptArtifactError
from exporter.serialize.read.untrusted import check_expr

S0 = sympy.Symbol("s0", positive=True, integer=True)
S1 = sympy.Symbol("s1", positive=True, integer=True)
U0 = sympy.Symbol("u0", integer=True)  # an unbacked size


def _made(fn):
    """``fn`` applied to symbols, with the first arity it takes (the functions of one, two or three
    arguments), as torch's shape environment would build it."""
    for args in ((S0,), (S0, S1), (S0, U0, sympy.Integer(2)), (sympy.Eq(S0, 2), S0, S1)):
        try:
            return fn(*args)
        except (TypeError, ValueError, AssertionError):
            continue
    raise AssertionError(f"{fn} takes none of the arities tried")


def test_torch_defines_the_functions_its_shapes_are_written_with():
    names = sympy_function_names()
    assert {"FloorDiv", "ToFloat", "FloatTrueDiv", "OpaqueUnaryFn_sqrt", "FloatPow", "PowByNatural",
            "BitwiseFn_bitwise_and", "TruncToInt", "RoundToInt"} <= names


@pytest.mark.parametrize("name", sorted(sympy_function_names() - {"MinMaxBase"}))
def test_every_sympy_function_torch_writes_passes_the_expression_check(name):
    made = _made(getattr(torch_sympy, name))
    text = sympy.srepr(made)  # torch's serializer writes srepr (torch._export.serde.serialize._print_sympy)
    check_expr(text, "expr")
    if isinstance(made, sympy.Expr):  # inside arithmetic, as a size is used
        check_expr(sympy.srepr(made * sympy.Float(2.5) + S1), "expr")


@pytest.mark.parametrize("text, why", [
    ("Float('2.0; import os', precision=53)", "contains a string that is not a decimal number"),
    ("Symbol('2.0', integer=True)", "contains a string that is not a symbol name"),
    ("FloatPow(ToFloat(s0), Float('1e9', precision=53))", "raises to a large or nested power"),
    ("OpaqueUnaryFn_system(s0)", "calls something that is not a known sympy name"),
])
def test_numbers_and_names_are_still_checked(text, why):
    with pytest.raises(CorruptArtifactError, match=why):
        check_expr(text, "expr")


class _SymFloat(torch.nn.Module):
    def forward(self, x):
        return x * (x.shape[0] / 2.0)


class _SymSqrt(torch.nn.Module):
    def forward(self, x):
        return x * torch.sym_sqrt(x.shape[0])


class _FloatPow(torch.nn.Module):
    def forward(self, x):
        return x * (x.shape[0] ** 0.5)


@pytest.mark.parametrize("model", [_SymFloat, _SymSqrt, _FloatPow], ids=lambda m: m.__name__)
def test_float_size_arithmetic_round_trips_and_lowers_as_torch_does(tmp_path, model):
    x = torch.randn(9, 3)
    ep = torch.export.export(model(), (x,), dynamic_shapes=({0: Dim("b", min=2, max=1024)},))
    export_model(ep, path=tmp_path / "m.pt2b")
    other = torch.randn(16, 3)
    assert torch.equal(load(tmp_path / "m.pt2b")(other), ep.module()(other))
    lowered = load_for_backend(tmp_path / "m.pt2b", "core", cache=False)
    assert torch.equal(lowered(other), ep.run_decompositions().module()(other))


class _RoundedSize(torch.nn.Module):
    def forward(self, x):
        return x * round(x.shape[0] / 3)


def test_what_torchs_serializer_refuses_pt2b_refuses_with_its_reason(tmp_path):
    """round() of a symbolic float: torch.export.save refuses it, and export_model says torch's reason."""
    from exporter.errors import ExportError

    ep = torch.export.export(_RoundedSize(), (torch.randn(9, 3),), dynamic_shapes=({0: Dim("b", min=2, max=64)},))
    with pytest.raises(Exception, match="round"):
        torch.export.save(ep, tmp_path / "m.pt2")
    with pytest.raises(ExportError, match=r"torch's export serializer rejected the program: .*round"):
        export_model(ep, path=tmp_path / "m.pt2b")
    assert not (tmp_path / "m.pt2b").exists()
