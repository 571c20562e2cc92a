"""load_for_backend: presets none/core/core-tag/max over the round-trip corpus, the
supported-ops closure with its errors, keep, custom tables, explain, functionalization."""

import copy
import re
import functools
import threading
import warnings

import pytest
import torch

from exporter import export_model, load, load_for_backend
from exporter.errors import LoweringError, OpsetError, UnknownOpsWarning
from exporter.lowering import presets, tables
from exporter.mutation import is_mutating
from exporter.graph_walk import op_counts, op_nodes
from exporter.lowering.opset_check import is_infrastructure
from exporter.ops import op_name, resolve_op
from tools.corpus.zoo import make_case
from tests.support.helpers import assert_close_to_eager
from runtime_ref import Runtime
from tests.support.lowering_corpus import (EXPORTDB_PROGRAMS, OPINFO_PROGRAMS, ZOO_PROGRAMS, exportdb_programs,
                                           opinfo_programs, zoo_programs)

PRESETS = ["none", "core", "core-tag", "max"]
CORPUS = zoo_programs() + exportdb_programs() + opinfo_programs(every=12)


def mutating_ops(gm: torch.fx.GraphModule) -> list[str]:
    """The names of the in-place/out= overloads a graph and its subgraphs still call."""
    return sorted({op_name(n.target) for n in op_nodes(gm)
                   if isinstance(n.target, torch._ops.OpOverload) and is_mutating(n.target)})


# The programs core-tag refuses (allowed by its contract: each op named has no decomposition that
# reaches core), with the ops it names. Any other program must lower; each of these must refuse
# with exactly these ops: a change either way fails.
CORE_TAG_REFUSES = {
    "zoo:cnn_bn_train": {"prims::broadcast_in_dim.default", "prims::div.default", "prims::sum.default",
                         "prims::var.default"},
    "zoo:inplace_ops": {"aten::empty_permuted.default"},
    "opinfo:bitwise_left_shift": {"prims::shift_left.default"},
    "opinfo:copysign": {"prims::abs.default", "prims::neg.default", "prims::signbit.default", "prims::where.default"},
    "opinfo:fft.ihfft": {"aten::_conj.default"},
    "opinfo:linalg.inv": {"aten::linalg_inv_ex.default"},
    "opinfo:linalg.pinv.singular": {"aten::linalg_pinv.atol_rtol_tensor"},
    "opinfo:nn.functional.embedding_bag": {"aten::_embedding_bag_forward_only.default"},
    "opinfo:nn.functional.hinge_embedding_loss": {"aten::empty_permuted.default"},
    "opinfo:polygamma.polygamma_n_1": {"aten::polygamma.default"},
    "opinfo:special.chebyshev_polynomial_v": {"aten::special_chebyshev_polynomial_v.default"},
    "opinfo:special.modified_bessel_i0": {"aten::special_modified_bessel_i0.default"},
    "opinfo:special.shifted_chebyshev_polynomial_w": {"aten::special_shifted_chebyshev_polynomial_w.default"},
    "opinfo:unique": {"aten::_unique2.default"},
}


def test_corpus_runs_the_programs_it_claims():
    """Guard the number of programs that run, not the number that exist: the corpus builders drop
    what cannot be exported, so a torch or helper change could shrink it silently (the 666 of
    docs/lowering.md are 20 zoo models, 35 ExportDB examples and 611 OpInfo samples, of which this
    file runs every 12th)."""
    by_kind = {}
    for p in CORPUS:
        by_kind[p.id.split(":")[0]] = by_kind.get(p.id.split(":")[0], 0) + 1
    assert by_kind == {"zoo": ZOO_PROGRAMS, "exportdb": EXPORTDB_PROGRAMS, "opinfo": -(-OPINFO_PROGRAMS // 12)}
    assert len({p.id for p in CORPUS}) == len(CORPUS)
    assert set(CORE_TAG_REFUSES) <= {p.id for p in CORPUS}, "a program expected to refuse core-tag is gone"


@functools.cache
def artifact(program_id, tmpdir):
    prog = next(p for p in CORPUS if p.id == program_id)
    model, args, kwargs, dyn, strict = prog.make()
    path = f"{tmpdir}/{program_id.replace(':', '_')}.pt2b"
    export_model(copy.deepcopy(model), args, path, kwargs=kwargs, dynamic_shapes=dyn, strict=strict)
    with torch.no_grad():
        eager = copy.deepcopy(model)(*copy.deepcopy(args), **copy.deepcopy(kwargs))
    return path, args, kwargs, eager, prog


def _check_opset(lowered, preset):
    gm = lowered.exported_program().graph_module
    ops = [n.target for n in op_nodes(gm) if not is_infrastructure(n.target)]
    assert not mutating_ops(gm), f"{preset}: in-place/out= ops left: {mutating_ops(gm)}"
    if preset == "core-tag":
        non_core = sorted({op_name(op) for op in ops if not tables.is_core(op) and op.namespace in ("aten", "prims")})
        assert not non_core, f"core-tag left non-core ops {non_core}"
    if preset == "max":
        left = sorted({op_name(op) for op in ops if op in lowered.table})
        assert not left, f"max left decomposable ops {left}"
    if preset == "core":
        reported = set(lowered.outside_opset)
        assert reported == {op_name(op) for op in ops if not tables.is_core(op) and op.namespace in ("aten", "prims")}


@pytest.mark.parametrize("preset", PRESETS)
@pytest.mark.parametrize("program_id", [p.id for p in CORPUS])
def test_preset_lowers_and_matches_eager(tmp_path_factory, program_id, preset):
    path, args, kwargs, eager, prog = artifact(program_id, str(tmp_path_factory.getbasetemp()))
    if preset == "core-tag" and program_id in CORE_TAG_REFUSES:
        with pytest.raises(OpsetError) as e:  # allowed by core-tag's contract: it names ops that cannot reach core
            load_for_backend(path, preset)
        named = re.findall(r"^  (\S+) \(\d+ call sites\)", str(e.value), re.M)
        assert set(named) == CORE_TAG_REFUSES[program_id], str(e.value)
        for name in named:
            op = resolve_op(name)
            assert op is not None and not tables.is_core(op), f"{name} is core yet reported unreachable"
        pytest.xfail(f"core-tag cannot reach core for: {', '.join(named)} (expected: CORE_TAG_REFUSES)")
    lowered = load_for_backend(path, preset)
    _check_opset(lowered, preset)
    custom = [op for op in lowered.ops() if not op.startswith(("aten::", "prims::", "higher_order::"))]
    rt = Runtime(lowered, device="cpu", extra_ops=custom)  # refuses anything outside its opset
    out = rt(*copy.deepcopy(args), **copy.deepcopy(kwargs))
    assert_close_to_eager(out, eager, rtol=prog.rtol, atol=prog.atol)
    if preset == "core":  # the same op set as torch's own run_decompositions on the same program
        theirs = load(path).exported_program().run_decompositions()
        assert set(lowered.ops()) == set(op_counts(theirs.graph_module))


def _export(tmp_path, name):
    case = make_case(name)
    path = tmp_path / f"{name}.pt2b"
    export_model(case.model, case.args, path, kwargs=case.kwargs, dynamic_shapes=case.dynamic_shapes,
                 strict=case.strict)
    return path, case


def test_none_functionalizes_buffer_mutation(tmp_path):
    path, case = _export(tmp_path, "buffer_mutation")
    lowered = load_for_backend(path, "none")
    ep = lowered.exported_program()
    assert not mutating_ops(ep.graph_module)
    assert sorted(ep.graph_signature.buffers_to_mutate.values()) == ["count", "ema"]
    assert "aten::linear.default" in lowered.ops()  # nothing decomposed


def test_none_does_no_work_without_mutation(tmp_path):
    path, _ = _export(tmp_path, "mlp")
    from exporter.lowering.lower import lower
    from exporter.lowering.plan import plan_lowering

    ep = load(path).exported_program()
    assert lower(ep, plan_lowering("none")).exported_program() is ep


def test_dynamic_shapes_stay_symbolic(tmp_path):
    path, case = _export(tmp_path, "mlp")
    lowered = load_for_backend(path, "core-tag")
    ep = lowered.exported_program()
    assert any(str(s).startswith("s") for s in ep.range_constraints)
    x = torch.randn(37, *case.args[0].shape[1:])
    torch.testing.assert_close(lowered(x), case.model(x), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", ["cond", "map", "while_loop"])
def test_control_flow_subgraphs_lowered(tmp_path, name):
    path, case = _export(tmp_path, name)
    lowered = load_for_backend(path, "core-tag")
    gm = lowered.exported_program().graph_module
    subgraphs = [m for n, m in gm.named_modules() if n and isinstance(m, torch.fx.GraphModule)]
    assert subgraphs, "control flow has subgraphs"
    for sub in subgraphs:
        for node in sub.graph.nodes:
            if node.op == "call_function" and isinstance(node.target, torch._ops.OpOverload) \
                    and not is_infrastructure(node.target):
                assert tables.is_core(node.target), f"{name}: subgraph op {node.target} is not core"


def test_supported_ops_closure_and_globs(tmp_path):
    path, case = _export(tmp_path, "mlp")
    supported = ["aten.addmm", "aten::relu.*", "aten::gelu.default", "aten::permute.default",
                 "aten::t.default", "aten::view.default", "aten::add.Tensor", "aten::mm.default"]
    lowered = load_for_backend(path, supported_ops=supported)
    from exporter.ops import OpMatcher

    m = OpMatcher(supported)
    assert all(name in m for name in lowered.ops() if not name.startswith("aten::sym_size"))
    assert "supported by the backend" in lowered.explain("aten::addmm.default")
    assert "aten::linear.default: decomposed" in lowered.explain("aten.linear")
    x = case.args[0]
    torch.testing.assert_close(lowered(x), case.model(x), rtol=1e-5, atol=1e-5)


class _Variance(torch.nn.Module):
    def forward(self, x):
        return x.var(dim=-1, keepdim=True) * x


@pytest.mark.parametrize("listed", [["aten::unsqueeze.default", "aten::expand.default"], []])
def test_a_closure_goes_past_primtorch_views_to_the_aten_views_it_accepts(tmp_path, listed):
    """torch's only decomposition of var.correction is its reference, which emits prims::var and
    prims::broadcast_in_dim; nothing in torch's tables decomposes the view prim. The closure reaches
    it through the prim's own ATen implementation (unsqueeze, expand) where those are accepted; where
    they are not, the route comes back to the prim, which stays and is named (no endless recursion)."""
    x = torch.randn(2, 3, 8)
    path = str(tmp_path / "var.pt2b")
    export_model(_Variance(), (x,), path)
    supported = ["aten::mul.Tensor", "prims::var.default", *listed]
    if not listed:
        with pytest.raises(OpsetError, match=r"prims::broadcast_in_dim\.default"):
            load_for_backend(path, supported_ops=supported, cache=False)
        return
    lowered = load_for_backend(path, supported_ops=supported, cache=False)
    assert set(lowered.ops()) == {"aten::mul.Tensor", "prims::var.default", *listed}
    torch.testing.assert_close(lowered(x), _Variance()(x), rtol=1e-5, atol=1e-6)


def test_unreachable_supported_set_lists_every_op_with_route(tmp_path):
    path, _ = _export(tmp_path, "transformer_encoder")
    with pytest.raises(OpsetError) as e:
        load_for_backend(path, supported_ops=["aten::addmm.default", "aten::view.default"])
    msg = str(e.value)
    assert "op(s) cannot reach the accepted op set" in msg
    assert "aten::select.int" in msg and "is called by the program itself" in msg
    assert "aten::scaled_dot_product_attention.default -> aten::_scaled_dot_product_flash_attention_for_cpu.default" in msg
    assert "Add them to supported_ops" in msg


def test_unknown_names_and_presets_are_clear_errors(tmp_path):
    path, _ = _export(tmp_path, "mlp")
    with warnings.catch_warnings():  # the user's own filter makes an unknown supported op an error
        warnings.simplefilter("error", UnknownOpsWarning)
        with pytest.raises(UnknownOpsWarning, match="this torch .* does not have, left out: aten::frobnicate.default"):
            load_for_backend(path, supported_ops=["aten::frobnicate.default"])
        with pytest.raises(UnknownOpsWarning, match=r"left out: aten::addmmm\.default \(did you mean "
                                                    r"aten::addmm\.default\?\)"):
            load_for_backend(path, supported_ops=["aten::addmmm.default"])
    with pytest.raises(LoweringError, match=r"unknown preset 'coar'; Did you mean 'core'\? Choose one of none, core, core-tag, max"):
        load_for_backend(path, "coar")
    with pytest.raises(LoweringError, match="no frozen opset 'core@1.0'"):
        load_for_backend(path, "core@1.0")


@pytest.mark.parametrize("arg", ["keep", "decompose", "supported_ops"])
@pytest.mark.parametrize("typo", ["aten::linearr", "aten.linearr", "aten::linear.defualt"])
def test_a_typo_in_an_op_list_is_a_lowering_error_naming_it(tmp_path, arg, typo):
    """keep=["aten::linearr"] and decompose=[...] naming an op torch lacks are a LoweringError (an entry
    naming every overload of an op is checked too); docs/architecture.md promises it. supported_ops is
    a backend's own list, taken as it comes: such a name is left out, and the warning names it."""
    path, _ = _export(tmp_path, "mlp")
    name = typo.replace(".", "::", 1) if "::" not in typo else typo
    if arg != "supported_ops":
        with pytest.raises(LoweringError, match=rf"{arg} names ops this torch does not have: {re.escape(name)} "
                                                r"\(did you mean aten::linear\.default\?\)"):
            load_for_backend(path, **{arg: [typo]}, validate=False)
    else:
        with pytest.warns(UnknownOpsWarning, match=rf"left out: {re.escape(name)} "), pytest.raises(OpsetError):
            load_for_backend(path, supported_ops=[typo], validate=False)


def test_a_keep_that_cannot_be_honoured_is_said(tmp_path):
    """Issue 38: keep=["aten::batch_norm.default"] was silently not honoured (torch decomposes it whatever
    the table says); keeping an op the program never calls is reported."""
    path, _ = _export(tmp_path, "cnn_bn")
    with pytest.raises(LoweringError, match=r"keep names ops that every lowering decomposes, whatever its table says: "
                                            r"aten::batch_norm.default \(torch decomposes them"):
        load_for_backend(path, "core", keep=["aten::batch_norm.default"], validate=False)
    lp = load_for_backend(path, "core", keep=["aten::gelu.default", "aten::conv2d.default"], validate=False)
    assert lp.unused_keep() == ["aten::gelu.default"]
    assert "keep names ops the program does not call (1): aten::gelu.default" in lp.report()
    assert "aten::conv2d.default" in lp.ops()  # the one it calls is kept


def test_keep_protects_ops_and_custom_table_applies(tmp_path):
    path, case = _export(tmp_path, "transformer_encoder")
    kept = load_for_backend(path, "core-tag", keep=[torch.ops.aten.scaled_dot_product_attention.default])
    assert "aten::scaled_dot_product_attention.default" in kept.ops()
    assert "kept: protected" in kept.explain("aten::scaled_dot_product_attention.default")
    calls = []

    def relu_as_clamp(x):
        calls.append(1)
        return torch.ops.aten.clamp_min.default(x, 0.0)

    custom = load_for_backend(path, "core", decompositions={torch.ops.aten.relu.default: relu_as_clamp})
    # relu -> clamp_min (ours) -> clamp (torch's table decomposes clamp_min further)
    assert "aten::relu.default" not in custom.ops() and "aten::clamp.default" in custom.ops()
    assert calls
    out = custom(*case.args)
    torch.testing.assert_close(out, case.model(*case.args), rtol=1e-5, atol=1e-5)


def test_custom_ops_are_kept_by_presets_and_lists_that_name_them(tmp_path):
    """A preset holds custom ops as they are; an op list that names one keeps it, one that does not gets
    the ATen ops of its kernel (tests/lowering/test_custom_op_inlining.py)."""
    path, case = _export(tmp_path, "custom_op")
    for preset in ("core", "core-tag", "max"):
        assert "pt2b_zoo::scaled_add.default" in load_for_backend(path, preset).ops()
    lowered = load_for_backend(path, supported_ops=["aten::*", "pt2b_zoo::*"])
    assert "pt2b_zoo::scaled_add.default" in lowered.ops()
    inlined = load_for_backend(path, supported_ops=["aten::*"])
    assert list(inlined.inlined_custom_ops()) == ["pt2b_zoo::scaled_add.default"]
    assert all(name.startswith("aten::") for name in inlined.ops())


def test_frozen_presets_match_running_torch():
    """Computed in a fresh process: torch's decomposition tables are process-global, and tests that import
    torch.testing._internal register ops of their own (_test::cat, ...) with decompositions in them."""
    import subprocess
    import sys

    code = ("from exporter.lowering import presets\n"
            "for name in presets.PRESETS:\n"
            "    frozen, live = presets.load(name), presets.compute(name)\n"
            "    if frozen != live:\n"
            "        print(f'schemas/opsets/{name}@{live.torch_version}.json is stale: run python -m tools.freeze_presets: '\n"
            "              f'{sorted(set(frozen.decompose) ^ set(live.decompose))[:8]} '\n"
            "              f'{sorted(set(frozen.opset or ()) ^ set(live.opset or ()))[:8]}')\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout == "", out.stdout


def test_concurrent_lowering_from_threads_and_no_global_state_left(tmp_path):
    path, case = _export(tmp_path, "transformer_encoder")
    before = {op: dict(op.py_kernels) for op in tables.available_decompositions()}
    results, errors = [], []

    def work(preset):
        try:
            results.append((preset, sorted(load_for_backend(path, preset).ops())))
        except Exception as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(p,)) for p in ["core", "core-tag", "core", "none", "max", "core"]]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    by_preset = {}
    for preset, ops in results:
        by_preset.setdefault(preset, ops)
        assert by_preset[preset] == ops
    after = {op: dict(op.py_kernels) for op in tables.available_decompositions()}
    assert before == after, "lowering left operator kernels changed"


def test_opset_show_and_diff_cli():
    from tests.cli.test_cli_convert import run_cli

    code, out, _ = run_cli("opset", "show", "core-tag")
    assert code == 0 and "core-tag@2.13" in out and "(closed: anything else is an error)" in out and "  aten::addmm.default" in out
    code, out, _ = run_cli("opset", "diff", "core@2.13", "core-tag@2.13")
    core, tag = presets.load("core@2.13"), presets.load("core-tag@2.13")
    only_core = sorted(set(core.decompose) - set(tag.decompose))
    assert code == 0 and f"decompose: {len(only_core)} only in core@2.13" in out
    assert f"  - {only_core[0]}" in out


def test_pinned_preset_guarantees_its_frozen_opset(tmp_path, monkeypatch):
    path, case = _export(tmp_path, "transformer_encoder")
    assert load_for_backend(path, "core@2.13").outside_opset == {}
    # simulate a newer torch whose table lets an op through that the frozen 2.13 list lacks
    frozen = presets.load("core@2.13")
    shrunk = presets.Preset(frozen.name, frozen.torch_version, frozen.description, frozen.decompose,
                            tuple(n for n in frozen.opset if n != "aten::addmm.default"), frozen.closed_opset)
    monkeypatch.setattr(presets, "load", lambda spec: shrunk)
    with pytest.raises(OpsetError, match=r"aten::addmm.default \(6 call sites\)"):
        load_for_backend(path, "core@2.13")
    assert "aten::addmm.default" in load_for_backend(path, "core").outside_opset  # unpinned: reported only


class _AttributeCache(torch.nn.Module):
    """A static cache kept as a plain tensor attribute, updated in place (biogpt's, mpt's and
    gemma3n's static-cache paths in transformers): torch.export lifts it as a constant."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)
        self.cache = torch.zeros(8, 4)

    def forward(self, x, pos):
        self.cache.index_copy_(0, pos, self.lin(x))
        return self.cache.sum(0)


@pytest.mark.parametrize("preset", ["none", "core", "max"])
def test_a_mutated_tensor_attribute_lowers_as_a_non_persistent_buffer(tmp_path, preset):
    """torch's run_decompositions refuses it ("Constant cache is mutated ... register it as buffer");
    pt2b writes its update back as a non-persistent buffer's, so that state carries across calls as
    it does in eager."""
    from torch.export.graph_signature import InputKind, OutputKind

    torch.manual_seed(0)
    model, x, pos = _AttributeCache(), torch.randn(2, 4), torch.tensor([1, 3])
    eager = copy.deepcopy(model)
    path = tmp_path / "m.pt2b"
    ep = export_model(model, (x, pos), path)
    assert [s.kind for s in ep.graph_signature.input_specs if s.target == "cache"] == [InputKind.CONSTANT_TENSOR]
    with pytest.raises(RuntimeError, match="Constant cache is mutated in the forward method"):
        ep.run_decompositions()
    lp = load_for_backend(path, preset, cache=False)
    sig = lp.exported_program().graph_signature
    spec = next(s for s in sig.input_specs if s.target == "cache")
    assert spec.kind == InputKind.BUFFER and spec.persistent is False
    assert [s.target for s in sig.output_specs if s.kind == OutputKind.BUFFER_MUTATION] == ["cache"]
    assert lp.validation.status == "passed"
    rt = Runtime(lp)
    with torch.no_grad():
        for step in range(3):  # the cache carries across calls
            torch.testing.assert_close(rt(x * step, pos + step), eager(x * step, pos + step))


class HalvesItsParameter(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.p = torch.nn.Parameter(torch.full((3,), 8.0))

    def forward(self, x):
        with torch.no_grad():
            self.p.div_(2)  # a parameter written in place: torch records it as a PARAMETER_MUTATION
        return x * self.p


@pytest.mark.parametrize("preset", ["none", "core", "max"])
def test_parameters_written_in_place_are_lowered_as_torch_lowers_them(tmp_path, preset):
    """Issue 37, case 6: lowered (and validated) with the write recorded as torch's run_decompositions
    records it; runtime_ref keeps the write across calls as eager does; the lowered file reads back."""
    from torch.export.graph_signature import OutputKind

    from runtime_ref import Runtime

    x = torch.randn(3)
    torchs = torch.export.export(HalvesItsParameter(), (x,)).run_decompositions()
    export_model(HalvesItsParameter(), (x,), tmp_path / "m.pt2b")
    lowered = load_for_backend(tmp_path / "m.pt2b", preset, cache=False)
    specs = [(s.kind, s.target) for s in lowered.exported_program().graph_signature.output_specs]
    assert specs == [(s.kind, s.target) for s in torchs.graph_signature.output_specs]
    assert specs[0] == (OutputKind.PARAMETER_MUTATION, "p")
    runtime, eager = Runtime(lowered), HalvesItsParameter()
    for _ in range(3):
        assert torch.equal(runtime(x), eager(x))
    export_model(lowered, path=tmp_path / "m.low.pt2b")
    assert torch.equal(load(tmp_path / "m.low.pt2b")(x), HalvesItsParameter()(x))
