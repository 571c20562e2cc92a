"""The node-local lowering traces its calls without functionalization where that gives what the
functionalizing trace gives (functionalize.trace_plain): on every trace the lowering of real programs
makes, static or of symbolic sizes, the graph, its values and the metadata carried over are those of
functionalize_graph; where the trace writes in place or reads a size from data, trace_plain declines
(None) and functionalization does the work."""

from __future__ import annotations

import operator

import pytest
import torch
from torch import nn

from exporter import functionalize
from exporter.lowering import tables
from exporter.lowering.decompose import trace_table
from exporter.lowering.engines import local

from .test_lowering_local import Attention


@pytest.fixture(autouse=True)
def always_local(monkeypatch):
    monkeypatch.setattr(local, "_pays_off", lambda *counts: True)


class ConvNet(nn.Module):
    """What convolutional classifiers call: conv2d (with padding="same" too), batch norm, SiLU, an idle
    dropout, adaptive pooling, a cast to the dtype a tensor has already, a linear head."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.same = nn.Conv2d(8, 8, 3, padding="same", groups=8)
        self.bn = nn.BatchNorm2d(8)
        self.drop = nn.Dropout(0.2)
        self.head = nn.Linear(8, 4)

    def forward(self, x):
        y = self.drop(nn.functional.silu(self.bn(self.same(self.conv(x)))))
        y = nn.functional.adaptive_avg_pool2d(y, 1).flatten(1)
        return self.head(y.to(torch.float32))


def _dynamic(build):
    """``build``'s model and inputs, exported with a dynamic length (dim 1 of each input)."""
    def export():
        model, args = build()
        length = torch.export.Dim("length", min=2, max=32)
        return model, args, tuple({1: length} for _ in args)

    return export


def _bert():
    from transformers import BertConfig, BertModel

    torch.manual_seed(0)
    cfg = BertConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
                     vocab_size=100, max_position_embeddings=32)
    return BertModel(cfg).eval(), (torch.randint(0, 100, (1, 8)),)


def _traces(ep) -> list:
    """The (graph module, placeholders) of each trace the node-local lowering of ``ep`` makes."""
    seen = []

    def recording(gm, placeholders, table):
        seen.append((gm, placeholders, table))
        return None  # (functionalize_graph lowers)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(local, "trace_plain", recording)
        assert local.lower_locally(ep, trace_table(tables.torch_default_table())) is not None
    return seen


def _value(v):
    if isinstance(v, torch.Tensor):
        return (tuple(v.shape), v.stride(), v.storage_offset(), v.dtype)
    if isinstance(v, (list, tuple)):
        return tuple(_value(x) for x in v)
    return repr(v)


def _nodes(graph: torch.fx.Graph) -> list:
    # the metadata of the calls, which the lowering copies (original_aten differs, and is read by
    # nothing: the op the proxy mode saw first, reshape where functionalization decomposed it to view
    # first; the output node's is not copied: aot_export's may hold what an earlier trace left behind).
    # A node is named by its place: on symbolic sizes the functionalizing trace numbers the arithmetic
    # of sizes after more of it that it then drops (mul_6 for mul). A sym_size node's metadata is not
    # compared: the plain trace makes it where a size is first read, without a call's metadata.
    place = {n: f"%{i}" for i, n in enumerate(graph.nodes)}
    keys = ("nn_module_stack", "stack_trace", "torch_fn", "from_node")

    def named(a):
        return str(torch.fx.node.map_arg(a, place.get))

    return [(n.op, str(n.target), named(n.args), named(n.kwargs), _value(n.meta.get("val")),
             tuple(str(n.meta.get(k)) for k in keys)
             if n.op == "call_function" and n.target is not torch.ops.aten.sym_size.int else ())
            for n in graph.nodes]


@pytest.mark.parametrize("build", [
    pytest.param(lambda: (ConvNet().eval(), (torch.randn(2, 3, 16, 16),)), id="convnet"),
    pytest.param(lambda: (Attention().eval(), (torch.randn(2, 5, 16),)), id="attention"),
    pytest.param(_bert, id="bert"),
    pytest.param(_dynamic(lambda: (Attention().eval(), (torch.randn(2, 5, 16),))), id="attention-dynamic"),
    pytest.param(_dynamic(_bert), id="bert-dynamic"),
])
def test_plain_traces_are_the_functionalizing_traces(build):
    model, args, *dynamic = build()
    ep = torch.export.export(model, args, dynamic_shapes=dynamic[0] if dynamic else None)
    traces = _traces(ep)
    assert traces
    for gm, placeholders, table in traces:
        plain = functionalize.trace_plain(gm, placeholders, table)
        assert plain is not None, gm.graph
        functional, _ = functionalize.functionalize_graph(gm, placeholders, table)
        plain_gm, sig = plain
        for g in (plain_gm.graph, functional.graph):
            g.eliminate_dead_code(is_impure_node=lambda n: n.is_impure(impure_random=False))
        assert _nodes(plain_gm.graph) == _nodes(functional.graph)
        assert len(sig.user_inputs) == len(placeholders) and not sig.user_inputs_to_mutate


def _program(fn, *args, dynamic_shapes=None):
    class M(nn.Module):
        def forward(self, *xs):
            return fn(*xs)

    ep = torch.export.export(M(), args, dynamic_shapes=dynamic_shapes)
    return ep.graph_module, [n for n in ep.graph.nodes if n.op == "placeholder"]


def _writing_relu(x):
    out = torch.empty_like(x)
    out.copy_(x.clamp_min(0))
    return out


def test_a_decomposition_writing_in_place_is_left_to_functionalization():
    gm, placeholders = _program(torch.relu, torch.randn(4))
    table = {torch.ops.aten.relu.default: _writing_relu}
    assert functionalize.trace_plain(gm, placeholders, table) is None
    functional, _ = functionalize.functionalize_graph(gm, placeholders, table)
    targets = {n.target for n in functional.graph.nodes if n.op == "call_function"}
    assert torch.ops.aten.copy_.default not in targets and torch.ops.aten.clamp_min.default in targets


def test_sizes_read_from_data_and_lists_out_are_left_to_functionalization():
    gm, placeholders = _program(torch.nonzero, torch.tensor([0.0, 1.0, 2.0]))
    assert functionalize.trace_plain(gm, placeholders, {}) is None
    gm, placeholders = _program(lambda x: x.sum().item(), torch.tensor([0.0, 1.0, 2.0]))
    assert functionalize.trace_plain(gm, placeholders, {}) is None
    # a call returning a list, as the lowering's trace returns it (the program unpacks it)
    gm, (x,) = _program(lambda x: torch.histogramdd(x, bins=[3, 3]), torch.randn(10, 2))
    hist = next(n for n in gm.graph.nodes if n.target is torch.ops.aten.histogramdd.default)
    mini = torch.fx.Graph()
    ph = mini.placeholder("in_0")
    ph.meta["val"] = x.meta["val"]
    call = mini.node_copy(hist, lambda _: ph)
    outs = []
    for i in range(2):
        outs.append(mini.call_function(operator.getitem, (call, i)))
        outs[-1].meta["val"] = hist.meta["val"][i]
    mini.output(tuple(outs))
    table = trace_table(tables.torch_default_table())
    assert functionalize.trace_plain(torch.fx.GraphModule(torch.nn.Module(), mini), [ph], table) is None


def test_symbolic_sizes_are_traced_plain_with_the_programs_symbols():
    batch = torch.export.Dim("batch", min=2)
    gm, placeholders = _program(lambda x: torch.relu(x).reshape(-1), torch.randn(3, 4), dynamic_shapes=(({0: batch},),))
    table = trace_table(tables.torch_default_table())
    plain, _ = functionalize.trace_plain(gm, placeholders, table)
    out = plain.graph.output_node().args[0][0].meta["val"]
    (symbol,) = placeholders[0].meta["val"].shape[0].node.expr.free_symbols
    assert str(out.shape[0]) == f"4*{symbol}"
    functional, _ = functionalize.functionalize_graph(gm, placeholders, table)
    assert _nodes(plain.graph) == _nodes(functional.graph)


def test_an_index_on_integer_indices_is_traced_plain_and_an_item_call_is_not():
    """index.Tensor may make its shape from data (a mask): what tells is its value's symbols, not the
    op's tag; on integer indices its sizes are the indices', and the trace is taken."""
    gm, placeholders = _program(lambda x, i: x[i], torch.randn(5, 3), torch.tensor([0, 2, 4]))
    assert functionalize.trace_plain(gm, placeholders, {}) is not None
    gm, placeholders = _program(lambda x, m: x[m], torch.randn(5, 3), torch.tensor([True, False] * 2 + [True]))
    assert functionalize.trace_plain(gm, placeholders, {}) is None
