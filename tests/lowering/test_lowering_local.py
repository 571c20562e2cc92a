"""The node-local lowering (exporter/lowering/engines/local.py) gives what the whole retrace gives: the same
ops as torch's run_decompositions, the same values bit for bit, each lowered node tagged with its
own call's module path; and it steps aside (returns None) where only functionalization of the whole
program is right."""

import copy

import pytest
import torch
from torch import nn

from exporter.lowering import tables
from exporter.lowering.decompose import trace_table
from exporter.lowering.engines import local, run_decompositions
from exporter.graph_walk import op_counts


@pytest.fixture(autouse=True)
def always_local(request, monkeypatch):
    """The small programs here would be retraced whole (local._pays_off): they test what the
    node-local lowering computes, so it is taken whatever it costs (but in the test of that rule)."""
    if "pays_off" not in request.node.name:
        monkeypatch.setattr(local, "_pays_off", lambda *counts: True)


def _both(ep, table=None):
    """(the node-local lowering, the whole retrace) of ``ep`` with torch's default table."""
    table = tables.torch_default_table() if table is None else table
    ours = local.lower_locally(ep, trace_table(table))
    assert ours is not None, "the node-local lowering declined"
    return ours, run_decompositions(ep, table, local=False)


def _outputs(ep, *args):
    return torch.utils._pytree.tree_leaves(ep.module()(*copy.deepcopy(args)))


def _assert_same(ours, whole, torchs, *args):
    assert op_counts(ours.graph_module) == op_counts(whole.graph_module) == op_counts(torchs.graph_module)
    for a, b in zip(_outputs(ours, *args), _outputs(whole, *args)):
        assert torch.equal(a, b)


class Attention(nn.Module):
    """Linear projections, fused attention (whose decomposition lays its result out otherwise than
    the kernel) and the view model code takes on the kernel's layout, a layer norm, a GELU."""

    def __init__(self, d=16, heads=2):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.norm = nn.LayerNorm(d)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        y = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        y = y.transpose(1, 2).reshape(b, t, d)
        return self.norm(x + nn.functional.gelu(self.proj(y)))


def test_attention_block_lowers_as_the_whole_retrace():
    x = torch.randn(2, 5, 16)
    model = Attention().eval()
    ep = torch.export.export(model, (x,))
    ours, whole = _both(ep)
    _assert_same(ours, whole, ep.run_decompositions(), x)
    torch.testing.assert_close(ours.module()(x), model(x), rtol=1e-5, atol=1e-5)


def test_calls_after_a_new_layout_are_traced_in_one_trace_with_the_same_result(monkeypatch):
    """The math decomposition of scaled_dot_product_attention lays its result out otherwise than the
    kernel, so the calls after it (transpose, reshape, the projection) are traced again: together, in
    one trace (_chain), with the same ops and values as traced one by one and as the whole retrace."""
    x = torch.randn(2, 5, 16)
    model = Attention().eval()
    ep = torch.export.export(model, (x,))
    table = trace_table(tables.torch_default_table())
    traces = []
    real = local._Lowering._trace_calls

    def counted(self, calls, **kw):
        traces.append(([c.target for c, _ in calls], kw.get("chained", False)))
        return real(self, calls, **kw)

    monkeypatch.setattr(local._Lowering, "_trace_calls", counted)
    chained = local.lower_locally(ep, table)
    chains = [targets for targets, is_chain in traces if is_chain]
    assert chains == [[torch.ops.aten.transpose.int, torch.ops.aten.reshape.default, torch.ops.aten.linear.default]]
    n_chained = len(traces)
    traces.clear()
    monkeypatch.setattr(local._Lowering, "CHAIN", 0)
    one_by_one = local.lower_locally(ep, table)
    assert n_chained < len(traces) and not any(is_chain for _, is_chain in traces)
    _assert_same(chained, one_by_one, run_decompositions(ep, tables.torch_default_table(), local=False), x)


def test_dynamic_batch_and_length():
    x = torch.randn(2, 5, 16)
    model = Attention().eval()
    dims = {0: torch.export.Dim("b", max=64), 1: torch.export.Dim("t", max=64)}
    ep = torch.export.export(model, (x,), dynamic_shapes=({**dims},))
    ours, whole = _both(ep)
    _assert_same(ours, whole, ep.run_decompositions(), x)
    for shape in [(3, 7, 16), (1, 2, 16)]:
        y = torch.randn(*shape)
        torch.testing.assert_close(ours.module()(y), model(y), rtol=1e-5, atol=1e-5)


class MergeHeads(nn.Module):
    """Attention's heads merged back as transformers writes it, a -1 for the head count."""

    def forward(self, q):
        y = nn.functional.scaled_dot_product_attention(q, q, q)
        return y.reshape(1, -1, q.shape[2], 8).transpose(1, 2).contiguous().reshape(1, q.shape[2], -1)


def test_both_engines_size_views_alike():
    """A view's -1 that stands for a constant size is written as that size by both engines (a trace
    keeps or resolves it depending on the layout it meets; OpenVINO failed on doge's -1 after a copy),
    the same values; a -1 that stands for a symbolic size stays."""
    q = torch.randn(1, 4, 6, 8)
    ep = torch.export.export(MergeHeads(), (q,), dynamic_shapes=({2: torch.export.Dim.DYNAMIC},))
    _both(ep)  # (the node-local lowering takes it)
    table = tables.torch_default_table()
    ours, whole = (run_decompositions(ep, table, local=flag) for flag in (True, False))

    def sizes(p):
        return [[s if type(s) is int else "sym" for s in n.args[1]] for n in p.graph.nodes
                if n.target is torch.ops.aten.view.default]

    assert sizes(ours) == sizes(whole)
    assert [1, 4, "sym", 8] in sizes(ours) and [1, "sym", 32] in sizes(ours)
    assert not any(-1 in s for s in sizes(ours))
    _assert_same(ours, whole, ep.run_decompositions(), q)

    class Flatten(nn.Module):
        def forward(self, x):
            return x.reshape(-1, 4)

    x = torch.randn(3, 4)
    ep = torch.export.export(Flatten(), (x,), dynamic_shapes=({0: torch.export.Dim.DYNAMIC},))
    for flag in (True, False):
        assert sizes(run_decompositions(ep, table, local=flag)) == [[-1, 4]]  # (-1 for the symbolic size)


class TwoLinears(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(8, 8), nn.Linear(8, 8)

    def forward(self, x):
        return self.b(torch.relu(self.a(x)))


def test_each_lowered_node_keeps_its_own_calls_module_path():
    """Equal calls are traced once and copied: the copy carries its own call's provenance (the
    repeated-layer reuse finds a layer's nodes by it)."""
    ep = torch.export.export(TwoLinears(), (torch.randn(4, 8),))
    ours, whole = _both(ep)

    def paths(prog):
        return sorted((str(n.target), list(n.meta["nn_module_stack"])[-1]) for n in prog.graph.nodes
                      if n.op == "call_function" and "nn_module_stack" in n.meta)

    assert paths(ours) == paths(whole)
    assert len({p for op, p in paths(ours) if op == "aten.addmm.default"}) == 2


class WritesIntoFresh(nn.Module):
    """In-place writes into values only they see (as in model code: ``x = a @ b; x.add_(1)``)."""

    def forward(self, x, mask):
        y = torch.mm(x, x.T)
        s = (x @ x.T).mul_(0.5)  # matmul's decomposition makes a new tensor
        y.add_(1.0)
        y.mul_(2.0)
        z = y.masked_fill_(mask, -1.0).softmax(-1)
        return z + y + s


def test_writes_into_fresh_values_are_functionalized_node_by_node():
    x, mask = torch.randn(4, 4), torch.rand(4, 4) > 0.5
    ep = torch.export.export(WritesIntoFresh(), (x, mask))
    assert any(n.target is torch.ops.aten.add_.Tensor for n in ep.graph.nodes)
    ours, whole = _both(ep)
    _assert_same(ours, whole, ep.run_decompositions(), x, mask)
    assert not any(n.op == "call_function" and n.target._schema.is_mutable for n in ours.graph.nodes
                   if isinstance(n.target, torch._ops.OpOverload))
    torch.testing.assert_close(ours.module()(x, mask), WritesIntoFresh()(x.clone(), mask), rtol=0, atol=0)


class Router(nn.Module):
    """A mixture of experts' router: the top-k weights normalized in place (mixtral, qwen-moe)."""

    def __init__(self, d=16, experts=6):
        super().__init__()
        self.gate = nn.Linear(d, experts)

    def forward(self, x):
        weights, chosen = torch.topk(self.gate(x).softmax(-1), 2, dim=-1)
        weights /= weights.sum(-1, keepdim=True)
        return weights.to(x.dtype), chosen


def test_a_write_into_an_output_of_a_call_returning_new_tensors_lowers_node_by_node():
    x = torch.randn(5, 16)
    ep = torch.export.export(Router().eval(), (x,))
    assert any(n.target is torch.ops.aten.div_.Tensor for n in ep.graph.nodes)
    ours, whole = _both(ep)
    _assert_same(ours, whole, ep.run_decompositions(), x)
    assert not any(isinstance(n.target, torch._ops.OpOverload) and n.target._schema.is_mutable
                   for n in ours.graph.nodes if n.op == "call_function")
    # where the table decomposes the call, its decomposition may return a view of its input (the
    # schema promises new tensors): the whole retrace decides
    table = tables.torch_default_table()
    aliasing = {**table, torch.ops.aten.topk.default:
                lambda t, k, dim=-1, largest=True, sorted=True: (t.narrow(dim, 0, k), t.narrow(dim, 0, k).argmax(dim, keepdim=True).expand(t.narrow(dim, 0, k).shape))}
    assert local.lower_locally(ep, trace_table(aliasing)) is None
    a = run_decompositions(ep, aliasing).module()(x)
    b = run_decompositions(ep, aliasing, local=False).module()(x)
    for u, v in zip(a, b):
        torch.testing.assert_close(u, v, rtol=0, atol=0)


class WritesIntoCopies(nn.Module):
    """Writes into what contiguous and reshape copy (their schemas promise a view; the layout makes
    them copy), and an in-place op whose functional form has another overload name
    (floor_divide_.Tensor -> floor_divide.default)."""

    def forward(self, x):
        y = x.transpose(0, 1).contiguous()
        y.add_(1.0)
        z = x.transpose(0, 1).reshape(-1)
        z.mul_(2.0)
        steps = torch.arange(8, dtype=torch.float32)
        steps.floor_divide_(3)
        return y * 2, z + steps.sum(), x


def test_writes_into_what_contiguous_and_reshape_copy_lower_node_by_node():
    x = torch.randn(4, 6)
    ep = torch.export.export(WritesIntoCopies(), (x,))
    ours, whole = _both(ep)
    torchs = ep.run_decompositions()
    # torch's ops; functionalization regenerates the view reshape's decomposition ends in after the
    # write (view(clone(x))) twice more, which the node-local lowering does not (same values)
    ops, theirs = op_counts(ours.graph_module), op_counts(torchs.graph_module)
    assert set(ops) == set(theirs) and {k: v for k, v in ops.items() if k != "aten::view.default"} == \
        {k: v for k, v in theirs.items() if k != "aten::view.default"}
    for a, b, c, d in zip(_outputs(ours, x), _outputs(whole, x), _outputs(torchs, x), WritesIntoCopies()(x.clone())):
        assert torch.equal(a, b) and torch.equal(a, c) and torch.equal(a, d)


class WritesIntoAReshapeThatViews(nn.Module):
    def forward(self, x):
        z = x.transpose(0, 1).reshape(6, 2, 2)  # splits a dimension: a view of x, written through
        z.mul_(2.0)
        return x + 1


def test_a_write_into_a_reshape_that_views_takes_the_whole_retrace():
    x = torch.randn(4, 6)
    ep = torch.export.export(WritesIntoAReshapeThatViews(), (x.clone(),))
    assert local.lower_locally(ep, trace_table(tables.torch_default_table())) is None
    low = run_decompositions(ep, tables.torch_default_table())
    torch.testing.assert_close(low.module()(x.clone()), WritesIntoAReshapeThatViews()(x.clone()), rtol=0, atol=0)


class StaticCache(nn.Module):
    """A decoder's static key/value cache (transformers' StaticCache, exported strict): buffers
    written in place each call (index_copy_ at the cache positions, copy_ of a length), one written
    through a ``to`` that changes nothing (and so returns the buffer itself), read after the writes."""

    def __init__(self, d=8, slots=6):
        super().__init__()
        self.proj = nn.Linear(d, 2 * d)
        self.register_buffer("keys", torch.zeros(1, slots, d))
        self.register_buffer("values", torch.zeros(1, slots, d))
        self.register_buffer("length", torch.zeros((), dtype=torch.int64))

    def forward(self, x, positions):
        k, v = self.proj(x).chunk(2, dim=-1)
        self.keys.index_copy_(1, positions, k)
        self.values.index_copy_(1, positions, v)
        self.length.copy_(positions[-1])
        n = self.length.to(torch.int64)  # the buffer itself
        n.add_(1)
        scores = (x @ self.keys.transpose(1, 2)).softmax(-1)
        return scores @ self.values, n * 2


def test_writes_into_buffers_and_inputs_lower_node_by_node_and_are_returned_as_torch_returns_them(tmp_path):
    """A write into a buffer or an input becomes the functional op, and the final value an output
    before the program's own (BUFFER_MUTATION, USER_INPUT_MUTATION), as torch's functionalization
    returns it: the same ops and output specs as torch's run_decompositions, the same values and the
    same buffers after the call, also read back from a file."""
    from exporter import export_model, load

    x, positions = torch.randn(1, 3, 8), torch.tensor([1, 2, 3])
    ep = torch.export.export(StaticCache().eval(), (x, positions), strict=True)
    assert any(n.target is torch.ops.aten.index_copy_.default for n in ep.graph.nodes)

    def specs(p):
        return [(s.kind.name, s.target) for s in p.graph_signature.output_specs]

    def called(p):
        m = p.module()
        out = m(x, positions)
        return out, dict(m.named_buffers())

    for source in [ep, None]:
        if source is None:  # read back from a file: a storage per value, the same lowering
            export_model(ep, path=tmp_path / "cache.pt2b")
            source = load(tmp_path / "cache.pt2b").exported_program()
        ours, whole = _both(source)
        torchs = source.run_decompositions()
        assert specs(ours) == specs(whole) == specs(torchs)
        assert [k for k, _ in specs(ours)][:4] == ["BUFFER_MUTATION"] * 3 + ["USER_OUTPUT"]
        _assert_same(ours, whole, torchs, x, positions)
        eager = StaticCache().eval()
        eager.load_state_dict(ep.state_dict)
        (out, n), buffers = called(ours)
        (ref, ref_n) = eager(x, positions)
        torch.testing.assert_close(out, ref, rtol=1e-6, atol=1e-6)
        assert torch.equal(n, ref_n)
        for name, value in eager.named_buffers():
            torch.testing.assert_close(buffers[name], value, rtol=0, atol=0)
        assert int(buffers["length"]) == 4  # written twice: the copy, then the add through the to


class WritesIntoInputs(nn.Module):
    def forward(self, x, y):
        x.add_(1.0)
        y[:, 0] = 5.0
        return x * 2 + y.sum()


def test_writes_into_inputs_are_returned_as_user_input_mutations():
    x, y = torch.randn(3, 4), torch.randn(3, 4)
    ep = torch.export.export(WritesIntoInputs(), (x.clone(), y.clone()))
    ours, whole = _both(ep)
    torchs = ep.run_decompositions()
    assert [(s.kind.name, s.target) for s in ours.graph_signature.output_specs] == \
        [(s.kind.name, s.target) for s in torchs.graph_signature.output_specs] == \
        [("USER_INPUT_MUTATION", "x"), ("USER_INPUT_MUTATION", "y"), ("USER_OUTPUT", None)]
    _assert_same(ours, whole, torchs, x, y)
    a, b, ea, eb = x.clone(), y.clone(), x.clone(), y.clone()
    out = ours.module()(a, b)
    assert torch.equal(out, WritesIntoInputs()(ea, eb))
    assert torch.equal(a, ea) and torch.equal(b, eb)  # the inputs written as eager writes them


class WritesIntoBufferViewedBefore(nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("count", torch.zeros(4))

    def forward(self, x):
        head = self.count[:2]  # a view of the buffer, read after the write
        self.count.add_(1.0)
        return x + head.sum()


class WritesIntoView(nn.Module):
    def forward(self, x):
        y = x * 2
        v = y[:, :2]
        v.mul_(0.5)  # writes y through a view, which is read again after the write
        return y + v.sum()


class WritesThroughFreshViews(nn.Module):
    """A tensor filled through views made for each write alone (glm4_moe_lite's and deepseek's
    rotary halves: ``q = x.new_empty(...); q[..., :8] = a; q[..., 8:] = b``): each write becomes the
    view of the value as written so far, written, and scattered back (slice_scatter,
    select_scatter), as functionalization makes it."""

    def forward(self, a, b):
        q = a.new_empty(a.shape[0], a.shape[1], 12)
        q[..., :8] = a
        q[..., 8:] = b.expand(a.shape[0], a.shape[1], 4)
        q[:, 0] = 0.5
        return nn.functional.layer_norm(q, (12,)) * 2


def test_writes_through_views_made_for_them_lower_node_by_node(tmp_path):
    from exporter import export_model, load

    a, b = torch.randn(2, 5, 8), torch.randn(1, 1, 4)
    ep = torch.export.export(WritesThroughFreshViews(), (a, b), dynamic_shapes=({1: torch.export.Dim("t", max=64)}, None))
    ours, whole = _both(ep)
    _assert_same(ours, whole, ep.run_decompositions(), a, b)
    torch.testing.assert_close(ours.module()(a, b), WritesThroughFreshViews()(a, b), rtol=1e-6, atol=1e-6)
    path = tmp_path / "views.pt2b"  # read back from a file: a storage per value, the same lowering
    export_model(ep, path=path)
    ours, whole = _both(load(path).exported_program())
    a = torch.randn(2, 9, 8)
    _assert_same(ours, whole, ep.run_decompositions(), a, b)
    torch.testing.assert_close(ours.module()(a, b), WritesThroughFreshViews()(a, b), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("model", [WritesIntoBufferViewedBefore, WritesIntoView])
def test_a_slice_of_a_written_value_read_after_the_write_is_remade_from_the_value_as_written(model):
    x = torch.randn(3, 4)
    ep = torch.export.export(model(), (x.clone(),))
    ours, whole = _both(ep)
    torchs = ep.run_decompositions()
    assert op_counts(ours.graph_module) == op_counts(whole.graph_module) == op_counts(torchs.graph_module)
    for program in (ours, whole):  # (each run on its own copy of the buffers it writes)
        torch.testing.assert_close(_outputs(copy.deepcopy(program), x), _outputs(copy.deepcopy(torchs), x),
                                   rtol=0, atol=0)
    eager = model()
    module = copy.deepcopy(ours).module()
    for _ in range(2):  # a buffer written once, then again, as eager writes it
        torch.testing.assert_close(module(x.clone()), eager(x.clone()), rtol=0, atol=0)


class FilledThroughSelectsOfSlices(nn.Module):
    """Multimodal rotary frequencies (qwen-vl's mrope, cohere): rows of one tensor written into
    interleaved slices of another row, each write through a select then a slice of a fresh value,
    the rows read between the writes and the written row after them."""

    def forward(self, x):
        f = x * 2.0
        row = f[0]
        row[..., 1:6:3] = f[1][..., 1:6:3]
        row[..., 2:6:3] = f[2][..., 2:6:3]
        return torch.cat([row, row], -1), f[2].sum()


def test_writes_through_selects_of_slices_are_scattered_back_level_by_level(tmp_path):
    from exporter import export_model, load

    x = torch.randn(3, 2, 4, 6)
    ep = torch.export.export(FilledThroughSelectsOfSlices(), (x,))
    ours, whole = _both(ep)
    torchs = ep.run_decompositions()
    # the values bit for bit; torch's ops, of which functionalization regenerates more views
    assert set(op_counts(ours.graph_module)) == set(op_counts(torchs.graph_module))
    for a, b, c in zip(_outputs(ours, x), _outputs(whole, x), _outputs(torchs, x)):
        assert torch.equal(a, b) and torch.equal(a, c)
    for a, b in zip(_outputs(ours, x), FilledThroughSelectsOfSlices()(x)):
        assert torch.equal(a, b)
    path = tmp_path / "rows.pt2b"  # read back from a file: a storage per value, the same values
    export_model(ep, path=path)
    back, _ = _both(load(path).exported_program())
    for a, b in zip(_outputs(back, x), FilledThroughSelectsOfSlices()(x)):
        assert torch.equal(a, b)


class FilledUpToASymbolicBound(nn.Module):
    """superpoint's keypoint scores: rows of a fresh value filled up to a length read from another
    input's size (a slice whose bound is a node of the program, not a number)."""

    def forward(self, x, k):
        f = x * 2.0
        f[0][: k.shape[0]] = 1.0
        f[1][1 : k.shape[0]] = f[2][1 : k.shape[0]]
        return f, f[0].sum()


def test_a_write_through_a_slice_with_a_symbolic_bound_lowers_node_by_node():
    x, k = torch.randn(3, 8), torch.randn(5)
    dims = ({1: torch.export.Dim("n", min=4, max=64)}, {0: torch.export.Dim("m", min=3, max=16)})
    ep = torch.export.export(FilledUpToASymbolicBound(), (x, k), dynamic_shapes=dims)
    ours, whole = _both(ep)
    torchs = ep.run_decompositions()
    assert set(op_counts(ours.graph_module)) == set(op_counts(torchs.graph_module))
    for xs, ks in [((3, 8), (5,)), ((3, 13), (7,)), ((3, 4), (3,))]:
        x, k = torch.randn(*xs), torch.randn(*ks)
        want = torch.utils._pytree.tree_leaves(FilledUpToASymbolicBound()(x.clone(), k))
        for a, b, c, d in zip(_outputs(ours, x, k), _outputs(whole, x, k), _outputs(torchs, x, k), want):
            assert torch.equal(a, b) and torch.equal(a, c) and torch.equal(a, d)


class WritesThroughPermute(nn.Module):
    def forward(self, x):
        y = x @ x.T
        y.permute(1, 0).add_(1.0)  # a write through a view that has no scatter: functionalization's
        return y * 2


def test_writes_that_only_functionalization_handles_take_the_whole_retrace():
    x = torch.randn(3, 4)
    ep = torch.export.export(WritesThroughPermute(), (x.clone(),))
    assert local.lower_locally(ep, trace_table(tables.torch_default_table())) is None
    low = run_decompositions(ep, tables.torch_default_table())
    assert op_counts(low.graph_module) == op_counts(ep.run_decompositions().graph_module)
    torch.testing.assert_close(low.module()(x.clone()), WritesThroughPermute()(x.clone()), rtol=0, atol=0)


def test_a_program_with_a_higher_order_op_takes_the_whole_retrace():
    class Cond(nn.Module):
        def forward(self, x):
            return torch.cond(x.sum() > 0, lambda t: t.sin(), lambda t: t.cos(), (x,))

    ep = torch.export.export(Cond(), (torch.randn(3),))
    assert local.lower_locally(ep, trace_table(tables.torch_default_table())) is None


def test_only_decomposed_calls_are_traced():
    """A call the table leaves, on inputs laid out as recorded, is copied, not traced: a program
    of kept ops alone needs no trace at all."""
    class Kept(nn.Module):
        def forward(self, x):
            return (x.sin() + x.cos()).relu() * 3

    ep = torch.export.export(Kept(), (torch.randn(4),))
    low = local._Lowering(ep, trace_table(tables.torch_default_table()), ep.graph)
    low.prefetch()
    low.run()
    assert low.traced == 0
    ours, whole = _both(ep)
    _assert_same(ours, whole, ep.run_decompositions(), torch.randn(4))


class ConvStack(nn.Module):
    """Every call decomposed (conv, batch norm), the layers equal: two distinct calls to trace."""

    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(*[m for _ in range(4) for m in (nn.Conv2d(4, 4, 3, padding=1), nn.BatchNorm2d(4))])

    def forward(self, x):
        return self.body(x)


class ManyKeptCalls(nn.Module):
    """Few decomposed calls (two linears) among many the table keeps."""

    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(8, 8), nn.Linear(8, 8)

    def forward(self, x):
        for _ in range(6):
            x = (x.sin() * 2 + x.cos()).relu() - x.abs()
        return self.b(self.a(x).tanh())


class DistinctConvs(nn.Module):
    """Every call decomposed and each one distinct (widths 4, 5, 6, 7, 8): tracing them alone costs
    what a retrace does."""

    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(*[m for c in range(4, 8) for m in (nn.Conv2d(c, c + 1, 3, padding=1),
                                                                     nn.BatchNorm2d(c + 1))])

    def forward(self, x):
        return self.body(x)


def test_the_node_local_lowering_is_taken_where_it_pays_off():
    table = trace_table(tables.torch_default_table())
    distinct = torch.export.export(DistinctConvs().eval(), (torch.randn(1, 4, 8, 8),))
    assert local.lower_locally(distinct, table) is None
    x = torch.randn(1, 4, 8, 8)
    conv = torch.export.export(ConvStack().eval(), (x,))
    ours = local.lower_locally(conv, table)
    assert ours is not None
    whole = run_decompositions(conv, tables.torch_default_table(), local=False)
    _assert_same(ours, whole, conv.run_decompositions(), x)
    kept = torch.export.export(ManyKeptCalls(), (torch.randn(2, 8),))
    ours = local.lower_locally(kept, table)
    assert ours is not None
    whole = run_decompositions(kept, tables.torch_default_table(), local=False)
    _assert_same(ours, whole, kept.run_decompositions(), torch.randn(2, 8))


class WritesIntoTypeAs(nn.Module):
    """type_as returns its input itself when the dtype is already right: the write into its result
    writes ``h`` too (the recorded values share a storage)."""

    def forward(self, x):
        h = x * 1.5
        y = h.type_as(x)
        y.mul_(2.0)
        return h + y


class WritesIntoClone(nn.Module):
    def forward(self, x):
        h = x * 1.5
        y = h.clone()
        y.mul_(2.0)
        return h + y


def test_a_write_into_an_alias_takes_the_whole_retrace():
    x = torch.randn(3, 4)
    table = tables.torch_default_table()
    ep = torch.export.export(WritesIntoTypeAs(), (x,))
    assert local.lower_locally(ep, trace_table(table)) is None
    torch.testing.assert_close(run_decompositions(ep, table).module()(x), 6 * x, rtol=1e-6, atol=1e-6)
    # a decomposition returning its input where the schema promises a new tensor (the recorded values
    # cannot show it): clone -> identity makes ``y`` alias ``h``; the node-local lowering, which would
    # take ``y`` for a new tensor, steps aside (_Lowering.check_fresh) and the retrace decides
    aliasing = {**table, torch.ops.aten.clone.default: lambda t, memory_format=None: t}
    ep = torch.export.export(WritesIntoClone(), (x,))
    assert local.lower_locally(ep, trace_table(aliasing)) is None
    torch.testing.assert_close(run_decompositions(ep, aliasing).module()(x),
                               run_decompositions(ep, aliasing, local=False).module()(x), rtol=0, atol=0)


class WritesIntoEvalDropout(nn.Module):
    """An eval dropout returns its input itself, though its schema promises a new tensor and the
    recorded values show none: the write into its result writes ``h`` too, in eager."""

    def forward(self, x):
        h = x * 1.5
        y = nn.functional.dropout(h, p=0.1, training=False)
        y.mul_(2.0)
        return h + y


def test_a_write_into_an_eval_dropout_lowers_as_torchs_and_validation_refuses_it(tmp_path):
    """torch's run_decompositions (2.13 and before) computes 4.5x where eager computes 6x (dropout
    stays, and functionalization takes its result for a new tensor); pt2b's lowering computes what
    torch's does, and load_for_backend's validation refuses it. Where torch lowers it right (2.14 on),
    so does pt2b, and the lowering validates."""
    from exporter import export_model, load_for_backend
    from exporter.errors import OpsetError

    x = torch.randn(3, 4)
    ep = torch.export.export(WritesIntoEvalDropout(), (x,))
    torchs = ep.run_decompositions().module()(x)
    torch.testing.assert_close(run_decompositions(ep, tables.torch_default_table()).module()(x), torchs, rtol=0, atol=0)
    torch.testing.assert_close(WritesIntoEvalDropout()(x), 6 * x, rtol=1e-6, atol=1e-6)
    path = tmp_path / "dropout.pt2b"
    export_model(WritesIntoEvalDropout(), (x,), path)
    if torch.allclose(torchs, 6 * x):  # torch 2.14 and later lower it right: so does pt2b, and it validates
        lowered = load_for_backend(path, "core", cache=False)
        assert lowered.validation.status == "passed"
        torch.testing.assert_close(lowered.exported_program().module()(x), 6 * x, rtol=1e-6, atol=1e-6)
        return
    with pytest.raises(OpsetError, match="does not compute what the program does"):
        load_for_backend(path, "core", cache=False)


def test_a_program_read_back_from_a_file_is_lowered_by_its_schemas_not_its_storages(tmp_path):
    """A program read back from a file has a storage per recorded value, so aliasing (a write through
    a view into a value) is told by the ops' schemas: the write through a slice is scattered back
    and the slice read after it remade; the write through a permute takes the whole retrace; both
    lowered programs compute what eager does."""
    from exporter import export_model, load

    x = torch.randn(3, 4)
    path = tmp_path / "view.pt2b"
    table = tables.torch_default_table()
    export_model(WritesIntoView(), (x,), path)
    ours, _ = _both(load(path).exported_program())
    torch.testing.assert_close(ours.module()(x), WritesIntoView()(x), rtol=0, atol=0)
    export_model(WritesThroughPermute(), (x,), path)
    ep = load(path).exported_program()
    assert local.lower_locally(ep, trace_table(table)) is None
    torch.testing.assert_close(run_decompositions(ep, table).module()(x), WritesThroughPermute()(x), rtol=0, atol=0)
    export_model(WritesIntoFresh(), (torch.randn(4, 4), torch.rand(4, 4) > 0.5), path)
    ep = load(path).exported_program()
    ours, whole = _both(ep)
    args = (torch.randn(4, 4), torch.rand(4, 4) > 0.5)
    _assert_same(ours, whole, ep.run_decompositions(), *args)
    torch.testing.assert_close(ours.module()(*args), WritesIntoFresh()(*copy.deepcopy(args)), rtol=0, atol=0)


class SlicesOfAView(nn.Module):
    """Rotary halves of a head taken from a fused projection (falcon): a ``slice`` of a value that sits
    at a storage offset inside a larger one."""

    def __init__(self):
        super().__init__()
        self.qkv = nn.Linear(8, 24)

    def forward(self, x):
        q, k, v = self.qkv(x).view(2, 5, 3, 8).unbind(2)
        k1, k2 = k[..., :4], k[..., 4:]
        return torch.cat([-k2, k1], -1) * q + v


def test_a_decomposition_placing_its_result_at_a_storage_offset_takes_the_whole_retrace(tmp_path):
    """slice's decomposition (max preset) is an as_strided at the storage offset of the value it traced
    on; a program read back from a file records offset 0 for every value, so a slice of ``k`` (offset 8
    in the projection's output at run time) traced node by node would read ``q``'s numbers. The
    node-local lowering steps aside there and the whole retrace computes the offsets."""
    from torch._decomp import decomposition_table

    from exporter import export_model, load

    x = torch.randn(2, 5, 8)
    model = SlicesOfAView().eval()
    export_model(torch.export.export(model, (x,)), path=tmp_path / "slices.pt2b")
    read = load(tmp_path / "slices.pt2b").exported_program()
    k = next(n for n in read.graph.nodes if n.target is torch.ops.aten.slice.Tensor).args[0]
    assert k.meta["val"].storage_offset() == 0  # (8 at run time)
    table = {**tables.torch_default_table(), torch.ops.aten.slice.Tensor: decomposition_table[torch.ops.aten.slice.Tensor]}
    assert local.lower_locally(read, trace_table(table)) is None
    lowered = run_decompositions(read, table)
    assert any(n.target is torch.ops.aten.as_strided.default for n in lowered.graph.nodes)
    torch.testing.assert_close(lowered.module()(x), model(x), rtol=1e-6, atol=1e-6)


class ChannelsLastPool(nn.Module):
    """A vision pooler (swin, focalnet): adaptive_avg_pool2d on a permuted (channels-last) value, whose
    decomposition ends in an as_strided relative to its own fresh result."""

    def forward(self, x):
        return nn.functional.adaptive_avg_pool2d(x.permute(0, 3, 1, 2), 1).flatten(1) * 2


def test_an_as_strided_on_a_value_the_decomposition_made_lowers_node_by_node(tmp_path):
    from exporter import export_model, load

    x = torch.randn(2, 7, 7, 96)
    export_model(torch.export.export(ChannelsLastPool(), (x,)), path=tmp_path / "pool.pt2b")
    read = load(tmp_path / "pool.pt2b").exported_program()
    ours, whole = _both(read)
    assert any(n.target is torch.ops.aten.as_strided.default for n in ours.graph.nodes)
    _assert_same(ours, whole, read.run_decompositions(), x)
    torch.testing.assert_close(ours.module()(x), ChannelsLastPool()(x), rtol=1e-6, atol=1e-6)


class GradRegions(nn.Module):
    """Model code that switches grad mode around decomposed calls (torch.no_grad() blocks, as in
    recurrent reasoning models). export makes each a region (wrap_with_set_grad_enabled); the lowering
    writes it out as mode switches around the body's calls, which lower as any others."""

    def __init__(self, d=16):
        super().__init__()
        self.lin = nn.Linear(d, d)
        self.norm = nn.LayerNorm(d)

    def forward(self, x):
        y = self.lin(x)
        with torch.no_grad():
            z = self.norm(y) * 2
        return nn.functional.gelu(self.lin(z)) + y


def test_grad_mode_regions_are_written_out_as_the_whole_retrace_writes_them():
    x = torch.randn(2, 5, 16)
    model = GradRegions().eval()
    ep = torch.export.export(model, (x,))
    assert [n.args[0] for n in ep.graph.nodes if n.target is torch.ops.higher_order.wrap_with_set_grad_enabled] == [False]
    ours, whole = _both(ep)
    with torch.enable_grad():  # (a lowered GraphModule leaves grad mode as its last switch set it, as torch's does)
        _assert_same(ours, whole, ep.run_decompositions(), x)
    switches = [[n.args for n in p.graph.nodes if n.target is torch._C._set_grad_enabled] for p in (ours, whole)]
    assert switches[0] == switches[1] == [(False,), (False,)]
    layer_norm = next(n for n in ours.graph.nodes if n.target is torch.ops.aten.native_layer_norm.default)
    assert [n.target for n in (layer_norm.prev, layer_norm.next.next.next)] == [torch._C._set_grad_enabled] * 2
    with torch.enable_grad():
        torch.testing.assert_close(ours.module()(x), model(x), rtol=1e-5, atol=1e-5)


class ReadsData(nn.Module):
    """Sizes and checks read from data, as transformers' multimodal models write them: a size from
    `item()`, and `torch_compilable_check` on a mask (`_is_all_true(...).item()`, which export records
    as True). The table decomposes `item` (to `_local_scalar_dense`); its trace binds a new unbacked
    symbol, which the lowered program's range constraints must hold for the reader to rebuild it."""

    def forward(self, x, n, ids):
        k = n.item()
        torch._check(k >= 1)
        torch._check(k <= x.shape[0])
        mask = ids == 5
        torch._check_tensor_all(x[mask].numel() == mask.sum() * x.shape[-1])
        return nn.functional.layer_norm(x[:k], (x.shape[-1],)) * 2


def test_sizes_read_from_data_lower_node_by_node_and_are_written_and_read_back(tmp_path):
    from exporter import export_model, load

    x, ids = torch.randn(6, 8), torch.tensor([5, 1, 5, 1, 1, 5])
    ep = torch.export.export(ReadsData(), (x, torch.tensor(4), ids))
    assert any("unbacked_bindings" in node.meta for node in ep.graph.nodes)
    ours, whole = _both(ep)
    # the same ops, but runtime assertions: the whole retrace repeats one (docs/lowering.md)
    counts = [{op: k for op, k in op_counts(p.graph_module).items() if op != "aten::_assert_scalar.default"}
              for p in (ours, whole, ep.run_decompositions())]
    assert counts[0] == counts[1] == counts[2]
    for a, b in zip(_outputs(ours, x, torch.tensor(4), ids), _outputs(whole, x, torch.tensor(4), ids)):
        assert torch.equal(a, b)
    path = tmp_path / "sizes.pt2b"
    export_model(ours, path=path)  # (the reader refuses a symbol without a range)
    for k in (1, 4, 6):
        want = ReadsData()(x, torch.tensor(k), ids)
        torch.testing.assert_close(load(path)(x, torch.tensor(k), ids), want, rtol=0, atol=0)


def test_the_none_preset_functionalizes_writes_into_fresh_values_node_by_node(monkeypatch):
    """`none` applies no table, only functionalization (and the decompositions every retrace
    applies): writes into fresh values become functional ops without a retrace of the program, with
    the ops and values of the whole retrace."""
    from exporter.lowering.engines.whole_program import retrace
    from exporter.lowering.lower import lower
    from exporter.lowering.plan import plan_lowering

    x, mask = torch.randn(4, 4), torch.rand(4, 4) > 0.5
    ep = torch.export.export(WritesIntoFresh(), (x, mask))
    calls = []
    real = local.lower_locally
    monkeypatch.setattr(local, "lower_locally", lambda *a: calls.append(real(*a)) or calls[-1])
    ours = lower(ep, plan_lowering("none")).exported_program()
    assert len(calls) == 1 and calls[0] is ours
    whole = retrace(ep)
    _assert_same(ours, whole, ep.run_decompositions({}), x, mask)
    assert not any(n.target.__name__.endswith("_") for n in ours.graph.nodes
                   if isinstance(n.target, torch._ops.OpOverload))
    torch.testing.assert_close(ours.module()(x, mask), WritesIntoFresh()(x, mask), rtol=0, atol=0)


class PromotingWrite(nn.Module):
    """An in-place op whose functional form promotes to another dtype (float32 += float64): the write
    casts back to the written tensor's dtype, as functionalization's copy_ does."""

    def forward(self, a, b):
        a = a * 1
        a += b  # add computes float64; a stays float32
        return a


class PromotingWriteThroughSlice(nn.Module):
    def forward(self, a, b):
        a = a * 1
        c = a[1:]
        c += b[1:]  # the same, then scattered back into a
        return a


@pytest.mark.parametrize("model", [PromotingWrite, PromotingWriteThroughSlice])
def test_in_place_ops_that_promote_are_cast_back_without_validation(model, tmp_path):
    """Node-local lowering alone (no validation looks at it) gives torch's ops, dtype and values."""
    from exporter import export_model, load_for_backend

    args = (torch.randn(5), torch.randn(5, dtype=torch.float64))
    ep = torch.export.export(model(), args)
    ours, whole = _both(ep)
    _assert_same(ours, whole, ep.run_decompositions(), *args)
    (out,), eager = _outputs(ours, *args), model()(*copy.deepcopy(args))
    assert out.dtype == eager.dtype == torch.float32 and torch.equal(out, eager)
    assert op_counts(ours.graph_module)["aten::_to_copy.default"] == 1
    export_model(model(), args, tmp_path / "m.pt2b")  # the user's path, validation off
    lowered = load_for_backend(tmp_path / "m.pt2b", cache=False, validate=False)
    assert lowered(*args).dtype == torch.float32 and torch.equal(lowered(*args), eager)


class UpsampleDisagreeingScales(nn.Module):
    def forward(self, x):
        return torch.ops.aten.upsample_nearest2d.default(x, [6, 10], 2.3, 4.7)


@pytest.mark.parametrize("preset", ["core", "max"])
def test_ops_torchs_retrace_keeps_are_kept(tmp_path, preset):
    """Issue 37, case 4: torch's run_decompositions keeps upsample_nearest2d.default (its only
    CompositeImplicitAutograd kernel is a Python one), whose decomposition indexes past its source when
    output_size and scales disagree; pt2b's lowering keeps it too, node by node and whole, and runs it."""
    from exporter import export_model, load_for_backend
    from exporter.lowering.decompose import kept_by_torchs_retrace
    from runtime_ref import Runtime

    x = torch.randn(1, 2, 3, 4)
    ep = torch.export.export(UpsampleDisagreeingScales(), (x,))
    ours, whole = _both(ep)
    _assert_same(ours, whole, ep.run_decompositions(), x)
    assert op_counts(ours.graph_module) == {"aten::upsample_nearest2d.default": 1}
    export_model(UpsampleDisagreeingScales(), (x,), tmp_path / "m.pt2b")
    lowered = load_for_backend(tmp_path / "m.pt2b", preset, cache=False)
    assert lowered.ops() == {"aten::upsample_nearest2d.default": 1}
    assert torch.equal(Runtime(lowered)(x), UpsampleDisagreeingScales()(x))


def test_torchs_retrace_keeps_each_op_pt2b_keeps_for_it():
    """The list pt2b keeps (decompose.KEPT_BY_TORCHS_RETRACE) is measured: torch's run_decompositions
    leaves each op in the graph, with its own table and with every registered decomposition."""
    from exporter.lowering.decompose import KEPT_BY_TORCHS_RETRACE, kept_by_torchs_retrace

    a = torch.ops.aten
    inputs = {1: torch.randn(1, 2, 4), 2: torch.randn(1, 2, 3, 4), 3: torch.randn(1, 2, 2, 3, 4)}
    sizes = {1: [8], 2: [6, 10], 3: [4, 6, 8]}
    for name in KEPT_BY_TORCHS_RETRACE:
        op = getattr(a, name).default
        assert kept_by_torchs_retrace(op) and not kept_by_torchs_retrace(getattr(a, name).vec)
        dims = int(name[-2])

        class M(nn.Module):
            def forward(self, x, op=op, dims=dims):
                return op(x, sizes[dims])

        ep = torch.export.export(M(), (inputs[dims],))
        for table in (tables.torch_default_table(), tables.available_decompositions()):
            kept = [n.target for n in ep.run_decompositions(dict(table)).graph.nodes if n.op == "call_function"]
            assert kept == [op], (name, kept)


class HeadWithDropoutInPlace(nn.Module):
    """A classifier head as transformers' MobileNetV2 writes it: pooled, flattened (a view), then
    nn.Dropout(inplace=True), which in eval mode writes nothing."""

    def __init__(self):
        super().__init__()
        self.conv, self.bn = nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8)
        self.pool, self.drop, self.fc = nn.AdaptiveAvgPool2d(1), nn.Dropout(0.2, inplace=True), nn.Linear(8, 4)

    def forward(self, x):
        return self.fc(self.drop(torch.flatten(self.pool(self.bn(self.conv(x))), 1)))


def test_an_idle_dropout_in_place_is_no_write_for_the_node_local_lowering():
    x, m = torch.randn(2, 3, 10, 10), HeadWithDropoutInPlace().eval()
    ep = torch.export.export(m, (x,))
    assert any(n.target is torch.ops.aten.dropout_.default for n in ep.graph.nodes)
    ours = local.lower_locally(ep, trace_table(tables.torch_default_table()))
    assert ours is not None
    assert not any(n.target is torch.ops.aten.dropout_.default for n in ours.graph.nodes)
    whole = run_decompositions(ep, tables.torch_default_table(), local=False)
    _assert_same(ours, whole, ep.run_decompositions(), x)
    with torch.no_grad():
        torch.testing.assert_close(_outputs(ours, x)[0], m(x), rtol=1e-6, atol=1e-6)
