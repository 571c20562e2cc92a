"""Single-op programs built from OpInfo samples (tests/opinfo_cases.py, 600+ ops) round-trip
through .pt2b: same graph node by node and bitwise-equal outputs."""

import functools

import pytest
import torch

from exporter import export_model, load
from helpers import assert_bitwise, assert_programs_equal
from opinfo_cases import opinfo_cases


@functools.cache
def cases():
    return {c.op_name: c for c in opinfo_cases()}


def test_corpus_covers_300_ops():
    assert len(cases()) >= 300


@pytest.mark.parametrize("op_name", sorted(cases()))
def test_opinfo_op_roundtrips(tmp_path, op_name):
    case = cases()[op_name]
    path = tmp_path / "op.pt2b"
    ep = export_model(case.module, case.args, path, kwargs=case.kwargs)
    prog = load(path)
    assert_programs_equal(ep, prog.exported_program())
    assert_bitwise(prog(*case.args, **case.kwargs), ep.module()(*case.args, **case.kwargs))
