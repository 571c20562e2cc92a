"""Derived dims, automatic dynamic shapes and unbacked sizes lowered as torch's run_decompositions
lowers them: the same values on inputs torch's lowered program runs, an error where it raises (the
relations between input sizes and the runtime assertions kept)."""

from __future__ import annotations

import pytest
import torch
from torch.export import Dim

from exporter import export_model, load, load_for_backend
from exporter.errors import InputGuardError

DX = Dim("dx", min=2, max=64)


class _ShiftedBy1(torch.nn.Module):
    def forward(self, x, y):
        return x[1:] + y


class _Halved(torch.nn.Module):
    def forward(self, x, y):
        return x[::2] + y


class _Flattened(torch.nn.Module):
    def forward(self, x, y):
        return x.view(-1) + y


class _Cat(torch.nn.Module):
    def forward(self, x, y):
        return torch.cat([x, y]) * 2


class _PrefixOf(torch.nn.Module):
    def forward(self, x, y):
        return x + y[: x.shape[0]]


class _ItemBoundedByDim(torch.nn.Module):
    def forward(self, x, n):
        k = n.item()
        torch._check(k <= x.shape[0])
        return x[:k] * 2


class _ItemSize(torch.nn.Module):
    def forward(self, x, n):
        k = n.item()
        torch._check_is_size(k)
        return torch.ones(k) * x.max()


class _ItemIntoLinear(torch.nn.Module):
    def forward(self, x, n):
        k = n.item()
        torch._check_is_size(k)
        torch._check(k <= 6)
        return x[:, :k].t() @ torch.ones(x.shape[0])


class _ItemIntoViewExpand(torch.nn.Module):
    def forward(self, x, n):
        k = n.item()
        torch._check_is_size(k)
        torch._check(k <= 6)
        return x.view(2, -1)[:, :k].expand(3, 2, k).sum(0)


def _t(*shape):
    return torch.randn(*shape)


# (model, example inputs, dynamic shapes, inputs torch's lowered program runs, inputs where it raises)
CASES = {
    "dim_plus_1": (_ShiftedBy1, (_t(10, 3), _t(9, 3)), ({0: DX + 1}, {0: DX}),
                   [(_t(6, 3), _t(5, 3))], [(_t(6, 3), _t(4, 3))]),
    "twice_a_dim": (_Halved, (_t(8, 3), _t(4, 3)), ({0: 2 * DX}, {0: DX}),
                    [(_t(12, 3), _t(6, 3))], [(_t(12, 3), _t(5, 3))]),
    "three_times_a_dim": (_Flattened, (_t(4, 3), _t(12)), ({0: DX}, {0: 3 * DX}),
                          [(_t(5, 3), _t(15))], [(_t(5, 3), _t(14))]),
    "automatic": (_Cat, (_t(8, 3), _t(4, 3)), ({0: Dim.AUTO}, {0: Dim.AUTO}), [(_t(12, 3), _t(6, 3))], []),
    "automatic_prefix": (_PrefixOf, (_t(4, 3), _t(5, 3)), ({0: Dim.AUTO}, {0: Dim.AUTO}),
                         [(_t(6, 3), _t(7, 3)), (_t(6, 3), _t(6, 3))], []),
    "unbacked_bounded_by_a_dim": (_ItemBoundedByDim, (_t(6, 3), torch.tensor(3)), ({0: DX}, None),
                                  [(_t(6, 3), torch.tensor(2))], [(_t(6, 3), torch.tensor(9))]),
    "unbacked_size": (_ItemSize, (_t(6, 3), torch.tensor(3)), None,
                      [(_t(6, 3), torch.tensor(5))], [(_t(6, 3), torch.tensor(-1))]),
    "unbacked_into_linear": (_ItemIntoLinear, (_t(4, 6), torch.tensor(3)), None,
                             [(_t(4, 6), torch.tensor(5)), (_t(4, 6), torch.tensor(0))], []),
    "unbacked_into_view_expand": (_ItemIntoViewExpand, (_t(4, 6), torch.tensor(3)), None,
                                  [(_t(4, 6), torch.tensor(5))], []),
}


def _raises(fn, args):
    try:
        fn(*args)
    except Exception as e:  # noqa: BLE001 -- what each raises is compared below
        return e
    return None


@pytest.mark.parametrize("name", sorted(CASES))
def test_the_lowering_computes_and_refuses_what_torchs_does(tmp_path, name):
    model, example, dynamic, good, bad = CASES[name]
    ep = torch.export.export(model(), example, dynamic_shapes=dynamic)
    export_model(ep, path=tmp_path / "m.pt2b")
    theirs = ep.run_decompositions().module()
    ours = load_for_backend(tmp_path / "m.pt2b", "core", cache=False)
    for args in [example, *good]:
        torch.testing.assert_close(ours(*args), theirs(*args), rtol=0, atol=0)
    for args in bad:
        want, got = _raises(theirs, args), _raises(ours, args)
        assert want is not None and got is not None, (want, got)
        if isinstance(want, AssertionError):  # a relation between input sizes: torch's guard
            assert isinstance(got, InputGuardError) and isinstance(got, AssertionError), got
            assert str(want).removeprefix("Guard failed: ") in str(got)
        else:  # a runtime assertion of the program, kept in the lowered graph
            assert type(got) is type(want) and "Runtime assertion failed for expression" in str(got), got


def test_a_loaded_program_names_the_broken_relation(tmp_path):
    ep = torch.export.export(_ShiftedBy1(), (_t(10, 3), _t(9, 3)), dynamic_shapes=({0: DX + 1}, {0: DX}))
    export_model(ep, path=tmp_path / "m.pt2b")
    with pytest.raises(InputGuardError, match=r"the inputs break a condition on input sizes the program was "
                                              r"exported with: -1 \+ x.size\(\)\[0\] == y.size\(\)\[0\]"):
        load(tmp_path / "m.pt2b")(_t(6, 3), _t(4, 3))
