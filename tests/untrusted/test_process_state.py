"""A file cannot change the caller's process: region nodes (grad mode, autocast, vmap/jvp levels, dual
levels) must pair up in each graph before anything runs, and loading, lowering, running and verifying
give back grad mode, autocast, default dtype, deterministic flags, matmul precision, mode stacks, threads
and functorch levels as they found them, also when a call raises. Rebuilt from issue 63's second case."""

from __future__ import annotations

import itertools
import types

import pytest
import torch
from torch._export.serde import schema as S
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

from exporter import export_model, load, load_for_backend
from exporter.cli import main as cli
from exporter.errors import CorruptArtifactError
from exporter.serialize.read import regions, untrusted
from exporter.util import process_state
from runtime_ref import Runtime
from tests.support.artifact_surgery import find_nodes, rewrite_artifact
from tests.support.helpers import Mlp, assert_close_to_eager

GRAD = "torch._C._set_grad_enabled"
ENTER, EXIT = "torch.amp.autocast_mode._enter_autocast", "torch.amp.autocast_mode._exit_autocast"
PREDISPATCH = "torch._functorch.predispatch."
DEVICES = torch._C._autocast_supported_devices()


class Regions(torch.nn.Module):
    """A legitimate program with a no_grad region holding a bf16 autocast region, and an enable_grad one."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(8, 8)

    def forward(self, x):
        with torch.no_grad():
            a = self.lin(x).relu()
            with torch.autocast("cpu", torch.bfloat16):
                b = a @ a.transpose(-1, -2)
        with torch.enable_grad():
            c = x * 2
        return b.float().sum() + a + c


class Branches(torch.nn.Module):
    def forward(self, x):
        return torch.cond(x.sum() > 0, lambda t: t.sin(), lambda t: t.cos(), (x,))


def observed() -> tuple:
    """The process state as a user sees it, through torch's public functions."""
    nesting = torch.autocast_increment_nesting() - 1
    torch.autocast_decrement_nesting()
    return (torch.is_grad_enabled(),
            tuple((torch.is_autocast_enabled(d), torch.get_autocast_dtype(d)) for d in DEVICES),
            torch.is_autocast_cache_enabled(), nesting, torch.get_default_dtype(),
            torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled(),
            torch.get_float32_matmul_precision(), torch._C._len_torch_function_stack(),
            torch._C._len_torch_dispatch_stack(), torch.get_num_threads(),
            torch._C._functorch.get_dynamic_layer_stack_depth())


def assert_untouched(before: tuple) -> None:
    assert observed() == before
    a, w = torch.randn(3, 4), torch.randn(4, 4, requires_grad=True)
    out = a @ w  # the user's own matmul afterwards: float32, recording autograd history
    assert out.dtype == torch.float32 and out.requires_grad


def _arg(**kw) -> S.NamedArgument:
    return S.NamedArgument(name="", arg=S.Argument.create(**kw), kind=S.ArgumentKind.POSITIONAL)


def _node(target: str, inputs: list, name: str = "crafted") -> S.Node:
    return S.Node(target=target, inputs=inputs, outputs=[S.Argument.create(as_none=True)], metadata={},
                  is_hop_single_tensor_return=None, name=name)


def _grad(flag: bool, name: str = "crafted") -> S.Node:
    return _node(GRAD, [_arg(as_bool=flag)], name)


def _enter(name: str = "crafted", dtype=S.ScalarType.BFLOAT16) -> S.Node:
    return _node(ENTER, [_arg(as_string="cpu"), _arg(as_scalar_type=dtype), _arg(as_bool=True), _arg(as_bool=False)],
                 name)


def _exit(enter: str, name: str) -> S.Node:
    return _node(EXIT, [_arg(as_tensor=S.TensorArgument(name=enter))], name)


def _crafted(tmp_path, nodes: list, *, model=None, args=None, name="crafted.pt2b", subgraph=False):
    """A real exported program with ``nodes`` inserted at the start of its graph (or of its first
    subgraph), checksums repaired."""
    source = tmp_path / f"source_{name}"
    export_model(model or Mlp(), args or (torch.randn(2, 4),), source)

    def edit(serialized, program):
        graph = serialized.graph_module.graph
        if subgraph:
            (cond,) = find_nodes(serialized, "torch.ops.higher_order.cond.default") or \
                find_nodes(serialized, "torch.ops.higher_order.cond")
            graph = next(i.arg.value.graph for i in cond.inputs if i.arg.type == "as_graph")
        graph.nodes[0:0] = nodes

    return rewrite_artifact(source, tmp_path / name, edit=edit)


# ---- the two files: refused before anything runs, the process untouched ----

CASES = {
    "grad": ([_grad(False)], r"node 'crafted' \(torch\._C\._set_grad_enabled\) opens a grad-mode region \(sets grad "
                             r"mode to False\) that no later call in its graph closes"),
    "autocast": ([_enter()], r"node 'crafted' \(torch\.amp\.autocast_mode\._enter_autocast\) opens an autocast region "
                             r"that nothing after it in its graph closes"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_an_unpaired_region_node_is_refused_and_leaves_the_process_as_it_was(tmp_path, case):
    nodes, match = CASES[case]
    path = _crafted(tmp_path, nodes)
    x = torch.randn(2, 4)
    steps = {
        "check": lambda: load(path).check(),
        "call": lambda: load(path)(x),
        "load_for_backend": lambda: load_for_backend(path, cache=False),
        "Runtime": lambda: Runtime(load(path)),
    }
    for grad in (True, False):
        with torch.set_grad_enabled(grad):
            before = observed()
            for what, step in steps.items():
                with pytest.raises(CorruptArtifactError, match=match):
                    step()
                assert observed() == before, what
    before = observed()
    assert cli(["--quiet", "verify", str(path)]) == 2
    assert_untouched(before)


@pytest.mark.parametrize("case", sorted(CASES))
def test_without_the_pairing_check_the_state_is_still_given_back(tmp_path, monkeypatch, case):
    """The second line of defence: with the check switched off, the issue's files run (a call; the
    lowering's validation runs the inserted node), and the caller's state is given back anyway; in
    strict mode (tests, fuzzers) a change other than grad mode is an AssertionError."""
    path = _crafted(tmp_path, CASES[case][0])
    monkeypatch.setattr(untrusted, "check_regions", lambda graph, where: None)
    monkeypatch.setattr(process_state, "ASSERT_UNCHANGED", False)  # (the suite turns it on: tests/conftest.py) users do not
    x = torch.randn(2, 4)
    before = observed()
    load(path)(x)
    assert_untouched(before)
    lowered = load_for_backend(path, cache=False)
    assert_untouched(before)
    Runtime(lowered)(x)
    assert_untouched(before)
    monkeypatch.setattr(process_state, "ASSERT_UNCHANGED", True)
    if case == "grad":  # a valid program may leave grad mode as it was traced: restored, not an error
        load(path)(x)
    else:
        with pytest.raises(AssertionError, match=r"autocast enabled \(per device type\), autocast nesting"):
            load_for_backend(path, cache=False)
    assert_untouched(before)


# ---- the pairing rule ----

def _vmap_in():
    return _node(f"{PREDISPATCH}_vmap_increment_nesting", [_arg(as_int=2), _arg(as_string="error")], "vmap_in")


@pytest.mark.parametrize("nodes, match", [
    # closed out of order: the outer region's exit before the inner one's
    ([_enter("outer"), _enter("inner"), _exit("outer", "exit_outer"), _exit("inner", "exit_inner")],
     r"node 'exit_outer' .* does not close the innermost open autocast region, which 'inner' opened"),
    ([_exit("nowhere", "stray")], r"node 'stray' .* closes an autocast region that is not open in its graph"),
    ([_vmap_in()], r"node 'vmap_in' .* opens a vmap region that nothing after it"),
    ([_vmap_in(), _node(f"{PREDISPATCH}_jvp_decrement_nesting", [], "jvp_out")],
     r"node 'jvp_out' .* closes a jvp region where the innermost open one is the vmap region 'vmap_in' opened"),
    ([_node(f"{PREDISPATCH}_enter_dual_level", [], "dual")], r"node 'dual' .* opens a dual level region"),
    ([_grad(True, "on"), _grad(False, "off"), _grad(False, "again")], r"node 'again' .* opens a grad-mode region"),
    ([_node(GRAD, [_arg(as_int=0)], "int_mode"), _grad(True, "on")],
     r"node 'int_mode' .* does not take exactly one bool"),
], ids=["autocast_out_of_order", "autocast_exit_alone", "vmap_open", "jvp_closes_vmap", "dual_level_open",
        "grad_three", "grad_not_bool"])
def test_region_nodes_that_do_not_pair_up_are_refused_by_name(tmp_path, nodes, match):
    path = _crafted(tmp_path, nodes)
    with pytest.raises(CorruptArtifactError, match=match):
        load(path).check()


def test_a_region_is_paired_within_its_own_subgraph(tmp_path):
    """A grad-mode pair split between a cond branch and the graph around it pairs up in neither."""
    x = torch.randn(3)
    path = _crafted(tmp_path, [_grad(False, "in_branch")], model=Branches(), args=(x,), subgraph=True)
    before = observed()
    with pytest.raises(CorruptArtifactError, match=r"node 'in_branch' .* opens a grad-mode region"):
        load(path)(x)
    assert_untouched(before)
    paired = _crafted(tmp_path, [_grad(False, "a"), _grad(True, "b")], model=Branches(), args=(x,), subgraph=True,
                      name="paired.pt2b")
    torch.testing.assert_close(load(paired)(x), Branches()(x))


def _nested_reading_exists(values: tuple) -> bool:
    """Whether some nesting of regions explains a sequence of grad modes set, each region's exit setting
    back the mode its entry found, starting and ending in one mode: tried every way."""
    def go(i, stack, current, start):
        if i == len(values):
            return not stack and current == start
        v = values[i]
        return go(i + 1, stack + (current,), v, start) or (bool(stack) and stack[-1] == v
                                                           and go(i + 1, stack[:-1], v, start))
    return any(go(0, (), start, start) for start in (False, True))


def test_the_grad_mode_rule_accepts_exactly_what_some_nesting_explains():
    for n in range(9):
        for values in itertools.product((False, True), repeat=n):
            graph = types.SimpleNamespace(nodes=[_grad(v, f"g{i}") for i, v in enumerate(values)])
            try:
                regions.check_regions(graph, "test")
                accepted = True
            except CorruptArtifactError:
                accepted = False
            assert accepted == _nested_reading_exists(values), values


class Vmapped(torch.nn.Module):
    def forward(self, x):
        return torch.vmap(lambda r: r.sin() * 2)(x)


class Jvp(torch.nn.Module):
    def forward(self, x):
        return torch.func.jvp(lambda r: r.sin(), (x,), (torch.ones_like(x),))[1]


@pytest.mark.parametrize("model", [Vmapped, Jvp])
def test_vmap_and_jvp_levels_as_torch_export_records_them_load_and_run(tmp_path, model):
    x = torch.randn(3, 3)
    export_model(model(), (x,), tmp_path / "m.pt2b")
    before = observed()
    torch.testing.assert_close(load(tmp_path / "m.pt2b")(x), model()(x))
    assert_untouched(before)


# ---- a legitimate program with regions: loads, lowers, runs, and changes nothing ----

@pytest.fixture(scope="module")
def regions_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("regions") / "regions.pt2b"
    torch.manual_seed(0)
    export_model(Regions().eval(), (torch.randn(2, 5, 8),), path)
    return path


def _eager(x):
    torch.manual_seed(0)
    return Regions().eval()(x).detach()


def test_a_program_with_regions_runs_as_eager_and_changes_nothing(regions_file, monkeypatch):
    monkeypatch.setattr(process_state, "ASSERT_UNCHANGED", True)  # nothing but grad mode may even change on the way
    x = torch.randn(2, 5, 8)
    eager = _eager(x)
    for grad in (True, False):
        with torch.set_grad_enabled(grad):
            before = observed()
            prog = load(regions_file)
            assert_close_to_eager(prog(x).detach(), eager, 1e-6, 1e-6)
            lowered = load_for_backend(regions_file, "core", cache=False)
            assert {GRAD, ENTER} <= {n.target.__module__ + "." + n.target.__name__ for n in
                                     lowered.exported_program().graph.nodes if n.op == "call_function"
                                     and not isinstance(n.target, torch._ops.OpOverload)
                                     and hasattr(n.target, "__module__")}  # run as flat region nodes
            assert_close_to_eager(lowered(x).detach(), eager, 2e-2, 2e-2)
            rt = Runtime(lowered)
            assert_close_to_eager(rt(x), eager, 2e-2, 2e-2)
            assert_close_to_eager(Runtime(prog)(x), eager, 2e-2, 2e-2)
            assert observed() == before
    assert_untouched(observed())


class _RaiseOn(TorchDispatchMode):
    """A run failing midway: raises when an op named ``name`` is dispatched."""

    def __init__(self, name):
        super().__init__()
        self.name = name

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func._schema.name.split("::")[1] == self.name:
            raise RuntimeError(f"boom in {func}")
        return func(*args, **(kwargs or {}))


def test_the_state_is_given_back_when_a_call_raises_midway(regions_file):
    """Inside the lowered program's autocast region (the bf16 bmm), run by torch's module and by the
    runtime; and a wrong input."""
    lowered = load_for_backend(regions_file, "core", cache=False)
    x = torch.randn(2, 5, 8)
    for call in (lowered, Runtime(lowered)):
        for grad in (True, False):
            with torch.set_grad_enabled(grad):
                with _RaiseOn("bmm"):
                    before = observed()
                    with pytest.raises(RuntimeError, match="boom"):
                        call(x)
                    assert observed() == before
    before = observed()
    for call in (lowered, Runtime(lowered), load(regions_file)):
        with pytest.raises(Exception):
            call(torch.randn(3, 8))
        assert observed() == before
    assert_untouched(before)


# ---- the context manager itself ----

class _FunctionMode(TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


class _DispatchMode(TorchDispatchMode):
    pass


def _change_everything(full: bool = True):
    torch._C._set_grad_enabled(not torch.is_grad_enabled())
    torch.amp.autocast_mode._enter_autocast("cpu", torch.float16, True, False)
    torch.set_default_dtype(torch.float64)
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.set_float32_matmul_precision("medium")
    torch._C._push_on_torch_function_stack(_FunctionMode())
    torch._C._push_on_torch_dispatch_stack(_DispatchMode())
    torch.set_num_threads(1 if torch.get_num_threads() > 1 else 2)
    torch._C._functorch._vmap_increment_nesting(2, "error")
    if full:
        torch._C._enter_dual_level()


def _without_autocast_dtypes(state: tuple) -> tuple:
    return (state[0], tuple(on for on, _ in state[1]), *state[2:])


@pytest.mark.parametrize("full", [True, False])
def test_every_field_is_given_back_after_a_raise(full):
    """``full=False`` (the runtime's calls) leaves out the autocast dtypes and the dual level, which
    only a program with autocast regions (the runtime gives those back itself) or forward-AD levels
    (which the runtime does not run) could change."""
    before = observed()
    with pytest.raises(RuntimeError, match="midway"):
        with process_state.preserved(full=full):
            _change_everything(full)
            assert observed() != before
            raise RuntimeError("midway")
    if full:
        assert observed() == before
        torch._C._enter_dual_level()  # the dual level was closed again: torch allows one at a time
        torch._C._exit_dual_level(level=0)
    else:
        assert _without_autocast_dtypes(observed()) == _without_autocast_dtypes(before)
        torch.set_autocast_dtype("cpu", before[1][DEVICES.index("cpu")][1])


def test_strict_mode_names_what_changed_and_gives_it_back(monkeypatch):
    monkeypatch.setattr(process_state, "ASSERT_UNCHANGED", True)
    before = observed()
    with pytest.raises(AssertionError, match=r"default dtype, deterministic algorithms, deterministic warn-only, "
                                             r"float32 matmul precision, torch function modes, torch dispatch modes"):
        process_state.preserved()(_change_everything)()
    assert_untouched(before)
    process_state.preserved()(lambda: torch._C._set_grad_enabled(False))()  # grad mode alone: no error
    assert_untouched(before)


def test_threads_checking_the_state_at_once_see_no_forward_ad_level(monkeypatch):
    """Forward-AD levels are process-wide: each check probes by opening one and closing it. Threads
    checking at once must not see each other's probes as a level left open (the check would close
    it under its owner)."""
    import sys
    import threading

    monkeypatch.setattr(process_state, "ASSERT_UNCHANGED", True)
    seen_open, errors = [], []
    start = threading.Barrier(4)

    def loop():
        start.wait()
        try:
            for _ in range(1000):
                with process_state.preserved():
                    seen_open.append(process_state.snapshot()[process_state._DUAL])
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(repr(e))

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # threads switch between any two calls, as on a loaded machine
    try:
        threads = [threading.Thread(target=loop) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        sys.setswitchinterval(interval)
    assert errors == []
    assert len(seen_open) == 4000 and not any(seen_open)
    assert process_state.snapshot()[process_state._DUAL] is False
