"""The state a program writes, handed over explicitly: ``lift(ep, names)`` makes those buffers extra inputs
and their new values extra outputs, and ``State`` carries them from call to call (``Compiled.state``)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping

import torch
from torch.export.exported_program import ModuleCallEntry, ModuleCallSignature
from torch.export.graph_signature import (ExportGraphSignature, InputKind, InputSpec, OutputKind, OutputSpec,
                                          TensorArgument)

from .._torch.pytree import pytree
from ..errors import BackendStateError
from .program_copy import graph_copy

__all__ = ["Carry", "State", "WriteBack", "buffer_value", "lift", "lift_input_writes", "state_keyword", "written_buffers"]


def written_buffers(ep: torch.export.ExportedProgram) -> list[str]:
    """The buffers ``ep`` writes, by qualified name, in the order its outputs write them."""
    return [s.target for s in ep.graph_signature.output_specs if s.kind == OutputKind.BUFFER_MUTATION]


def buffer_value(ep: torch.export.ExportedProgram, name: str) -> torch.Tensor:
    """The program's own value of buffer ``name`` (a persistent one in its state_dict, else in its constants)."""
    return ep.state_dict[name] if name in ep.state_dict else ep.constants[name]


def lift(ep: torch.export.ExportedProgram, names: list[str]) -> torch.export.ExportedProgram:
    """``ep`` with the buffers ``names`` (every buffer it writes among them) taken as one extra input after
    the user's own, a dict by qualified name passed as the keyword ``state_keyword(ep)`` ("state"), and
    the new values of those it writes returned as one extra output after the user's own, a dict
    likewise: ``lifted.module()(*args, **kwargs, state=state)`` returns ``(outputs, new_state)``. The
    graph's ops are the same; the placeholders of those buffers become user inputs, their writes user
    outputs, and the program holds them no more."""
    sig = ep.graph_signature
    written = written_buffers(ep)
    buffers = {s.target: s for s in sig.input_specs if s.kind == InputKind.BUFFER}
    missing = [n for n in names if n not in buffers]
    if missing or not set(written) <= set(names):
        raise ValueError(f"lift: {missing or sorted(set(written) - set(names))} are not buffers the names cover")
    gm = graph_copy(ep)
    graph = gm.graph
    placeholders = {n.name: n for n in graph.nodes if n.op == "placeholder"}
    moved = {buffers[n].arg.name for n in names}
    last = [n for n in graph.nodes if n.op == "placeholder"][-1]
    for name in names:  # the state's placeholders after every other, in the order of names
        node = placeholders[buffers[name].arg.name]
        if node is not last:
            last.append(node)
            last = node
    input_specs = [s for s in sig.input_specs if not (s.kind == InputKind.BUFFER and s.arg.name in moved)] + [
        InputSpec(InputKind.USER_INPUT, TensorArgument(buffers[n].arg.name), None) for n in names]

    output = graph.output_node()
    values = list(output.args[0])
    writes = {s.target: (s, v) for s, v in zip(sig.output_specs, values)
              if s.kind == OutputKind.BUFFER_MUTATION}
    kept = [(s, v) for s, v in zip(sig.output_specs, values)
            if not (s.kind == OutputKind.BUFFER_MUTATION and s.target in writes)]
    lifted_out = [(OutputSpec(OutputKind.USER_OUTPUT, TensorArgument(writes[n][0].arg.name), None), writes[n][1])
                  for n in names if n in writes]
    output.args = (tuple(v for _, v in kept + lifted_out),)
    gm.recompile()
    output_specs = [s for s, _ in kept + lifted_out]

    state_spec = pytree.treespec_dict({n: pytree.treespec_leaf() for n in names})
    written_spec = pytree.treespec_dict({n: pytree.treespec_leaf() for n in names if n in writes})
    in_spec, out_spec = ep.call_spec.in_spec, ep.call_spec.out_spec
    args_spec, kwargs_spec = in_spec.children()
    key = state_keyword(ep)  # the state comes last in the flat inputs, as its placeholders do: a keyword
    new_in = pytree.treespec_tuple([args_spec, pytree.treespec_dict(
        {**dict(zip(kwargs_spec.context, kwargs_spec.children())), key: state_spec})])
    new_out = pytree.treespec_tuple([out_spec, written_spec])
    calls = []
    for entry in ep.module_call_graph:
        if entry.fqn == "" and entry.signature is not None:
            s = entry.signature
            # the root's argument lists stay as torch leaves them (it names the graph's values only for the
            # submodules it keeps, and a pass that renames nodes, as to_edge's do, leaves them stale)
            entry = ModuleCallEntry("", ModuleCallSignature(
                s.inputs, s.outputs, new_in, new_out, None if s.forward_arg_names is None else [*s.forward_arg_names, key]))
        calls.append(entry)

    example = None
    if ep.example_inputs is not None:
        args, kwargs = ep.example_inputs
        example = (args, {**kwargs, key: {n: buffer_value(ep, n) for n in names}})
    return torch.export.ExportedProgram(
        root=gm, graph=gm.graph, graph_signature=ExportGraphSignature(input_specs, output_specs),
        state_dict={k: v for k, v in ep.state_dict.items() if k not in names},
        range_constraints=ep.range_constraints, module_call_graph=calls, example_inputs=example,
        constants={k: v for k, v in ep.constants.items() if k not in names}, verifiers=ep.verifiers)


def lifted_ports(ep: torch.export.ExportedProgram, names: list[str]) -> tuple[dict, dict, list, list] | None:
    """Where lift put the state of ``ep`` (lifted with ``names``): (buffer -> the user input it comes in
    as, written buffer -> the user output its new value leaves as, the user inputs' names, the user
    outputs' names), or None where ``ep``'s inputs and outputs cannot hold them (not lift's layout)."""
    user_in = [s.arg.name for s in ep.graph_signature.input_specs if s.kind == InputKind.USER_INPUT]
    user_out = [s.arg.name for s in ep.graph_signature.output_specs if s.kind == OutputKind.USER_OUTPUT]
    written = list(ep.call_spec.out_spec.children()[1].context)  # lift's: (outputs, {written buffer: new value})
    if len(names) > len(user_in) or len(written) > len(user_out):
        return None
    fed = dict(zip(names, user_in[len(user_in) - len(names):]))
    new = dict(zip(written, user_out[len(user_out) - len(written):]))
    return fed, new, user_in, user_out


def state_keyword(ep: torch.export.ExportedProgram) -> str:
    """The keyword the lifted ``ep`` takes its state by: ``state``, unless the program has an argument of
    that name."""
    signature = ep.module_call_graph[0].signature if ep.module_call_graph else None
    names = set(getattr(signature, "forward_arg_names", None) or ()) | set(ep.call_spec.in_spec.child(1).context)
    return next(n for n in ("state", "lifted_state", "pt2b_lifted_state") if n not in names)


class State(Mapping):
    """The buffers a handed-over program writes, by qualified name, as they stand after the last call
    (a read-only mapping: each method's calls write it; ``reset()`` puts back the program's own values).
    The methods of one artifact handed over together hold one ``State``, as runtime_ref's do.

    Some of the values may live in a backend's runtime instead (``hold``: OpenVINO's stateful form
    keeps a KV cache in its infer request's variables, so no call copies it in or out). A State has at
    most one such holder; reading a held value, storing into it or snapshotting pulls the holder's
    values back (the holder then holds nothing until ``hold`` again), so a reader always sees the
    newest values, and a tensor read before later calls is stale until read again."""

    def __init__(self) -> None:
        self._values: dict[str, torch.Tensor] = {}
        self._initial: dict[str, torch.Tensor] = {}  # the program's own tensors, never written
        self._holder = None  # the backend runtime holding the newest values of its ``names`` (None: none)

    def take(self, ep: torch.export.ExportedProgram, names: list[str], backend: str) -> None:
        """Hold ``names`` of ``ep``: a copy of the program's values (never its own tensors: a loaded
        artifact's are its mapped file) where the State does not hold them yet."""
        for name in names:
            value = buffer_value(ep, name)
            held = self._values.get(name)
            if held is None:
                self._initial[name] = value
                self._values[name] = value.detach().clone()
            elif held.shape != value.shape or held.dtype != value.dtype:
                raise BackendStateError(
                    f"the state handed to {backend} holds {name!r} as {tuple(held.shape)} {held.dtype}, and this "
                    f"program's buffer is {tuple(value.shape)} {value.dtype}: share state only between the "
                    f"methods of one artifact (to_backend_methods).")

    def hold(self, holder) -> None:
        """Let ``holder`` (a backend runtime) hold the values of ``holder.names`` from now on: they are
        pushed into it (``holder.push(values)``) unless it holds them already, after the values of the
        holder before it are pulled back. ``holder.pull()`` returns its values by name. A method switch
        moves the state once; calls through the same holder move nothing."""
        if self._holder is holder:
            return
        self._settle()
        holder.push({name: self._values[name] for name in holder.names})
        self._holder = holder

    def _settle(self, names=None) -> None:
        """The holder's values pulled back into this State's tensors where it holds any of ``names``
        (None: any), the holder released."""
        holder = self._holder
        if holder is None or (names is not None and not holder.names.intersection(names)):
            return
        self._holder = None
        self._put(holder.pull())

    def store(self, new: dict) -> None:
        """The values a call returned: written into the held tensors where dtype and shape stay."""
        self._settle(new)
        self._put(new)

    def _put(self, new: dict) -> None:
        for name, value in new.items():
            held = self._values[name]
            if isinstance(value, torch.Tensor) and value.shape == held.shape and value.dtype == held.dtype:
                if value is not held:
                    held.copy_(value)
            else:  # (a program whose buffer changes its size: the new tensor is held, never the program's own)
                self._values[name] = value.clone() if value is self._initial.get(name) else value

    def reset(self) -> None:
        """Every buffer back to the program's own value (a new sequence starts from an empty cache)."""
        self._holder = None  # (what it holds is overwritten: nothing to pull)
        self._put(self._initial)

    def initial(self, name: str) -> torch.Tensor:
        """The program's own value of ``name``, what ``reset()`` puts back (never to be written)."""
        return self._initial[name]

    def snapshot(self) -> dict[str, torch.Tensor]:
        """A copy of every held value, for ``store`` to put back."""
        self._settle()
        return {name: value.clone() for name, value in self._values.items()}

    def __getitem__(self, name: str) -> torch.Tensor:
        self._settle((name,))
        return self._values[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)

    def __repr__(self) -> str:
        return f"State({', '.join(f'{n}: {tuple(v.shape)}' for n, v in self._values.items())})"


class Carry:
    """What a ``Compiled`` of a lifted program needs to call it: the State and the names it passes."""

    def __init__(self, state: State, names: list[str], keyword: str):
        self.state, self.names, self.keyword = state, names, keyword

    def call(self, run, args: tuple, kwargs: dict, holder=None):
        """``run(args, kwargs)`` (the backend's run of the lifted program) with the state passed after the
        user's arguments; its new values stored, the user's outputs returned. ``holder``: the backend's
        runtime holds ``holder.names`` between calls (State.hold); their entries are passed unread (the
        run drops them) and their new values, which the run does not return, are not stored."""
        held = holder.names if holder is not None else frozenset()
        if holder is not None:
            self.state.hold(holder)
        self.state._settle(set(self.names) - held)  # (a value another method's holder holds: pulled back first)
        values = self.state._values  # (read raw: a held value would be pulled back from the holder)
        out, new = run(args, {**kwargs, self.keyword: {n: values[n] for n in self.names}})
        self.state.store({n: v for n, v in new.items() if n not in held})
        return out


def lift_input_writes(ep: torch.export.ExportedProgram) -> tuple:
    """(the program to hand over, its WriteBack or None): where ``ep`` writes its user inputs in place,
    ``ep`` with those writes returned as one extra output after the user's own (a tuple, in the order of
    the flat inputs written), which no backend can drop: a backend takes a graph's outputs, and a
    write into an input it copies in is lost (ONNX Runtime, OpenVINO and TVM compute it and never make
    it). The WriteBack makes the writes into the caller's tensors after each call."""
    sig = ep.graph_signature
    writes = [(i, s) for i, s in enumerate(sig.output_specs) if s.kind == OutputKind.USER_INPUT_MUTATION]
    if not writes:
        return ep, None
    user = [s.arg.name for s in sig.input_specs if s.kind == InputKind.USER_INPUT]
    flat_index = [user.index(s.target) for _, s in writes]
    gm = graph_copy(ep)
    output = gm.graph.output_node()
    values = list(output.args[0])
    at = {i for i, _ in writes}
    kept = [(s, v) for i, (s, v) in enumerate(zip(sig.output_specs, values)) if i not in at]
    moved = [(OutputSpec(OutputKind.USER_OUTPUT, s.arg, None), values[i]) for i, s in writes]
    output.args = (tuple(v for _, v in kept + moved),)
    gm.recompile()
    out_spec = pytree.treespec_tuple([ep.call_spec.out_spec,
                                      pytree.treespec_tuple([pytree.treespec_leaf() for _ in writes])])
    calls = []
    for entry in ep.module_call_graph:
        if entry.fqn == "" and entry.signature is not None:
            s = entry.signature
            entry = ModuleCallEntry("", ModuleCallSignature(s.inputs, s.outputs, s.in_spec, out_spec,
                                                            s.forward_arg_names))  # (its lists as lift's)
        calls.append(entry)
    lifted = torch.export.ExportedProgram(
        root=gm, graph=gm.graph, graph_signature=ExportGraphSignature(list(sig.input_specs), [s for s, _ in kept + moved]),
        state_dict=ep.state_dict, range_constraints=ep.range_constraints, module_call_graph=calls,
        example_inputs=ep.example_inputs, constants=ep.constants, verifiers=ep.verifiers)
    return lifted, WriteBack(ep.call_spec.in_spec, flat_index)


class WriteBack:
    """What a ``Compiled`` of a program whose input writes were lifted (lift_input_writes) does after
    each call: each new value copied into the caller's tensor it was written into."""

    def __init__(self, in_spec, flat_index: list[int]):
        self.in_spec, self.flat_index = in_spec, flat_index

    def call(self, run, args: tuple, kwargs: dict):
        """``run(args, kwargs)`` (returning the outputs and the new values), the writes made; the outputs."""
        from .._torch.pytree import fx_pytree

        out, new = run(args, kwargs)
        leaves = fx_pytree.tree_flatten_spec((args, kwargs), self.in_spec)
        with torch.no_grad():
            for i, value in zip(self.flat_index, new):
                target = leaves[i]
                if value is not target:
                    target.copy_(value)
        return out
