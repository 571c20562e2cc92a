"""What torch.export accepts, pt2b lowers as torch's run_decompositions does: grad-mode regions (also
unflattened), unbacked sizes node by node (bit for bit, validation off), and the runtime assertions
a lowered program keeps and raises on."""

from __future__ import annotations

import collections

import pytest
import torch
from torch.export import Dim

from exporter import export_model, load, load_for_backend
from exporter.errors import RuntimeInputError
from tests.support.helpers import raised as _raises, same_tensor_leaves as _same

aten = torch.ops.aten
ASSERTIONS = frozenset({aten._assert_scalar.default, aten._assert_async.default, aten._assert_async.msg,
                        aten.sym_constrain_range.default, aten.sym_constrain_range_for_size.default})


def _t(*shape):
    return torch.randn(*shape)


def _lowered(tmp_path, model, args, dynamic=None, strict=False):
    ep = torch.export.export(model, args, dynamic_shapes=dynamic, strict=strict)
    path = tmp_path / "m.pt2b"
    export_model(ep, path=path)
    return ep, path, load_for_backend(path, "core", cache=False, validate=False)


# ---- grad-mode regions ----

class NoGradBlock(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(3, 3)

    def forward(self, x):
        with torch.no_grad():
            y = self.lin(x)
        return y * 2


class SwitchesGrad(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.inner = NoGradBlock()
        self.lin = torch.nn.Linear(3, 3)

    def forward(self, x):
        torch.set_grad_enabled(False)
        z = self.lin(x)
        torch.set_grad_enabled(True)
        return self.inner(z) + z


@pytest.mark.parametrize("strict", [False, True], ids=["nonstrict", "strict"])
def test_a_grad_region_lowers_and_unflattens_as_torchs(tmp_path, strict):
    torch.manual_seed(0)
    model, x = SwitchesGrad(), _t(2, 3)
    ep, path, lowered = _lowered(tmp_path, model, (x,), strict=strict)
    theirs = torch.export.unflatten(ep.run_decompositions())
    # (an unflattened module leaves grad mode as its last switch set it, as torch's own do: the test
    # gives the mode back to the next one)
    with torch.enable_grad():
        _compare_unflattened(model, x, path, lowered, theirs)


def _compare_unflattened(model, x, path, lowered, theirs):
    for args in ((x,), (_t(2, 3),)):
        want = model(*args)
        assert torch.equal(lowered(*args), theirs(*args))
        # unflatten places every call by its module stack, the lowering's grad-mode switches too
        unflat = torch.export.unflatten(lowered.exported_program())
        assert torch.equal(unflat(*args), theirs(*args)) and torch.allclose(unflat(*args), want)
        assert torch.equal(torch.export.unflatten(load(path).exported_program())(*args), want)
    assert isinstance(unflat.inner, torch.nn.Module)  # the submodule is rebuilt, not inlined


# ---- unbacked sizes, node by node ----

class ItemView(torch.nn.Module):
    def forward(self, x, n):
        k = n.item()
        torch._check(k >= 1)
        torch._check(k <= 12)
        torch._check(12 % k == 0)
        return x.view(k, -1) * 2


class ItemExpand(torch.nn.Module):
    def forward(self, x, n):
        k = n.item()
        torch._check(k >= 0)
        torch._check(k <= 8)
        return x.expand(k, x.shape[1]) + 1


class ItemLinearTransposed(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(4, 5))

    def forward(self, x, n):
        k = n.item()
        torch._check(k >= 0)
        torch._check(k <= 6)
        return torch.nn.functional.linear(x[:k].permute(0, 2, 1), self.w.t())


class ItemSlice(torch.nn.Module):
    def forward(self, x, n):
        k = n.item()
        torch._check(k >= 0)
        torch._check(k <= x.shape[0])
        return x[k:] * x[:1].sum(), x[:k].cumsum(0)


UNBACKED = {  # model, example inputs, other inputs
    "view": (ItemView, (_t(12), torch.tensor(3)), [(_t(12), torch.tensor(4)), (_t(12), torch.tensor(12))]),
    "expand": (ItemExpand, (_t(1, 3), torch.tensor(3)), [(_t(1, 3), torch.tensor(5)), (_t(1, 3), torch.tensor(0))]),
    "linear_non_contiguous": (ItemLinearTransposed, (_t(6, 4, 3), torch.tensor(3)),
                              [(_t(6, 4, 3), torch.tensor(5)), (_t(6, 4, 3), torch.tensor(1))]),
    "slice": (ItemSlice, (_t(6, 3), torch.tensor(2)), [(_t(6, 3), torch.tensor(5)), (_t(6, 3), torch.tensor(0))]),
}


@pytest.mark.parametrize("name", sorted(UNBACKED))
def test_unbacked_sizes_lower_bit_for_bit_as_torchs(tmp_path, name):
    torch.manual_seed(0)
    model, example, others = UNBACKED[name]
    module = model()
    ep, _, lowered = _lowered(tmp_path, module, example)
    assert lowered.validation is None  # nothing was compared: a wrong lowering cannot hide
    theirs = ep.run_decompositions().module()
    for args in [example, *others]:
        assert _same(lowered(*args), theirs(*args)), args
        # eager's kernel for a linear of a non-contiguous input is the CPU's choice: the decomposed program's
        # matmul may round otherwise than it in the last bits (it does on some CPUs), so eager is compared
        # within float32 rounding
        torch.testing.assert_close(lowered(*args), module(*args), rtol=1e-6, atol=1e-6)


# ---- runtime assertions ----

class SizeChecks(torch.nn.Module):
    def forward(self, x):
        torch._check(x.shape[0] % 2 == 0)
        torch._check(x.shape[0] <= 32)
        return x * 2


class MaxOfItemChecked(torch.nn.Module):
    """An exported max with a data-dependent check (the issue's "max" case)."""

    def forward(self, x):
        m = x.max().item()
        torch._check(m < 100)
        torch._check(m > -100)
        return x + m


class ClampedItemSize(torch.nn.Module):
    def forward(self, x, n):
        k = max(n.item(), 2)
        torch._check(k <= 10)
        return torch.ones(k) * x.sum()


class AsyncChecks(torch.nn.Module):
    def forward(self, x):
        torch._assert_async(x.sum() > 0, "the sum must be positive")
        return x * 3


class ConstrainedRange(torch.nn.Module):
    def forward(self, x, n):
        k = n.item()
        torch.sym_constrain_range_for_size(k, min=0, max=5)
        return x[:k] + 1


class ShiftedBy1(torch.nn.Module):
    def forward(self, x, y):
        return x[1:] + y


DX = Dim("dx", min=2, max=64)
CHECKED = {  # model, example inputs, dynamic shapes, inputs where torch's lowered program raises
    "size_checks": (SizeChecks, (_t(4, 3),), ({0: 2 * Dim("half", min=1, max=16)},),
                    [(_t(5, 3),), (_t(34, 3),)]),
    "max_of_item": (MaxOfItemChecked, (_t(4),), None, [(torch.full((4,), 200.0),), (torch.full((4,), -200.0),)]),
    "clamped_item_size": (ClampedItemSize, (_t(4), torch.tensor(3)), None, [(_t(4), torch.tensor(12))]),
    "assert_async": (AsyncChecks, (torch.rand(4) + 0.1,), None, [(-torch.rand(4) - 0.1,)]),
    "constrained_range": (ConstrainedRange, (_t(6), torch.tensor(3)), None, [(_t(6), torch.tensor(7))]),
    "derived_dim": (ShiftedBy1, (_t(10, 3), _t(9, 3)), ({0: DX + 1}, {0: DX}), [(_t(6, 3), _t(4, 3))]),
}


def _assertions(ep) -> collections.Counter:
    """(target, condition) of each runtime assertion after dead code elimination, each condition
    once: torch's retrace can assert the same condition twice (once as the call the program holds,
    once as the deferred assertion its shape environment records); pt2b asserts it once."""
    gm = ep.graph_module
    gm.graph.eliminate_dead_code()
    found = set()
    for n in gm.graph.nodes:
        if n.op == "call_function" and n.target in ASSERTIONS:
            cond = n.args[0] if n.args else None
            val = cond.meta.get("val") if isinstance(cond, torch.fx.Node) else cond
            found.add((str(n.target), str(val.node.expr) if isinstance(val, torch.SymBool) else str(n.args[1:])))
    return collections.Counter(target for target, _ in found)


@pytest.mark.filterwarnings("ignore::FutureWarning")
@pytest.mark.parametrize("name", sorted(CHECKED))
def test_the_lowered_program_keeps_and_raises_on_torchs_runtime_assertions(tmp_path, name):
    model, example, dynamic, bad = CHECKED[name]
    ep, _, lowered = _lowered(tmp_path, model(), example, dynamic)
    torchs = ep.run_decompositions()
    assert _assertions(lowered.exported_program()) == _assertions(torchs)
    assert _same(lowered(*example), torchs.module()(*example))
    for args in bad:
        want, got = _raises(torchs.module(), args), _raises(lowered, args)
        assert want is not None and got is not None, (want, got)
        if isinstance(want, AssertionError):  # torch's input guard: a size out of range, or a relation broken
            assert isinstance(got, RuntimeInputError), got  # (InputGuardError is one)
        else:
            assert type(got) is type(want) and str(got).split(" on node ")[0] == str(want).split(" on node ")[0]


def test_a_condition_is_asserted_once(tmp_path):
    """The program read from the file holds its assertion and its shape environment records it again:
    pt2b's lowering asserts it once, as torch's lowering of the program it exported does."""
    ep, _, lowered = _lowered(tmp_path, ClampedItemSize(), (_t(4), torch.tensor(3)))
    ours = [n for n in lowered.exported_program().graph.nodes if n.target is aten._assert_scalar.default]
    assert len(ours) == 1
    assert len([n for n in ep.run_decompositions().graph.nodes if n.target is aten._assert_scalar.default]) == 1


class _Branches(torch.nn.Module):
    def forward(self, x):
        return torch.cond(x.sum() > 0, lambda x: x.sin(), lambda x: x.cos(), (x,))


class _GroupedQueryAttention(torch.nn.Module):
    def forward(self, q, k, v):
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, enable_gqa=True)


@pytest.mark.parametrize("make, args", [
    (_Branches, (torch.randn(3),)),
    (_GroupedQueryAttention, (torch.randn(1, 4, 5, 8), torch.randn(1, 2, 5, 8), torch.randn(1, 2, 5, 8))),
], ids=["cond", "sdpa-gqa"])
def test_the_lowered_code_is_torchs_but_for_a_conds_operand_list(tmp_path, make, args):
    """torch's own tests compare generated code with text. pt2b's lowered code is torch's
    run_decompositions' line for line, except that a cond's operands are the list the serialized
    graph holds where torch's retrace writes a tuple (the same call: cond takes either)."""
    m = make()
    ep = torch.export.export(m, args)
    export_model(ep, tmp_path / "m.pt2b")
    lowered = load_for_backend(tmp_path / "m.pt2b", "core", cache=False, validate=False)
    ours = lowered.exported_program().graph_module.code
    torchs = ep.run_decompositions()
    assert ours.replace("false_graph_0, [x])", "false_graph_0, (x,))") == torchs.graph_module.code
    assert (("[x])" in ours) == (make is _Branches))
    assert torch.equal(lowered(*args), torchs.module()(*args))
