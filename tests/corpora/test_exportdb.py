"""Every ExportDB example shipped inside torch that torch.export itself can export round-trips
through .pt2b: same graph node by node, bitwise-equal outputs, close to eager."""

import copy

import pytest
import torch
from torch._export.db.examples import all_examples

from exporter import export_model, load
from tests.support.helpers import assert_bitwise, assert_close_to_eager, assert_programs_equal

EXAMPLES = all_examples()
# The examples torch.export itself cannot export (each documents an unsupported case): skipped.
# Every other example must export and round-trip, so the number that run is guarded, not only the
# number that exist.
UNEXPORTABLE = {"dynamic_shape_round"}
RUNNING = 35  # = lowering_corpus.EXPORTDB_PROGRAMS, the ExportDB part of the 666 of docs/lowering.md


def _export_with_torch(case):
    """torch.export's own result for an example (strict first, then non-strict), or None."""
    args = case.example_args
    kwargs = case.example_kwargs or {}
    for strict in (True, False):
        try:
            return torch.export.export(copy.deepcopy(case.model), args, kwargs,
                                       dynamic_shapes=case.dynamic_shapes, strict=strict)
        except Exception:
            continue
    return None


def test_exportdb_is_there_and_runs_35_examples():
    assert UNEXPORTABLE <= set(EXAMPLES)
    assert len(set(EXAMPLES) - UNEXPORTABLE) == RUNNING


@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_exportdb_example_roundtrips(tmp_path, name):
    case = EXAMPLES[name]
    ep = _export_with_torch(case)
    if name in UNEXPORTABLE:
        assert ep is None, f"{name} exports now: remove it from UNEXPORTABLE and raise RUNNING"
        pytest.skip("torch.export itself cannot export this example (it documents an unsupported case)")
    assert ep is not None, f"torch.export no longer exports {name}"
    path = tmp_path / f"{name}.pt2b"
    export_model(ep, path=path)
    prog = load(path, verify=True)
    assert prog.ir_level == "training"
    assert_programs_equal(ep, prog.exported_program())
    args, kwargs = case.example_args, case.example_kwargs or {}
    out = prog(*copy.deepcopy(args), **copy.deepcopy(kwargs))
    ref = ep.module()(*copy.deepcopy(args), **copy.deepcopy(kwargs))
    assert_bitwise(out, ref)
    eager = copy.deepcopy(case.model)(*copy.deepcopy(args), **copy.deepcopy(kwargs))
    assert_close_to_eager(out, eager, rtol=1e-5, atol=1e-6)
