"""Validation where the two programs' runs would cost more than the lowering (a large model): each
decomposition applied is checked against its op call by call (exporter/lowering/op_checks.py), once per
call signature, on values of the program's shapes; neither program runs. What the checks cannot speak
for (a program that writes its state back, an op in a subgraph) is still validated on the programs."""

from __future__ import annotations

import pytest
import torch

from exporter import export_model, load, load_for_backend
from exporter.errors import OpsetError
from exporter.lowering import op_checks, run_cost
from exporter.lowering import validate as V
from exporter.lowering.plan import plan_lowering

aten = torch.ops.aten


class _Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.ln, self.qkv, self.out = torch.nn.LayerNorm(16), torch.nn.Linear(16, 48), torch.nn.Linear(16, 16)

    def forward(self, x, mask):
        q, k, v = self.qkv(self.ln(x)).chunk(3, -1)
        a = torch.nn.functional.scaled_dot_product_attention(q[:, None], k[:, None], v[:, None], attn_mask=mask)
        return x + self.out(torch.nn.functional.silu(torch.nn.functional.gelu(a[:, 0])))


class _Decoder(torch.nn.Module):
    """Four equal layers: their decomposed calls share one signature each."""

    def __init__(self):
        super().__init__()
        self.layers = torch.nn.ModuleList(_Block() for _ in range(4))

    def forward(self, x, ids):
        mask = torch.arange(x.shape[1])[None, :] <= ids[:, None]  # (cheap: computed, not drawn)
        for layer in self.layers:
            x = layer(x, mask)
        return x


@pytest.fixture
def large(monkeypatch):
    """Every program estimated to run for a minute: larger than any lowering's time."""
    monkeypatch.setattr(run_cost.Work, "seconds", lambda self, rates: 60.0)


@pytest.fixture
def runs(monkeypatch):
    """How many times validation ran a program (whole, on an input set)."""
    count = {"runs": 0}
    real_call, real_record = V._Runner.__call__, V._Runner.record

    def call(self, *a, **k):
        count["runs"] += 1
        return real_call(self, *a, **k)

    def record(self, *a, **k):
        count["runs"] += 1
        return real_record(self, *a, **k)

    monkeypatch.setattr(V._Runner, "__call__", call)
    monkeypatch.setattr(V._Runner, "record", record)
    return count


def _decoder(tmp_path):
    torch.manual_seed(0)
    model = _Decoder().eval()
    args = (torch.randn(2, 10, 16), torch.arange(10))
    seq = torch.export.Dim("seq", min=2, max=64)
    path = tmp_path / "m.pt2b"
    export_model(model, args, path, dynamic_shapes={"x": {1: seq}, "ids": {0: seq}})
    return model, args, path


def test_a_large_program_is_validated_op_by_op_and_runs_no_program(tmp_path, large, runs):
    model, args, path = _decoder(tmp_path)
    lp = load_for_backend(path, "core", cache=False)
    v = lp.validation
    assert (v.status, v.scope, v.derived) == ("passed", "ops", "ops")
    assert runs["runs"] == 0  # neither program ran
    # sdpa and silu compute values anew (layer_norm and linear run eager's own kernels: nothing to check);
    # the four layers' calls share one signature per op
    assert v.calls == 2 and v.verdict in ("exact", "ulp") and v.max_rel <= v.bound == 1e-3
    assert "validation passed op by op" in lp.report() and "2 distinct call(s)" in v.describe()
    torch.testing.assert_close(lp.exported_program().module()(*args), model(*args))


def test_the_values_are_the_program_s_where_cheap_and_drawn_elsewhere(tmp_path):
    _, _, path = _decoder(tmp_path)
    ep = load(path).exported_program()
    plan = plan_lowering("core")
    applied = V.applied_decompositions(ep, plan.table)
    checks = op_checks.check_calls(ep, applied, plan.table, V.bounds_for(applied, ep), ep.example_inputs)
    assert [V.op_name(op) for op in checks.ops] == ["aten::scaled_dot_product_attention.default", "aten::silu.default"]
    # the mask (arange <= ids) is computed from the stored ids; the attention's q, k, v and silu's
    # input, made by linear layers, are drawn
    assert checks.own_values >= 1 and checks.random_values >= 3
    again = op_checks.check_calls(ep, applied, plan.table, V.bounds_for(applied, ep), ep.example_inputs)
    assert again == checks  # (the same values each time: a verdict is reproducible)


def test_the_drawn_values_are_windows_of_one_draw(tmp_path, monkeypatch):
    """Issue 69: drawing each value anew cost 10 ns an element, most of a convolutional net's op checks;
    the values are windows of one pool drawn once (two windows of it differ), normal as before."""
    _, _, path = _decoder(tmp_path)
    ep = load(path).exported_program()
    plan = plan_lowering("core")
    applied = V.applied_decompositions(ep, plan.table)
    draws, real = [], torch.randn
    monkeypatch.setattr(torch, "randn", lambda *a, **k: draws.append(a) or real(*a, **k))
    sizes = op_checks.input_sizes(ep, ep.example_inputs)
    values = op_checks._Values(ep, list(ep.example_inputs[0]), sizes, run_cost.program_work(ep, sizes).heavy)
    q = [n for n in ep.graph.nodes if n.op == "call_function" and n.target is aten.linear.default]
    got = [values.of(n) for n in q]
    assert len(got) == 8 and values.drawn == 8 and len(draws) == 1
    assert all(not torch.equal(a, b) for a, b in zip(got, got[1:]))
    pooled = torch.cat([g.reshape(-1) for g in got])
    assert abs(pooled.mean().item()) < 0.1 and 0.9 < pooled.std().item() < 1.1


def _wrong_silu(x):
    return x * torch.sigmoid(x) * 1.01


def _half_gelu(x, approximate="none"):
    return 0.5 * x


def test_a_wrong_decomposition_is_found_op_by_op_and_kept(tmp_path, large, runs):
    """gelu is in the core opset: its wrong decomposition is found op by op and kept undecomposed."""
    model, args, path = _decoder(tmp_path)
    lp = load_for_backend(path, "core", cache=False, decompositions={aten.gelu.default: _half_gelu})
    v = lp.validation
    assert list(v.kept) == ["aten::gelu.default"] and "_half_gelu" in v.kept["aten::gelu.default"]
    assert (v.status, v.scope) == ("passed", "program")  # (the repair is validated on the programs)
    assert lp.ops().get("aten::gelu.default") == 4
    torch.testing.assert_close(lp.exported_program().module()(*args), model(*args))


def test_a_wrong_decomposition_of_an_op_the_backend_lacks_is_an_opset_error(tmp_path, large, runs):
    _, _, path = _decoder(tmp_path)
    with pytest.raises(OpsetError, match=r"the decomposition of aten::silu\.default \(.*_wrong_silu\) makes the "
                                         r"program wrong at node silu: where aten::silu\.default runs: its "
                                         r"decomposition \(.*_wrong_silu\) differs from it on a call of shapes the "
                                         r"program calls it with: a float32 output differs by 0\.01"):
        load_for_backend(path, "core", cache=False, decompositions={aten.silu.default: _wrong_silu})
    assert runs["runs"] == 0  # found without running either program


class _Counter(torch.nn.Module):
    """Writes its buffer: what functionalization writes back is the programs' to show."""

    def __init__(self):
        super().__init__()
        self.register_buffer("seen", torch.zeros(4))

    def forward(self, x):
        self.seen.add_(1)
        return torch.nn.functional.silu(x) + self.seen


def test_a_program_that_writes_its_state_is_validated_on_the_programs(tmp_path, large, runs):
    path = tmp_path / "c.pt2b"
    export_model(_Counter(), (torch.randn(3, 4),), path)
    v = load_for_backend(path, "core", cache=False).validation
    assert (v.status, v.scope) == ("passed", "program") and runs["runs"] >= 2


def test_the_runs_are_kept_where_they_cost_less_than_the_lowering(tmp_path, runs, monkeypatch):
    """The work counted, at a machine's rates (fixed here: a busy machine measures its own slower): a
    tiny program's runs cost less than its lowering."""
    f32 = torch.float32
    monkeypatch.setattr(run_cost, "_RATES", run_cost.Rates({f32: 1e11}, 1e10, {f32: 1e10}))
    _, _, path = _decoder(tmp_path)
    ep = load(path).exported_program()
    assert V.PROGRAM_RUNS * run_cost.estimated_run_seconds(ep) < 1e-3
    v = load_for_backend(path, "core", cache=False).validation
    assert (v.status, v.scope) == ("passed", "program") and runs["runs"] >= 2




def test_where_the_checks_cost_more_than_the_runs_can_the_unlowered_program_is_not_priced(tmp_path, large, runs,
                                                                                         monkeypatch):
    """Issue 69: the checks' traces are weighed against twice the lowered program's runs (the most both
    programs' can cost) before the unlowered program is priced; where they cost more, it never is, and the
    programs run."""
    priced = []
    real = run_cost.program_work
    monkeypatch.setattr(run_cost, "program_work", lambda program, *a, **k: priced.append(program) or real(program, *a, **k))
    monkeypatch.setattr(V, "CHECK_ESTIMATE", 1e6)  # each check priced above any runs
    _, _, path = _decoder(tmp_path)
    v = load_for_backend(path, "core", cache=False).validation
    assert (v.status, v.scope) == ("passed", "program") and runs["runs"] >= 2
    assert len(priced) == 1  # the lowered program: linear decomposed, layer_norm too
    assert {aten.linear.default, aten.layer_norm.default} & {n.target for n in priced[0].graph.nodes} == set()


class _Attention(torch.nn.Module):
    def forward(self, q, k, v):
        return torch.nn.functional.scaled_dot_product_attention(q, k, v)


def test_a_lowered_program_that_writes_far_more_is_priced_on_its_own(tmp_path, runs, monkeypatch):
    """Core decomposes sdpa into score matrices (here 3000 x 3000 float32, 36 MB each) that the op never
    writes: the unlowered program's runs fit the lowering's time at these rates, the lowered program's
    large outputs (at the fresh-memory rate) do not, so the calls are checked instead of running both."""
    f32 = torch.float32
    monkeypatch.setattr(run_cost, "_RATES", run_cost.Rates({f32: 1e11}, 1e10, {f32: 1e10}, fresh_bytes_per_s=[1e7]))
    args = tuple(torch.randn(1, 1, 3000, 8, generator=torch.Generator().manual_seed(i)) for i in range(3))
    path = tmp_path / "m.pt2b"
    export_model(_Attention(), args, path)
    source = load(path).exported_program()
    sizes = op_checks.input_sizes(source, (args, {}))
    assert V.PROGRAM_RUNS * run_cost.program_work(source, sizes).seconds(run_cost.rates()) < V.RUNS_ALWAYS
    lp = load_for_backend(path, "core", cache=False)
    assert V.PROGRAM_RUNS * run_cost.program_work(lp.exported_program(), sizes).seconds(run_cost.rates()) > 1.0
    v = lp.validation
    assert (v.status, v.scope, v.calls, runs["runs"]) == ("passed", "ops", 1, 0), v.describe()
    torch.testing.assert_close(lp(*args), _Attention()(*args))

class _Autocast(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(8, 8)

    def forward(self, x):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            h = torch.nn.functional.silu(self.a(x))
        return h.float().softmax(-1)


def test_a_program_with_an_autocast_region_is_validated_on_the_programs(tmp_path, large, runs):
    """A call in the region computes in bfloat16: only the program's run knows which calls are there."""
    path = tmp_path / "a.pt2b"
    export_model(_Autocast(), (torch.randn(4, 8),), path)
    v = load_for_backend(path, "core", cache=False).validation
    assert (v.status, v.scope) == ("passed", "program") and runs["runs"] >= 2


_LOWERED_ALIKE = [
    (aten.silu.default, lambda g: ((torch.randn(4, 8, generator=g),), {})),
    (aten.mish.default, lambda g: ((torch.randn(4, 8, generator=g),), {})),
    (aten.std.correction, lambda g: ((torch.randn(4, 8, generator=g), [1]), {"correction": 1, "keepdim": True})),
    (aten.group_norm.default, lambda g: ((torch.randn(2, 4, 3, 3, generator=g), 2, torch.randn(4, generator=g),
                                          torch.randn(4, generator=g)), {})),
    (aten.layer_norm.default, lambda g: ((torch.randn(2, 3, 8, generator=g), [8], torch.randn(8, generator=g),
                                          torch.randn(8, generator=g)), {})),
    (aten.linear.default, lambda g: ((torch.randn(2, 3, 8, generator=g), torch.randn(5, 8, generator=g)), {})),
    (aten.softmax.int, lambda g: ((torch.randn(4, 8, generator=g), -1), {})),
    (aten.logsumexp.default, lambda g: ((torch.randn(4, 8, generator=g), [1]), {})),
    (aten.scaled_dot_product_attention.default,
     lambda g: (tuple(torch.randn(1, 2, 6, 4, generator=g) for _ in range(3)), {"is_causal": True})),
    (aten.silu_.default, lambda g: ((torch.randn(4, 8, generator=g),), {})),
]


@pytest.mark.parametrize("op, make", _LOWERED_ALIKE, ids=lambda v: str(v) if isinstance(v, torch._ops.OpOverload) else "")
def test_a_call_is_lowered_as_a_trace_of_it_computes_bit_for_bit(op, make):
    """Issue 69: the op-by-op check runs a call's lowered form under a dispatch mode (op_checks.Decomposed)
    instead of tracing it with the table (make_fx, 10-25 ms a signature): the same ops on the same
    arguments, so the same bits as the trace's graph run on the call's values."""
    from torch.fx.experimental.proxy_tensor import make_fx

    from exporter.lowering.decompose import shared_trace_table

    full = shared_trace_table(plan_lowering("core").table)
    fn = full[op]
    args, kwargs = make(torch.Generator().manual_seed(0))
    tensors = [a for a in args if isinstance(a, torch.Tensor)]

    def call(*ts):
        it = iter(ts)
        return fn(*[next(it) if isinstance(a, torch.Tensor) else a for a in args], **kwargs)

    traced = make_fx(call, decomposition_table=full, tracing_mode="fake")(*tensors)
    ran = {n.target for n in traced.graph.nodes if n.op == "call_function"}
    assert op not in ran  # (lowered: the trace does not call the op itself)
    want = traced(*[t.clone() for t in tensors])
    got = op_checks.Decomposed(full)(fn, tuple(a.clone() if isinstance(a, torch.Tensor) else a for a in args), kwargs)
    assert all(torch.equal(a, b) for a, b in zip(torch.utils._pytree.tree_leaves(got), torch.utils._pytree.tree_leaves(want)))


def test_an_op_check_seeds_without_queueing_calls_for_devices_it_does_not_use(tmp_path, large, runs, monkeypatch):
    """Issue 69: each op check seeds both sides alike; torch.manual_seed also queues a call for each lazy
    device module (CUDA, XPU, MTIA) not initialized, formatting its stack each time (0.3 ms, twice per
    check). The checks seed the CPU's generator (and CUDA's where it is initialized): no stack is formatted."""
    import traceback

    _, _, path = _decoder(tmp_path)
    formatted = []
    real = traceback.format_stack
    monkeypatch.setattr(traceback, "format_stack", lambda *a, **k: formatted.append(1) or real(*a, **k))
    v = load_for_backend(path, "core", cache=False).validation
    assert (v.status, v.scope, runs["runs"]) == ("passed", "ops", 0) and v.calls > 0
    assert formatted == []
