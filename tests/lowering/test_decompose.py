"""Lowering leaves process-global operator state alone, and still equals torch's run_decompositions.

torch's ExportedProgram.run_decompositions rewrites the py_kernels of every preservable
CompositeImplicitAutograd op, registers fake-tensor rules and turns mkldnn/nnpack/cudnn off for the
whole process while it runs. pt2b's retrace (exporter/lowering/decompose.py) must do none of that:
a probe decomposition records the global state from INSIDE a lowering, where torch's changes would
be visible, and another thread runs eager code during lowerings.
"""

from __future__ import annotations

import copy
import threading

import pytest
import torch

from exporter import export_model, load_for_backend
from exporter.lowering import tables
from exporter.lowering.engines import run_decompositions
from exporter.graph_walk import op_counts
from runtime_ref import Runtime


def global_state() -> dict:
    """What torch's run_decompositions changes while it runs (and a thread might observe)."""
    from torch._export.utils import _collect_all_valid_cia_ops
    from torch._subclasses import fake_impls

    ops = sorted(_collect_all_valid_cia_ops(), key=str)
    return {
        "mkldnn": torch.backends.mkldnn.enabled,
        "nnpack": torch._C._get_nnpack_enabled(),
        "cudnn": torch.backends.cudnn.enabled,
        "py_kernels": {str(op): {str(k): id(v) for k, v in op.py_kernels.items()} for op in ops},
        "fake_rules": len(fake_impls.op_implementations_dict),
    }


class Probe:
    """A decomposition for aten.gelu that records the global state each time it is applied."""

    def __init__(self):
        self.seen = []

    def __call__(self, x, approximate="none"):
        self.seen.append(global_state())
        aten = torch.ops.aten
        return aten.mul.Tensor(aten.mul.Tensor(x, 0.5), aten.add.Tensor(aten.erf.default(aten.mul.Tensor(x, 0.5 ** 0.5)), 1))


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(8, 8)
        self.lstm = torch.nn.LSTM(8, 8, batch_first=True)

    def forward(self, x):
        y, _ = self.lstm(torch.nn.functional.gelu(self.fc(x)))
        return torch.nn.functional.scaled_dot_product_attention(y, y, y)


def program():
    torch.manual_seed(0)
    return torch.export.export(Net().eval(), (torch.randn(2, 5, 8),))


def test_probe_sees_what_torchs_run_decompositions_changes():
    """The probe is able to fail: inside torch's own run_decompositions it sees mkldnn off and
    py_kernels rewritten."""
    before = global_state()
    probe = Probe()
    table = dict(tables.torch_default_table())
    table[torch.ops.aten.gelu.default] = probe
    program().run_decompositions(table)
    assert probe.seen, "the probe decomposition was not applied"
    inside = probe.seen[0]
    assert inside["mkldnn"] is False and before["mkldnn"] is True
    changed = [op for op, k in inside["py_kernels"].items() if k != before["py_kernels"][op]]
    assert len(changed) > 100, changed[:5]
    after = global_state()  # put back afterwards (its fake-rule registry can end up smaller than before)
    assert after["py_kernels"] == before["py_kernels"] and after["mkldnn"]


@pytest.mark.parametrize("preset", ["core", "max", "none"])
def test_lowering_leaves_global_operator_state_alone(tmp_path, preset):
    assert torch.backends.mkldnn.enabled
    before = global_state()
    probe = Probe()
    path = tmp_path / "m.pt2b"
    torch.manual_seed(0)
    model = Net().eval()
    x = torch.randn(2, 5, 8)
    export_model(model, (x,), path)
    lowered = load_for_backend(path, preset, decompositions={torch.ops.aten.gelu.default: probe}, cache=False)
    assert probe.seen, "the probe decomposition was not applied"
    for inside in probe.seen:
        assert inside == before
    assert global_state() == before
    assert "aten::gelu.default" not in lowered.ops()
    with torch.no_grad():
        torch.testing.assert_close(lowered(x), model(x), rtol=1e-5, atol=1e-5)


def test_eager_code_in_another_thread_keeps_its_backends():
    """While one thread lowers, another runs eager code and reads the flags: mkldnn stays on and
    an LSTM gives bitwise the same results as before."""
    torch.manual_seed(1)
    model = torch.nn.LSTM(16, 16, batch_first=True).eval()
    x = torch.randn(4, 10, 16)
    with torch.no_grad():
        expected = model(x)[0]
    ep = program()
    stop = threading.Event()
    seen = []

    def eager():
        with torch.no_grad():
            while not stop.is_set():
                seen.append((torch.backends.mkldnn.enabled, torch.equal(model(x)[0], expected)))

    t = threading.Thread(target=eager)
    t.start()
    try:
        for _ in range(3):
            run_decompositions(ep, tables.torch_default_table())
    finally:
        stop.set()
        t.join()
    assert seen and all(flag and same for flag, same in seen), seen[:3]


def test_lstm_lowers_as_torch_does_with_mkldnn_on():
    """torch's lstm decomposition reads the global mkldnn flag (run_decompositions turns it off);
    pt2b gets the same graph without touching the flag."""
    ep = program()
    assert torch.backends.mkldnn.enabled
    ours = run_decompositions(ep, tables.torch_default_table())
    theirs = ep.run_decompositions()
    assert op_counts(ours.graph_module) == op_counts(theirs.graph_module)
    assert "aten::mkldnn_rnn_layer.default" not in op_counts(ours.graph_module)
    x = torch.randn(2, 5, 8)
    torch.testing.assert_close(copy.deepcopy(ours).module()(x), copy.deepcopy(theirs).module()(x), rtol=0, atol=0)


def test_program_with_buffer_and_input_mutation_keeps_its_signature():
    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("count", torch.zeros(3))

        def forward(self, x, y):
            self.count.add_(1)
            y.mul_(2)
            return torch.nn.functional.silu(x + self.count)

    ep = torch.export.export(M(), (torch.randn(3), torch.randn(3)))
    ours = run_decompositions(ep, tables.torch_default_table())
    theirs = ep.run_decompositions()
    kinds = lambda e: ([(s.kind, s.target) for s in e.graph_signature.input_specs],  # noqa: E731
                       [(s.kind, s.target) for s in e.graph_signature.output_specs])
    assert kinds(ours) == kinds(theirs)
    assert op_counts(ours.graph_module) == op_counts(theirs.graph_module)
    x, y1 = torch.randn(3), torch.randn(3)
    y2 = y1.clone()
    a, b = copy.deepcopy(ours).module(), copy.deepcopy(theirs).module()
    torch.testing.assert_close(a(x, y1), b(x, y2), rtol=0, atol=0)
    torch.testing.assert_close(y1, y2, rtol=0, atol=0)
    torch.testing.assert_close(a.count, b.count, rtol=0, atol=0)


def test_conjugate_view_is_materialized_before_an_op_without_a_conjugate_kernel():
    """Above autograd an FFT's conjugate view reaches _fft_c2r as a view; torch's graph (below
    autograd, where the dispatcher's conjugate fallback runs) clones it first: pt2b's does too."""
    class HFFT(torch.nn.Module):
        def forward(self, x):
            return torch.fft.hfft(x, n=10)

    x = torch.randn(4, 6, dtype=torch.complex64)
    ep = torch.export.export(HFFT(), (x,))
    ours = run_decompositions(ep, tables.torch_default_table())
    theirs = ep.run_decompositions()
    assert op_counts(ours.graph_module) == op_counts(theirs.graph_module)
    assert op_counts(ours.graph_module).get("aten::clone.default") == 1
    (conj,) = [n for n in ours.graph.nodes if n.target is torch.ops.aten._conj.default]
    assert [u.target for u in conj.users] == [torch.ops.aten.clone.default]
    torch.testing.assert_close(ours.module()(x), torch.fft.hfft(x, n=10), rtol=0, atol=0)


# ---- the whole corpus against torch (slow: 3 min on 2 workers; `pytest -n 2 -m slow tests/lowering/test_decompose.py`) ----

def pytest_generate_tests(metafunc):
    """The corpus (a minute to build) only when slow tests are selected."""
    if "program" not in metafunc.fixturenames:
        return
    programs = []
    if "not slow" not in (metafunc.config.option.markexpr or ""):
        from tests.support.lowering_corpus import exportdb_programs, opinfo_programs, zoo_programs

        programs = zoo_programs() + exportdb_programs() + opinfo_programs(every=1)
    metafunc.parametrize("program", programs, ids=lambda p: p.id)


@pytest.mark.slow
@pytest.mark.parametrize("table_name", ["core", "none"])
def test_corpus_lowers_as_torchs_run_decompositions(program, table_name):
    """Every program of the round-trip corpus (zoo, ExportDB, every OpInfo sample): the same op
    counts and signature as torch's run_decompositions, and bitwise-equal outputs."""
    model, args, kwargs, dyn, strict = program.make()
    try:
        ep = torch.export.export(model, args, kwargs, dynamic_shapes=dyn, strict=strict)
    except Exception as e:  # noqa: BLE001 -- the sample is not exportable: nothing to compare
        pytest.skip(f"torch.export cannot capture it: {type(e).__name__}")
    table = tables.torch_default_table() if table_name == "core" else {}
    theirs = ep.run_decompositions(dict(table))
    ours = run_decompositions(ep, dict(table))
    assert op_counts(ours.graph_module) == op_counts(theirs.graph_module)
    kinds = lambda e: ([(s.kind, s.target) for s in e.graph_signature.input_specs],  # noqa: E731
                       [s.kind for s in e.graph_signature.output_specs])
    assert kinds(ours) == kinds(theirs)
    with torch.no_grad():
        a = copy.deepcopy(ours).module()(*copy.deepcopy(args), **copy.deepcopy(kwargs))
        b = copy.deepcopy(theirs).module()(*copy.deepcopy(args), **copy.deepcopy(kwargs))
    for x, y in zip(torch.utils._pytree.tree_leaves(a), torch.utils._pytree.tree_leaves(b), strict=True):
        if isinstance(x, torch.Tensor):
            if x.dtype == torch.complex32:  # torch.equal has no ComplexHalf kernel: compare as pairs
                x, y = torch.view_as_real(x), torch.view_as_real(y)
            assert torch.equal(x, y)
        else:
            assert x == y


class _DropoutThenInPlace(torch.nn.Module):
    """What XLM/Flaubert's embeddings do: dropout (an alias of its input in eval mode), then write
    into its result in place."""

    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(10, 8)
        self.ln = torch.nn.LayerNorm(8)

    def forward(self, ids, mask):
        t = torch.nn.functional.dropout(self.ln(self.emb(ids)), p=0.1, training=self.training)
        t *= mask.unsqueeze(-1).to(t.dtype)
        return t


@pytest.mark.parametrize("preset", ["none", "core", "max"])
def test_in_place_write_into_an_eval_dropout_lowers_as_torch_does(tmp_path, preset):
    """Export-mode functionalization freezes dropout's result; torch decomposes dropout first (a
    clone in eval mode) and lowers the program: so does pt2b, with torch's op counts."""
    model = _DropoutThenInPlace().eval()
    ids, mask = torch.randint(0, 10, (2, 5)), (torch.rand(2, 5) > 0.3).float()
    path = tmp_path / "m.pt2b"
    ep = export_model(model, (ids, mask), path)
    lowered = load_for_backend(path, preset, cache=False)
    table = {"none": {}, "core": None, "max": tables.available_decompositions()}[preset]
    theirs = ep.run_decompositions() if table is None else ep.run_decompositions(table)

    assert op_counts(lowered.exported_program().graph_module) == op_counts(theirs.graph_module)
    torch.testing.assert_close(Runtime(lowered)(ids, mask), model(ids, mask))


class _TensorConstant(torch.nn.Module):
    """torch.tensor(...) in forward: torch.export records an in-place detach_ after the constant."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)

    def forward(self, x):
        scale = torch.tensor([0.5, 1.0, 1.5, 2.0])
        return torch.nn.functional.gelu(self.lin(x) * scale).softmax(-1)


def test_lowered_nodes_keep_the_programs_stack_traces_where_detach_is_skipped(tmp_path):
    """The retrace of a program holding detach_ carries each node's stack trace and module stack over
    to the nodes its decomposition emits, as for any other program (no stack trace recorded inside
    pt2b's own code), and the detach_ is gone, with torch's op counts and eager's outputs."""
    model, x = _TensorConstant().eval(), torch.randn(3, 4)
    path = tmp_path / "m.pt2b"
    ep = export_model(model, (x,), path)
    assert any(n.target is torch.ops.aten.detach_.default for n in ep.graph.nodes)
    lowered = load_for_backend(path, "core", cache=False)
    gm = lowered.exported_program().graph_module
    calls = [n for n in gm.graph.nodes if n.op == "call_function"]
    traces = [n.meta.get("stack_trace") or "" for n in calls]
    assert not [t for t in traces if "exporter/" in t or "exporter\\" in t]
    assert any("forward" in t and "test_decompose.py" in t for t in traces)
    assert sum(1 for n in calls if n.meta.get("nn_module_stack")) >= 2  # the linear's nodes, at least
    assert not [n for n in calls if "detach" in str(n.target)]
    assert op_counts(gm) == op_counts(ep.run_decompositions().graph_module)
    torch.testing.assert_close(Runtime(lowered)(x), model(x))
