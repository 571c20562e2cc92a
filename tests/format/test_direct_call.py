"""Calling a loaded program runs its lifted graph directly while the call matches the program's static
inputs (exporter/lifted.py), with what ep.module() gives: the same outputs bit for bit, the same writes
into buffers and into the caller's inputs; calls that do not match go through ep.module(), and fail
where it does, with pt2b's typed errors."""

from __future__ import annotations

import pytest
import torch

from exporter import export_model, load, load_for_backend
from exporter.errors import InputGuardError, RuntimeInputError
from tools.corpus.zoo import make_case, zoo_names
from tests.support.helpers import assert_bitwise


class Counter(torch.nn.Module):
    """A buffer written in place and an input written in place, outputs in a dict with a constant."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(8, 8)
        self.register_buffer("seen", torch.zeros(8))
        self.register_buffer("scratch", torch.ones(8), persistent=False)

    def forward(self, x, *, scale):
        self.seen.add_(x.sum(0))
        x.mul_(2)
        return {"y": self.lin(x) * scale + self.scratch, "n": None, "k": 3}


def _pair(tmp_path):
    torch.manual_seed(0)
    args, kwargs = (torch.randn(4, 8),), {"scale": torch.randn(8)}
    path = tmp_path / "m.pt2b"
    export_model(Counter(), args, path, kwargs=kwargs)
    return path, args, kwargs


def _call(prog_or_module, args, kwargs):
    args = tuple(a.clone() for a in args)
    out = prog_or_module(*args, **kwargs)
    return out, args


def test_a_matching_call_runs_the_lifted_graph_as_the_module_does(tmp_path):
    path, args, kwargs = _pair(tmp_path)
    direct, module = load(path), load(path).module()
    for _ in range(2):  # the buffer carries over between calls the same way
        got, got_args = _call(direct, args, kwargs)
        want, want_args = _call(module, args, kwargs)
        assert got.keys() == want.keys() and got["n"] is None and got["k"] == 3
        assert torch.equal(got["y"], want["y"])
        assert torch.equal(got_args[0], want_args[0]) and not torch.equal(got_args[0], args[0])  # input written
    assert direct._module is None and direct._direct  # no ep.module() was built
    assert torch.equal(direct.exported_program().state_dict["seen"], module.seen)
    assert torch.equal(module.seen, 2 * args[0].sum(0))


class SameNames(torch.nn.Module):
    """A buffer and an input both named x: the lowered program's buffer write must land in the buffer."""

    def __init__(self):
        super().__init__()
        self.register_buffer("x", torch.zeros(3))

    def forward(self, x):
        self.x.add_(x)
        return x * 2


def test_a_buffer_write_lands_in_the_buffer_when_an_input_has_its_name(tmp_path):
    path = tmp_path / "s.pt2b"
    export_model(SameNames(), (torch.ones(3),), path)
    lowered = load_for_backend(path, "core", cache=False)
    x = torch.arange(3.0)
    assert torch.equal(lowered(x), x * 2) and torch.equal(x, torch.arange(3.0))
    assert torch.equal(lowered.exported_program().state_dict["x"], torch.arange(3.0))


def test_a_lowered_program_writes_its_state_back(tmp_path):
    """The lowered program is functional: its buffer and input writes are outputs, copied back."""
    path, args, kwargs = _pair(tmp_path)
    lowered, module = load_for_backend(path, "core", cache=False), load_for_backend(path, "core", cache=False).module()
    got, got_args = _call(lowered, args, kwargs)
    want, want_args = _call(module, args, kwargs)
    assert lowered._module is None and lowered._direct and lowered._direct.binding.writes
    assert torch.equal(got["y"], want["y"]) and torch.equal(got_args[0], want_args[0])
    assert torch.equal(lowered.exported_program().state_dict["seen"], module.seen)
    assert torch.equal(module.seen, args[0].sum(0))


@pytest.mark.parametrize("bad", ["shape", "dtype", "missing kwarg"])
def test_a_call_that_does_not_match_fails_where_torchs_module_does(tmp_path, bad):
    """What torch's ep.module() refuses the loaded program and its module() refuse too: a broken guard as
    an InputGuardError (an AssertionError with torch's text), another structure as a RuntimeInputError
    naming what was expected (torch's module says "kwarg keyword mismatch"); another dtype fails in
    the kernel, as it does in torch's module."""
    path, args, kwargs = _pair(tmp_path)
    x, kw = args[0], dict(kwargs)
    if bad == "shape":
        x = torch.randn(5, 8)
    elif bad == "dtype":
        x = x.double()
    else:
        kw = {}
    prog = load(path)
    with pytest.raises(Exception) as want:
        prog.exported_program().module()(x.clone(), **kw)
    for call in (load(path), prog.module()):
        with pytest.raises(type(want.value) if bad == "dtype" else Exception) as got:
            call(x.clone(), **kw)
        if bad == "shape":  # torch's guard, typed: an InputGuardError that is an AssertionError with its text
            assert isinstance(got.value, InputGuardError) and isinstance(want.value, AssertionError)
            assert str(want.value).removeprefix("Guard failed: ") in str(got.value)
        elif bad == "missing kwarg":
            assert isinstance(want.value, ValueError) and type(got.value) is RuntimeInputError
            assert str(got.value).startswith(f"{path}: inputs do not match the program's signature: expected 1 "
                                             "positional argument(s) (x) and keyword argument(s) ['scale']; got 1 "
                                             "positional and keyword argument(s) [] (missing ['scale'], unexpected [])")
        else:
            assert str(got.value) == str(want.value)


def test_after_module_is_asked_for_calls_go_through_it(tmp_path):
    """A user who holds the module (hooks, attributes) sees every later call go through it."""
    path, args, kwargs = _pair(tmp_path)
    prog = load(path)
    seen = []
    prog.module().register_forward_hook(lambda *a: seen.append(1))
    prog(*(a.clone() for a in args), **kwargs)
    assert seen == [1]


def test_a_dynamic_program_runs_directly_within_its_ranges(tmp_path):
    """Dynamic dims of their own are checked as ep.module()'s guards check them: within the range, the
    same size wherever the dim recurs; outside, the call goes through the module path (which names a dim
    out of range as a RuntimeInputError)."""
    from exporter.errors import RuntimeInputError

    class Add(torch.nn.Module):
        def forward(self, x, y):
            return torch.relu(x) + y

    path = tmp_path / "d.pt2b"
    batch = torch.export.Dim("batch", min=2, max=16)
    export_model(Add(), (torch.randn(3, 4), torch.randn(3, 4)), path, dynamic_shapes=({0: batch}, {0: batch}))
    prog, module = load(path), load(path).module()
    x, y = torch.randn(5, 4), torch.randn(5, 4)
    assert torch.equal(prog(x, y), module(x, y))
    if prog.exported_program()._guards_code:  # torch records the equality as a guard: the module decides
        assert prog._direct is False
    else:
        assert prog._direct and prog._module is None
    with pytest.raises(RuntimeInputError, match="outside the range"):
        prog(torch.randn(17, 4), torch.randn(17, 4))
    with pytest.raises(Exception) as want:
        module(torch.randn(5, 4), torch.randn(6, 4))
    with pytest.raises(type(want.value)):
        prog(torch.randn(5, 4), torch.randn(6, 4))


def test_a_dynamic_batch_runs_directly(tmp_path):
    path = tmp_path / "d.pt2b"
    batch = torch.export.Dim("batch", min=2, max=16)
    export_model(torch.nn.Linear(4, 4), (torch.randn(3, 4),), path, dynamic_shapes=({0: batch},))
    prog = load(path)
    x = torch.randn(5, 4)
    assert torch.equal(prog(x), load(path).module()(x))
    assert prog._direct and prog._module is None
    assert prog._direct(((torch.randn(1, 4),)), {}) is NotImplemented  # below the range: the module path


def test_a_first_call_builds_no_exported_program_and_generates_code_once(tmp_path, monkeypatch):
    """A loaded program's first call runs the lifted graph torch's deserializer builds without fake values,
    metadata or an ExportedProgram (reader.build_for_call): its code is generated once (0.05 s per 700
    nodes), calls run it, and no ExportedProgram is made until asked for; the one made then computes
    the same, and its graph module's code is generated only when used."""
    path, args, kwargs = _pair(tmp_path)
    generated = []
    real = torch.fx.Graph.python_code
    monkeypatch.setattr(torch.fx.Graph, "python_code",
                        lambda self, *a, **k: generated.append(self) or real(self, *a, **k))
    prog = load(path)
    out, _ = _call(prog, args, kwargs)
    assert not prog._built.done and len(generated) == 1 and generated[0] is prog._for_call.get().graph
    assert all(n.meta["val"] is None for n in generated[0].nodes if n.op == "call_function")
    ep = prog.exported_program()
    assert len(generated) == 1 and "def forward" in ep.graph_module.code
    fresh = load(path)
    fresh.exported_program()  # an ExportedProgram built before the first call: the call runs its graph
    again, _ = _call(fresh, args, kwargs)
    assert fresh._direct.gm is fresh.exported_program().graph_module and not fresh._for_call.done
    assert torch.equal(out["y"], again["y"])
    assert torch.equal(out["y"], _call(load(path).module(), args, kwargs)[0]["y"])


def _calls(gm) -> list:
    """Every node of ``gm`` but the getitems (op, name, target, arguments with nodes by name)."""
    import operator

    from tests.support.helpers import _norm_arg

    return [(n.op, n.name, str(n.target), _norm_arg(n.args), _norm_arg(n.kwargs)) for n in gm.graph.nodes
            if n.target is not operator.getitem]


@pytest.mark.parametrize("name", zoo_names())
def test_the_first_calls_graph_is_the_exported_programs(tmp_path, name):
    """The graph a first call runs (reader.build_for_call) has the nodes, targets and arguments of the
    ExportedProgram's, getitems aside (ExportedProgram drops repeated ones), and computes the same."""
    case = make_case(name)
    path = tmp_path / f"{name}.pt2b"
    export_model(case.model, case.args, path, kwargs=case.kwargs, dynamic_shapes=case.dynamic_shapes)
    prog = load(path)
    lean = prog._for_call.get()
    assert _calls(lean.graph_module) == _calls(prog.exported_program().graph_module)
    assert lean.graph_signature == prog.exported_program().graph_signature
    a, k = case.args, case.kwargs or {}
    with torch.no_grad():
        assert_bitwise(load(path)(*a, **k), load(path).module()(*a, **k))
