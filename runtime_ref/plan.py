"""Execution plan of one graph: slots for every value, a flat list of steps in topological order
(callable with kwargs baked in, argument fetcher, output slot, slots to free) and the loop that runs them."""

from __future__ import annotations

import dataclasses
import functools

import torch
import torch.fx

from exporter._torch.dispatch import OpOverload
from exporter.shared import autocast_steps, is_autocast_marker, subgraph_of

from .bindings import fast_callable, meta_args
from .codegen import compile_steps
from .getters import SlotRef, call_with_kwargs, has_slot, slots_getter, value_getter
from .graphs import moved_call, moves_autocast, reads_cpu_scalars, retarget_devices, with_device_scalars
from .nodes import NODES
from .inplace import plan_in_place
from .nested import leaves, map_leaves
from .regions import recorded_device_types, region_callable, retarget_autocast

__all__ = ["Plan"]


@dataclasses.dataclass
class _Builder:
    """Mutable state while planning: slot numbering, constant slot values, steps and readers."""

    device: torch.device
    n_user: int
    recorded: frozenset = frozenset()  # device types the program's tensors were recorded on
    other_device: bool = False  # the runtime's device type is not among them (graphs.moved_call)
    autocast_moved: bool = False  # an autocast region recorded for one of them runs for the runtime's
    constants: list = dataclasses.field(default_factory=list)  # values of slots n_user, n_user+1, ...
    slot_of: dict = dataclasses.field(default_factory=dict)  # fx.Node -> slot
    node_slots: set = dataclasses.field(default_factory=set)  # slots whose values can be freed
    steps: list = dataclasses.field(default_factory=list)  # (node, fn, args, kwargs templates, out, reads)
    bindings: dict = dataclasses.field(default_factory=dict)  # fast_callable's cache

    def const_slot(self, value) -> SlotRef:
        self.constants.append(value)
        return SlotRef(self.n_user + len(self.constants) - 1)

    def value_slot(self, node) -> int:
        slot = self.const_slot(None)
        self.slot_of[node] = slot
        self.node_slots.add(int(slot))
        return int(slot)

    def template(self, arg):
        """An fx argument with nodes replaced by SlotRefs and devices by the runtime's device."""
        return map_leaves(self._leaf, arg)

    def _leaf(self, arg):
        if isinstance(arg, NODES):
            return SlotRef(self.slot_of[arg])
        if isinstance(arg, torch.device):
            return self.device
        if isinstance(arg, torch.Tensor):
            return arg.detach().to(self.device)
        return arg


def _reads(template) -> set:
    """The slots a template reads."""
    return {int(t) for t in leaves(template) if type(t) is SlotRef}


def _callable(node, cache: dict, target=None):
    """The fastest equivalent callable for a node's target, or for ``target`` run in its place (see
    bindings.fast_callable); the runtime's own runner for a grad-mode/autocast region higher-order op
    (regions.py)."""
    target = node.target if target is None else target
    if isinstance(target, OpOverload) and type(target).__call__ is OpOverload.__call__:
        return fast_callable(target, meta_args(node), cache)
    return region_callable(target) or target


def _returns_nothing(target) -> bool:
    return isinstance(target, OpOverload) and len(target._schema.returns) == 0


class Plan:
    """A graph planned once; `run(leaves)` fills the user-input slots, runs the steps, returns outputs.

    `steps` is a list of plain tuples (fn, get, out, free) meaning `slots[out] = fn(*get(slots))`,
    then `slots[i] = None` for i in free (run_slots interprets them); `run` is the same steps compiled
    into one Python function with a local per slot and `del` at last use (codegen.py). Slots [0, n_user) hold
    the user inputs, then come constants and state (never freed), then one slot per node value.
    """

    def __init__(self, gm: torch.fx.GraphModule, user_inputs: list[str], state: dict, device: torch.device):
        recorded = recorded_device_types(gm)
        b = _Builder(device=device, n_user=len(user_inputs), recorded=recorded,
                     other_device=bool(recorded) and device.type not in recorded,
                     # (a region moves only when recorded for a device type other than the runtime's)
                     autocast_moved=bool(recorded - {device.type}) and moves_autocast(gm, device, recorded))
        index = {name: i for i, name in enumerate(user_inputs)}
        self._trash = int(b.const_slot(None))  # result of ops that return nothing
        outputs = None
        for node in gm.graph.nodes:
            if node.op == "placeholder":
                self._place(b, node, index, state)
            elif node.op == "get_attr":
                b.slot_of[node] = int(b.const_slot(self._attr(gm, node, device, b.recorded)))
            elif node.op == "call_function":
                self._add_step(b, node)
            elif node.op == "output":
                outputs = [b.template(a) for a in node.args[0]]
        self._finish(b, outputs)

    # ---- planning ----
    @staticmethod
    def _place(b: _Builder, node, index: dict, state: dict) -> None:
        if node.name in index:
            b.slot_of[node] = index[node.name]
            b.node_slots.add(index[node.name])
        else:
            b.slot_of[node] = int(b.const_slot(state[node.name]))

    @staticmethod
    def _attr(gm, node, device, recorded):
        sub = subgraph_of(gm, node)
        if sub is not None:
            return retarget_devices(sub, device, recorded)
        value = gm
        for part in str(node.target).split("."):
            value = getattr(value, part)
        return value.detach().to(device) if isinstance(value, torch.Tensor) else value

    def _add_step(self, b: _Builder, node) -> None:
        """Record the step; its callable is bound in _finish, once whether it runs in place is known."""
        target, args, kwargs = moved_call(node.target, tuple(node.args), dict(node.kwargs),
                                          other_device=b.other_device, autocast_moved=b.autocast_moved)
        args = b.template(args)
        if is_autocast_marker(target):
            args = retarget_autocast(args, b.recorded, b.device)
        kwargs = b.template(kwargs)
        out = self._trash if _returns_nothing(target) else b.value_slot(node)
        fn = _callable(node, b.bindings, target)
        if b.other_device and reads_cpu_scalars(node):
            fn = with_device_scalars(fn)
        b.steps.append((node, fn, args, kwargs, out, _reads((args, kwargs))))

    @staticmethod
    def _bind(b: _Builder, fn, args, kwargs):
        """(fn, args, kwargs) for codegen, and (fn, get) for run_slots, of one call."""
        if has_slot(kwargs):
            arg_f, kw_f = value_getter(args), value_getter(kwargs)
            return (fn, args, kwargs), call_with_kwargs(fn), (lambda s: (arg_f(s), kw_f(s)))
        fn = functools.partial(fn, **kwargs) if kwargs else fn
        if all(type(a) is SlotRef or not has_slot(a) for a in args):
            return (fn, args, {}), fn, slots_getter([a if type(a) is SlotRef else b.const_slot(a) for a in args])
        return (fn, args, {}), fn, value_getter(list(args))

    def _finish(self, b: _Builder, outputs: list) -> None:
        out_slots = [o if type(o) is SlotRef else b.const_slot(o) for o in outputs]
        outs, reads = [st[4] for st in b.steps], [st[5] for st in b.steps]
        last_use = self._last_uses(outs, reads, b.node_slots, {int(s) for s in out_slots})
        # a step whose first input dies there and is aliased by nothing alive writes into it (inplace.py)
        nodes = [st[0] for st in b.steps]
        # a moved autocast region's values may have other dtypes than recorded (graphs.py): no step writes
        # into a value whose dtype the recording no longer tells
        skip = set(range(len(nodes))) if b.autocast_moved else autocast_steps([n.target for n in nodes])
        in_place = plan_in_place(nodes, outs, reads, b.slot_of, b.n_user, last_use, skip=skip)
        free = [[] for _ in b.steps]
        for slot, k in last_use.items():
            free[k].append(slot)
        calls, self.steps = [], []
        for k, (_, fn, args, kwargs, out, _) in enumerate(b.steps):
            call, fn, get = self._bind(b, in_place.get(k, fn), args, kwargs)
            calls.append((*call, out, tuple(sorted(free[k]))))
            self.steps.append((fn, get, out, calls[-1][-1]))
        self.step_names = [st[0].name for st in b.steps]
        self.in_place_steps = [self.step_names[k] for k in sorted(in_place)]
        self.n_user = b.n_user
        self._rest = b.constants
        self.output_slots = [int(s) for s in out_slots]
        self._outputs = slots_getter(out_slots)
        self._node_slots = frozenset(b.node_slots)
        self.run = compile_steps(calls, b.n_user, b.constants, b.node_slots, self.output_slots, self._trash)

    @staticmethod
    def _last_uses(outs, reads, node_slots, kept) -> dict[int, int]:
        """slot -> index of the step after which it is dead (values read by the output stay)."""
        last: dict[int, int] = {}
        for k, (out, step_reads) in enumerate(zip(outs, reads)):
            if out in node_slots:
                last[out] = k  # dead at once unless read later
            for slot in step_reads:
                if slot in node_slots:
                    last[slot] = k
        return {s: k for s, k in last.items() if s not in kept}

    # ---- running ----
    # self.run(leaves) -> tuple of the graph's flat outputs: the steps compiled into one function
    # (codegen.py); run_slots is the same plan interpreted step by step over a list of slots.
    def run_slots(self, leaves) -> list:
        """Run all steps on the flat user inputs; return the graph's flat outputs."""
        slots = [*leaves, *self._rest]
        for fn, get, out, free in self.steps:
            slots[out] = fn(*get(slots))
            for i in free:
                slots[i] = None
        return self._outputs(slots)

    # ---- introspection (tests, debugging) ----
    def live_counts(self) -> list[int]:
        """Number of non-constant values alive (inputs and intermediates) after each step."""
        live = set(range(self.n_user)) & self._node_slots
        counts = []
        for _, _, out, free in self.steps:
            if out in self._node_slots:
                live.add(out)
            live.difference_update(free)
            counts.append(len(live))
        return counts
