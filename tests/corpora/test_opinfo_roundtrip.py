"""Single-op programs built from OpInfo samples (tests/support/opinfo_cases.py, 600+ ops) round-trip
through .pt2b: same graph node by node, outputs bitwise equal to ep.module() and to eager."""

import functools

import pytest

from exporter import export_model, load
from tests.support.helpers import assert_bitwise, assert_close_to_eager, assert_programs_equal
from tests.support.lowering_corpus import OPINFO_PROGRAMS
from tests.support.opinfo_cases import opinfo_cases


@functools.cache
def cases():
    return {c.op_name: c for c in opinfo_cases()}


def test_corpus_runs_611_ops():
    """The builder keeps only the ops that export and match eager (the rest are dropped silently): guard
    the number kept, which is the number that run below (the OpInfo part of docs/lowering.md's 666)."""
    n = len(cases())
    assert n == OPINFO_PROGRAMS, f"{n} OpInfo ops run, {OPINFO_PROGRAMS} expected (lowering_corpus.OPINFO_PROGRAMS)"


@pytest.mark.parametrize("op_name", sorted(cases()))
def test_opinfo_op_roundtrips(tmp_path, op_name):
    case = cases()[op_name]
    path = tmp_path / "op.pt2b"
    ep = export_model(case.module, case.args, path, kwargs=case.kwargs)
    prog = load(path)
    assert_programs_equal(ep, prog.exported_program())
    out = prog(*case.args, **case.kwargs)
    assert_bitwise(out, ep.module()(*case.args, **case.kwargs))
    # the corpus keeps only ops whose exported program matched eager bitwise; so must ours
    assert_close_to_eager(out, case.module(*case.args, **case.kwargs), rtol=0, atol=0)
