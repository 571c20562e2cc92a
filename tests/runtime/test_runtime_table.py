"""runtime_ref plans a loaded program straight from its graph table (runtime_ref/table_program.py):
no ExportedProgram is built, and the plan runs bitwise what the plan from the ExportedProgram runs;
what the table plan does not read falls back with the reason, and every check of the file still
runs first."""

from __future__ import annotations

import copy
import re
import warnings

import pytest
import torch

from tests.support.artifact_surgery import damage_graph_table
from exporter import export_model, load, load_for_backend
from tools.corpus.zoo import make_case, zoo_names
from exporter.errors import CorruptArtifactError, OpsetError, RuntimeInputError
from tests.support.helpers import assert_bitwise
from runtime_ref import Runtime

# zoo programs the table plan reads once lowered (static shapes, no control flow), and the reason
# each of the others falls back
FROM_TABLE = {"cnn_bn", "cnn_bn_train", "lstm", "gru", "transformer_encoder", "transformer_decoder",
              "buffer_mutation", "kwargs_only", "tied_weights", "dtypes", "inplace_ops", "multihead_attention",
              "custom_op", "pytree_io", "mlp", "mlp_strict", "dynamic_shapes"}
FALLS_BACK = {"cond": "higher_order.cond", "map": "higher_order.map_impl", "while_loop": "higher_order.while_loop"}


@pytest.fixture(scope="module")
def lowered_artifacts(tmp_path_factory):
    """zoo name -> (case, path of its core-lowered artifact)."""
    folder = tmp_path_factory.mktemp("table_plan")
    out = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for name in sorted(FROM_TABLE | set(FALLS_BACK)):
            case = make_case(name)
            src = folder / f"{name}.pt2b"
            export_model(case.model, case.args, src, kwargs=case.kwargs, dynamic_shapes=case.dynamic_shapes)
            low = folder / f"{name}.core.pt2b"
            export_model(load_for_backend(src, "core", cache=False, validate=False), path=low)
            out[name] = case, low
    return out


def _extra(name):
    return [torch.ops.pt2b_zoo.scaled_add.default] if name == "custom_op" else []


def _run(rt, case, times=1):
    with torch.no_grad():
        return [rt(*copy.deepcopy(case.args), **copy.deepcopy(case.kwargs or {})) for _ in range(times)]


def test_the_corpus_lists_every_zoo_program():
    assert FROM_TABLE | set(FALLS_BACK) == set(zoo_names())


@pytest.mark.parametrize("name", sorted(FROM_TABLE))
def test_table_plan_builds_no_program_and_runs_bitwise_what_the_program_plan_runs(lowered_artifacts, name):
    case, path = lowered_artifacts[name]
    prog = load(path)
    rt = Runtime(prog, extra_ops=_extra(name))
    assert (rt.planned_from, rt.not_from_table) == ("table", None)
    ref = Runtime(load(path).exported_program(), extra_ops=_extra(name))
    assert ref.planned_from == "exported_program"
    # the same plan: steps, their names, the steps run in place, the outputs and the op counts
    assert rt.plan.step_names == ref.plan.step_names
    assert rt.plan.in_place_steps == ref.plan.in_place_steps
    assert rt.ops() == ref.ops()
    got, expected = _run(rt, case, times=2), _run(ref, case, times=2)  # twice: mutated state carries over
    assert_bitwise(got, expected)
    assert_bitwise(rt.state_dict(), ref.state_dict())
    assert not prog._built.done  # no fx graph, fake tensor or ExportedProgram was built


@pytest.mark.parametrize("name", sorted(FALLS_BACK))
def test_what_the_table_plan_does_not_read_falls_back_and_says_why(lowered_artifacts, name):
    case, path = lowered_artifacts[name]
    rt = Runtime(load(path))
    assert rt.planned_from == "exported_program" and FALLS_BACK[name] in rt.not_from_table
    assert_bitwise(_run(rt, case), _run(Runtime(load(path).exported_program()), case))


def test_an_unlowered_program_is_refused_at_construction_as_from_the_program(tmp_path):
    """The opset check reads the table plan's nodes: an in-place op is refused with the message the
    program plan gives."""
    case = make_case("inplace_ops")
    path = tmp_path / "m.pt2b"
    export_model(case.model, case.args, path)
    with pytest.raises(OpsetError, match="mutates its inputs") as from_table:
        Runtime(load(path))
    with pytest.raises(OpsetError) as from_program:
        Runtime(load(path).exported_program())
    assert str(from_table.value) == str(from_program.value)


def test_the_graphs_checks_run_before_the_table_is_planned(lowered_artifacts, tmp_path):
    _, path = lowered_artifacts["transformer_encoder"]
    damaged = damage_graph_table(tmp_path, path)
    prog = load(damaged)
    with pytest.raises(CorruptArtifactError, match=r"Program\.exported_program \(ExportedProgram\) vtable"):
        Runtime(prog)


def test_inputs_are_checked_as_from_the_program(lowered_artifacts):
    case, path = lowered_artifacts["cnn_bn"]
    rt, ref = Runtime(load(path)), Runtime(load(path).exported_program())
    bad = [case.args[0].double(), case.args[0][:, :2], "x"]
    for x in bad:
        with pytest.raises(RuntimeInputError) as a:
            rt(x)
        with pytest.raises(RuntimeInputError) as b:
            ref(x)
        # the loaded artifact also names the dim as the user's Dim ("batch (s77)"); an ExportedProgram cannot
        assert re.sub(r"\b\w+ \((s\d+)\)", r"\1", str(a.value)) == str(b.value)


@pytest.mark.parametrize("name", ["mlp", "dynamic_shapes"])
def test_symbolic_inputs_are_bound_and_checked_as_from_the_program(lowered_artifacts, name):
    """A program with dynamic dims plans from the table: other sizes in range run bitwise as the
    program plan runs them, and sizes out of range, static dims changed or dims that must agree but
    do not are refused with the program plan's message."""
    case, path = lowered_artifacts[name]
    rt, ref = Runtime(load(path)), Runtime(load(path).exported_program())
    assert rt.planned_from == "table" and rt._inputs._symbolic
    x = case.args[0]

    def resized(t, dim, n):
        shape = list(t.shape)
        shape[dim] = n
        return torch.randn(shape, dtype=t.dtype) if t.is_floating_point() else torch.zeros(shape, dtype=t.dtype)

    for n in (2, 5):  # other batch sizes, in range
        args = tuple(resized(a, 0, n) for a in case.args)
        with torch.no_grad():
            assert_bitwise(rt(*copy.deepcopy(args)), ref(*copy.deepcopy(args)))
    bad = [tuple(resized(a, 0, 10_000) for a in case.args),  # out of the recorded range
           (resized(x, x.dim() - 1, x.shape[-1] + 1), *case.args[1:])]  # a static dim changed
    if len(case.args) > 1:
        bad.append((resized(x, 0, 3), *(resized(a, 0, 4) for a in case.args[1:])))  # equal dims differ
    for args in bad:
        with pytest.raises(RuntimeInputError) as a:
            rt(*args)
        with pytest.raises(RuntimeInputError) as b:
            ref(*args)
        # the loaded artifact also names the dim as the user's Dim ("batch (s77)"); an ExportedProgram cannot
        assert re.sub(r"\b\w+ \((s\d+)\)", r"\1", str(a.value)) == str(b.value)
