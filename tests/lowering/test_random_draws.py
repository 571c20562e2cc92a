"""random_draws: which ops of a program draw random numbers, and which of its results they reach
(the checks that compare two runs compare those by shape and dtype only)."""

import pytest
import torch

from exporter.lowering.random_draws import drawing_ops, drawn_results, reached_outputs


class _Noisy(torch.nn.Module):
    """One output no draw reaches, a float and an integer one computed from a draw."""

    def forward(self, x):
        noise = torch.rand_like(x)
        return x * 2 + 1, x + noise, (noise > 0.5).sum(-1)


class _NoisyState(torch.nn.Module):
    """A buffer written from a draw, in place, and an output read from it after the write."""

    def __init__(self):
        super().__init__()
        self.register_buffer("walk", torch.zeros(4))

    def forward(self, x):
        before = x + self.walk
        self.walk.add_(torch.randn(4))
        return before, x + 1, x * self.walk


class _NoisyBranch(torch.nn.Module):
    def forward(self, x):
        return torch.cond(x.sum() > 0, lambda x: x + torch.rand_like(x), lambda x: x - 1, (x,)), x.cos()


def test_the_outputs_a_draw_reaches_are_found_by_position():
    ep = torch.export.export(_Noisy(), (torch.randn(2, 8),))
    drawn = drawn_results(ep)
    assert drawn.outputs == {1, 2} and drawn.ops == ("aten::rand_like.default",)
    assert not drawn.buffers and not drawn.inputs


@pytest.mark.parametrize("functional", [False, True])
def test_a_buffer_written_from_a_draw_and_what_reads_it_after_the_write_are_found(functional):
    ep = torch.export.export(_NoisyState(), (torch.randn(4),))
    if functional:
        ep = ep.run_decompositions({})
    drawn = drawn_results(ep)
    assert drawn.buffers == {"walk"}
    assert drawn.outputs == {2}  # (the first output reads the buffer before the write)


def test_a_subgraph_that_draws_makes_its_call_a_draw():
    ep = torch.export.export(_NoisyBranch(), (torch.randn(3),))
    assert drawn_results(ep).outputs == {0}
    (ops,) = reached_outputs(ep).values()
    assert ops == ["higher_order::cond (a subgraph that draws)"]


def test_a_program_without_draws_reaches_nothing():
    ep = torch.export.export(torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Dropout(0.5)).eval(),
                             (torch.randn(2, 4),))
    assert reached_outputs(ep) == {} and drawn_results(ep).outputs == frozenset()


@pytest.mark.parametrize("model, random", [
    (torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Dropout(0.5)).eval(), []),
    (torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Dropout(0.5)).train(), ["aten::dropout.default"]),
    (torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Dropout(0.0)).train(), []),
])
def test_only_random_ops_that_can_draw_count(model, random):
    ep = torch.export.export(model, (torch.randn(2, 4),))
    assert drawing_ops(ep) == random


def test_attention_without_dropout_cannot_draw():
    class Attn(torch.nn.Module):
        def forward(self, q):
            return torch.nn.functional.scaled_dot_product_attention(q, q, q)

    ep = torch.export.export(Attn(), (torch.randn(1, 2, 4, 8),))
    assert any(torch.Tag.nondeterministic_seeded in n.target.tags for n in ep.graph.nodes
               if isinstance(n.target, torch._ops.OpOverload))
    assert drawing_ops(ep) == [] and reached_outputs(ep) == {}
