"""The programs a lowering makes on the way generate no Python code (exporter/_torch/deferred_codegen.py);
the one it returns is compiled and runs as torch's does; nothing leaks to other threads or to
torch.export itself."""

import threading

import torch
from torch import nn

from exporter import export_model, load_for_backend
from exporter._torch import deferred_codegen as dc
from exporter.lowering.lower import lower
from exporter.lowering.plan import plan_lowering
from tests.support.helpers import assert_bitwise


class Block(nn.Module):
    def __init__(self, d=16):
        super().__init__()
        self.lin, self.norm = nn.Linear(d, d), nn.LayerNorm(d)

    def forward(self, x):
        return x + torch.nn.functional.gelu(self.norm(self.lin(x)))


class Stack(nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList(Block() for _ in range(4))

    def forward(self, x):
        for b in self.blocks:
            x = b(x)
        return x.softmax(-1)


def _exported():
    torch.manual_seed(0)
    m = Stack().eval()
    x = torch.randn(3, 16)
    return m, x, torch.export.export(m, (x,))


def test_a_program_made_inside_deferred_generates_its_code_on_first_run_and_runs_as_eagerly_made():
    m, x, ep = _exported()
    with dc.deferred():
        inside = ep.run_decompositions()
    outside = ep.run_decompositions()
    assert dc.is_deferred(inside.graph_module) and not dc.is_deferred(outside.graph_module)
    assert_bitwise(inside.module()(x), outside.module()(x))
    assert inside.graph_module.code == outside.graph_module.code  # code generated on first use
    assert not dc.is_deferred(inside.graph_module)


def test_the_lowered_program_is_compiled_and_the_one_read_from_the_file_is_left_to_first_use(tmp_path):
    m, x, ep = _exported()
    path = tmp_path / "stack.pt2b"
    export_model(ep, path=path)
    lowered = load_for_backend(path, "core", cache=False, validate=False)
    assert lowered.reused is not None  # the four blocks: collapsed, lowered, expanded (three programs)
    assert not dc.is_deferred(lowered.exported_program().graph_module)
    assert dc.is_deferred(lowered._source_ep.graph_module)  # read, lowered, never run
    assert_bitwise(lowered(x), m(x))
    assert_bitwise(lowered._source_ep.module()(x), m(x))
    assert_bitwise(lowered.exported_program().module()(x), ep.run_decompositions().module()(x))


def test_lower_outside_api_returns_a_compiled_program():
    m, x, ep = _exported()
    low = lower(ep, plan_lowering("core"))
    assert not dc.is_deferred(low.exported_program().graph_module)
    assert_bitwise(low.exported_program().graph_module(*_flat_inputs(low.exported_program(), x))[0],
                   ep.run_decompositions().module()(x))


def _flat_inputs(ep, x):
    state = {**ep.state_dict, **ep.constants}
    return [state[s.target] if s.target is not None else x for s in ep.graph_signature.input_specs]


def test_another_thread_and_strict_export_are_untouched_while_a_lowering_defers():
    m, x, ep = _exported()
    entered, done = threading.Event(), threading.Event()
    seen = {}

    def lowering_thread():
        with dc.deferred():
            seen["inside"] = dc.is_deferred(ep.run_decompositions().graph_module)
            entered.set()
            done.wait(60)

    t = threading.Thread(target=lowering_thread)
    t.start()
    try:
        assert entered.wait(60)
        other = ep.run_decompositions()  # this thread, while the other is inside deferred()
        assert not dc.is_deferred(other.graph_module)
    finally:
        done.set()
        t.join(60)
    assert seen["inside"] is True
    strict = torch.export.export(m, (x,), strict=True)  # dynamo's export reads its graph module's specs
    assert not dc.is_deferred(strict.graph_module)
    assert_bitwise(strict.module()(x), m(x))


def test_graph_modules_traced_inside_deferred_generate_their_code_on_first_run():
    """make_fx's graph modules (the traces of a lowering: aot_export's result) are made lazy inside
    deferred() only, in this thread only; run, they compute what an eagerly made one does; torch's
    own switch that forbids lazy graph modules still holds."""
    from torch.fx._lazy_graph_module import _force_skip_lazy_graph_module
    from torch.fx.experimental.proxy_tensor import make_fx

    def f(a, b):
        return torch.nn.functional.gelu(a @ b).softmax(-1)

    a, b = torch.randn(3, 4), torch.randn(4, 5)
    with dc.deferred():
        inside = make_fx(f)(a, b)
        with _force_skip_lazy_graph_module():
            forced = make_fx(f)(a, b)
        seen = {}
        t = threading.Thread(target=lambda: seen.setdefault("gm", make_fx(f)(a, b)))
        t.start()
        t.join(60)
    outside = make_fx(f)(a, b)
    assert dc.is_deferred(inside)
    assert not dc.is_deferred(outside) and not dc.is_deferred(forced) and not dc.is_deferred(seen["gm"])
    assert_bitwise(inside(a, b), outside(a, b))
    assert inside.code == outside.code
