"""The cost of one run of an exported program: FLOPs by torch's own formulas, bytes moved, symbolic sizes,
and the machine's measured rates."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.export import Dim
from torch.utils.flop_counter import FlopCounterMode

from exporter.lowering.run_cost import FRESH_BYTES, Rates, Work, estimated_run_seconds, program_work, rates


def _eager_flops(fn, *args) -> int:
    """torch's own count of an eager run: the reference."""
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        fn(*args)
    return counter.get_total_flops()


class _Call(torch.nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, *args):
        return self.fn(*args)


def _math_attention(q, k, v):
    """Attention written out: two batched products (torch counts no FLOPs for the CPU fused kernel)."""
    return torch.softmax(q @ k.transpose(-2, -1) / q.shape[-1] ** 0.5, dim=-1) @ v


def test_linear_flops_are_exact():
    model, x = torch.nn.Linear(64, 32), torch.randn(8, 64)
    work = program_work(torch.export.export(model, (x,)))
    assert work.flops == {torch.float32: 2 * 8 * 64 * 32}
    assert work.flops[torch.float32] == _eager_flops(model, x)
    assert work.unknown == 0


@pytest.mark.parametrize("name", ["linear_3d", "conv2d", "bmm", "matmul_broadcast", "sdpa"])
def test_flops_match_torch_counter(name):
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 4, 16, 8) for _ in range(3))
    model, args, reference = {
        "linear_3d": (torch.nn.Linear(16, 24), (torch.randn(3, 5, 16),), None),
        "conv2d": (torch.nn.Conv2d(3, 8, 3, padding=1, stride=2), (torch.randn(2, 3, 16, 16),), None),
        "bmm": (_Call(torch.bmm), (torch.randn(4, 8, 16), torch.randn(4, 16, 5)), None),
        "matmul_broadcast": (_Call(torch.matmul), (torch.randn(2, 3, 8, 16), torch.randn(16, 5)), None),
        "sdpa": (_Call(F.scaled_dot_product_attention), (q, k, v), _Call(_math_attention)),
    }[name]
    expected = _eager_flops(reference or model, *args)
    assert expected > 0
    work = program_work(torch.export.export(model, args))
    assert work.flops == {torch.float32: expected}
    assert work.unknown == 0


def test_bfloat16_work_is_counted_under_bfloat16():
    model, x = torch.nn.Linear(64, 32).to(torch.bfloat16), torch.randn(8, 64, dtype=torch.bfloat16)
    work = program_work(torch.export.export(model, (x,)))
    assert work.flops == {torch.bfloat16: 2 * 8 * 64 * 32}
    # the output written; weight and bias read (the state's bytes, at the rate a product reads weights)
    assert work.bytes == 2 * 8 * 32 and work.state_bytes == {torch.bfloat16: 2 * (64 * 32 + 32)}


def test_a_view_moves_no_bytes():
    x = torch.randn(4, 6)
    assert program_work(torch.export.export(_Call(lambda t: t.view(24)), (x,))) == Work({}, 0, 0)
    assert program_work(torch.export.export(_Call(lambda t: t + 1), (x,))).bytes == x.nbytes


def test_an_in_place_op_writes_its_bytes():
    x = torch.randn(4, 6)
    ep = torch.export.export(_Call(lambda t: (t * 2).relu_()), (x,))
    assert torch.ops.aten.relu_.default in {n.target for n in ep.graph.nodes}
    assert program_work(ep).bytes == 2 * x.nbytes



def test_a_large_output_counts_at_the_fresh_memory_rate():
    """An output of FRESH_BYTES or more is mapped anew for each op that makes it: its bytes are counted
    apart and priced at the fresh-memory rate (measured once, when first asked for, never above the
    copy rate); a smaller one at the copy rate."""
    small, large = torch.randn(4, 6), torch.empty(FRESH_BYTES // 4 + 8, device="meta")
    ep = torch.export.export(_Call(lambda t: t + 1), (large,))
    work = program_work(ep)
    assert (work.fresh_bytes, work.bytes) == (large.nbytes, 0)
    assert program_work(torch.export.export(_Call(lambda t: t + 1), (small,))).fresh_bytes == 0
    fixed = Rates({torch.float32: 1e9}, 4e9, fresh_bytes_per_s=[1e9])
    assert work.seconds(fixed) == pytest.approx(large.nbytes / 1e9)
    measured = rates()
    assert 0 < measured.fresh_rate() <= measured.bytes_per_s
    assert measured.fresh_rate() == measured.fresh_rate() and len(measured.fresh_bytes_per_s) == 1

class _TwoReads(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(4, 6))
        self.register_buffer("unused", torch.randn(100))

    def forward(self, x):
        return self.w * x + self.w


def test_a_parameter_read_twice_counts_once():
    x = torch.randn(4, 6)
    work = program_work(torch.export.export(_TwoReads(), (x,)))
    # the product and the sum written, the parameter read once; the buffer nothing reads counts nothing
    assert work.bytes == 2 * x.nbytes and work.state_bytes == {torch.float32: x.nbytes}
    assert work.flops == {} and work.unknown == 0


def test_a_dynamic_dim_follows_the_given_size_else_the_hint():
    model = torch.nn.Linear(64, 32)
    ep = torch.export.export(model, (torch.randn(8, 64),), dynamic_shapes=({0: Dim("batch")},))
    (symbol,) = ep.range_constraints
    assert program_work(ep).flops == {torch.float32: 2 * 8 * 64 * 32}
    assert program_work(ep, {symbol: 4}).flops == {torch.float32: 2 * 4 * 64 * 32}
    assert program_work(ep, {str(symbol): 16}).flops == {torch.float32: 2 * 16 * 64 * 32}
    assert program_work(ep, {symbol: 4}).bytes == 4 * 4 * 32


def test_a_size_without_a_hint_leaves_its_nodes_out():
    ep = torch.export.export(_Call(lambda t: torch.nonzero(t) * 2), (torch.randn(8, 4),))
    work = program_work(ep)
    assert work.unknown == 2  # nonzero and the product, both of data-dependent length
    assert work.bytes == 0 and work.flops == {}


class _Branches(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(64, 32))

    def forward(self, x):
        return torch.cond(x.sum() > 0, lambda t: t @ self.w, lambda t: (t * 2) @ self.w, (x,))


def test_the_bodies_of_higher_order_ops_are_counted():
    work = program_work(torch.export.export(_Branches(), (torch.randn(8, 64),)))
    assert work.flops == {torch.float32: 2 * (2 * 8 * 64 * 32)}  # each branch once
    assert work.unknown == 0


def test_seconds_add_each_dtype_at_its_rate_and_the_bytes():
    measured = Rates({torch.float32: 1e9, torch.bfloat16: 5e8}, 2e9)
    work = Work({torch.float32: 2_000_000_000, torch.bfloat16: 1_000_000_000, torch.float64: 1_000_000_000},
                4_000_000_000, 0)
    # float64 is not measured: it runs at float32's rate
    assert work.seconds(measured) == pytest.approx(2 + 2 + 1 + 2)
    # the weights read at the rate a product of a few rows reads them, per dtype (else float32's, else the copy's)
    weights = Work({}, 0, 0, state_bytes={torch.bfloat16: 3_000_000_000, torch.float16: 1_000_000_000})
    assert weights.seconds(Rates({torch.float32: 1e9}, 2e9, {torch.bfloat16: 1e9})) == pytest.approx(3 + 0.5)
    assert weights.seconds(Rates({torch.float32: 1e9}, 2e9, {torch.bfloat16: 1e9, torch.float32: 4e9})) == \
        pytest.approx(3 + 0.25)


def test_rates_are_measured_once():
    first = rates()
    assert rates() is first
    assert first.flops_rate(torch.bfloat16) > 0 and first.weight_rate(torch.bfloat16) > 0  # (measured when asked)
    assert {torch.float32, torch.bfloat16} <= set(first.flops_per_s)
    assert all(r > 0 for r in first.flops_per_s.values()) and first.bytes_per_s > 0
    before = dict(first.flops_per_s)
    first.flops_rate(torch.bfloat16)
    assert first.flops_per_s == before  # (once)



def test_a_matmul_rate_read_near_its_floor_is_read_once_more(monkeypatch):
    """A busy moment reads a rate near the floor: it is read again and the faster reading kept; a plausible
    first reading is kept as it is, without a second."""
    import exporter.lowering.run_cost as rc

    readings = iter([1e9, 1.5e11, 9e10])
    calls = []
    monkeypatch.setattr(rc, "_matmul_rate", lambda dtype, deadline: calls.append(dtype) or next(readings))
    monkeypatch.setattr(rc, "_weight_rate", lambda dtype, deadline: 1e10)
    slow_first = Rates({}, 2e10, {}, measure=True)
    assert slow_first.flops_rate(torch.float32) == 1.5e11 and len(calls) == 2
    plausible = Rates({}, 2e10, {}, measure=True)
    assert plausible.flops_rate(torch.float32) == 9e10 and len(calls) == 3

def test_estimated_run_seconds_is_the_work_at_the_rates():
    ep = torch.export.export(torch.nn.Linear(64, 32), (torch.randn(8, 64),))
    assert estimated_run_seconds(ep) == pytest.approx(program_work(ep).seconds(rates()))
    assert estimated_run_seconds(ep) > 0
