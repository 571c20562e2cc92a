"""A number the program reads from a tensor it fixes (a buffer it never writes, through deterministic
ops and Python arithmetic) is handed to AOTInductor and ExecuTorch as the number itself: Mimi's and
Pocket TTS's decoders read their convolutions' padding from buffers, and both backends failed on the
unbacked symbols those reads make (exporter/backends/fixed_numbers.py)."""

from __future__ import annotations

import torch

from exporter import backends
from exporter.backends.fixed_numbers import fixed_numbers_read
from tests.support.helpers import CausalConvs

READS = (torch.ops.aten._local_scalar_dense.default, torch.ops.aten.item.default)


def _reads(ep) -> int:
    return sum(n.target in READS for n in ep.graph.nodes)


def test_reads_of_fixed_buffers_become_numbers_and_the_program_computes_the_same():
    model, x = CausalConvs().eval(), torch.randn(2, 4, 88)
    ep = torch.export.export(model, (x,)).run_decompositions({})
    assert _reads(ep) >= 4
    folded = fixed_numbers_read(ep)
    assert _reads(folded) == 0 and _reads(ep) >= 4  # (the program given is left as it was)
    with torch.no_grad():
        assert torch.equal(folded.module()(x), model(x))


class _ReadsInputAndWrittenBuffer(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("step", torch.tensor(3))
        self.register_buffer("fixed", torch.tensor(2))

    def forward(self, x, n):
        self.step.add_(1)
        return x[: n.item() + self.fixed.item()] * self.step.item()


def test_a_read_of_an_input_or_of_a_written_buffer_stays_a_read():
    x, n = torch.randn(8, 3), torch.tensor(4)
    ep = torch.export.export(_ReadsInputAndWrittenBuffer(), (x, n)).run_decompositions({})
    folded = fixed_numbers_read(ep)
    assert _reads(folded) == _reads(ep) - 1  # the fixed buffer's read alone
    torch.testing.assert_close(folded.module()(x, n), _ReadsInputAndWrittenBuffer()(x, n))
    in_place = torch.export.export(_ReadsInputAndWrittenBuffer(), (x, n))  # (add_ kept: nothing is folded)
    assert fixed_numbers_read(in_place) is in_place


def test_mimis_padding_runs_on_aotinductor():
    model, x = CausalConvs().eval(), torch.randn(2, 4, 88)
    compiled = backends.to_backend("inductor", torch.export.export(model, (x,)))
    assert compiled.validation.status == "passed"
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), model(x))
