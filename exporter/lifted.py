"""Running a program's lifted graph module directly: its graph inputs bound from the signature (the
user's inputs, then the program's own parameters, buffers and constants) and its outputs split into the
user's and the state the program writes back. ``ep.module()`` gets there by unlifting the state into a
new module (a copy of the graph, recompiled several times), a large share of its first call's cost
after load ([architecture.md](../docs/architecture.md#call-progargs-kwargs))."""

from __future__ import annotations

import torch
from torch.export.graph_signature import InputKind, OutputKind

from ._torch.pytree import pytree

_WRITES = (OutputKind.BUFFER_MUTATION, OutputKind.USER_INPUT_MUTATION, OutputKind.PARAMETER_MUTATION)


class Unbindable(Exception):
    """The signature holds what a direct run cannot bind (tokens, script objects, no call spec)."""


class Binding:
    """A program's graph inputs in order, each ``(kind, placeholder name, value)``: a USER_INPUT has
    value None (the call's flat input, in order); the state's value is the program's own tensor.
    ``writes``: (output index, graph input index) of every output the program writes back into an
    input (buffer, parameter or user input mutations); ``user_outputs``: the indices of the user's
    outputs; ``other_outputs``: whether the signature names outputs of any other kind."""

    def __init__(self, ep):
        sig = ep.graph_signature
        if ep.call_spec.in_spec is None:
            raise Unbindable("no input spec")
        self.ep, self.inputs = ep, []
        state, users = {}, {}  # FQN -> graph input index; user input name -> graph input index
        for spec in sig.input_specs:
            name = spec.arg.name
            if spec.kind == InputKind.USER_INPUT:
                value = None
            elif spec.kind == InputKind.PARAMETER:
                value = ep.state_dict[spec.target]
            elif spec.kind == InputKind.BUFFER:
                value = (ep.state_dict if spec.persistent else ep.constants)[spec.target]
            elif spec.kind == InputKind.CONSTANT_TENSOR and isinstance(ep.constants.get(spec.target), torch.Tensor):
                value = ep.constants[spec.target]
            else:
                raise Unbindable(f"input {name!r} of kind {spec.kind.name}")
            (users if value is None else state)[name if value is None else spec.target] = len(self.inputs)
            self.inputs.append((spec.kind, name, value))
        self.writes, self.user_outputs, self.other_outputs = [], [], False
        for i, spec in enumerate(sig.output_specs):
            # a user input mutation names the input's placeholder; a buffer or parameter one, the state's
            # path (a buffer may share its name with an input)
            into = users if spec.kind == OutputKind.USER_INPUT_MUTATION else state
            if spec.kind == OutputKind.USER_OUTPUT:
                self.user_outputs.append(i)
            elif spec.kind in _WRITES and spec.target in into:
                self.writes.append((i, into[spec.target]))
            else:
                self.other_outputs = True

    def bind(self, flat: list) -> list:
        """The graph's inputs for a call whose flat user inputs are ``flat``: those in order, the
        program's own state between them."""
        users = iter(flat)
        return [next(users) if value is None else value for _, _, value in self.inputs]


def finite_int(v) -> int | None:
    """``v`` (a range bound: int, sympy integer or infinity) as an int; None when unbounded."""
    try:
        return int(v)
    except Exception:  # noqa: BLE001 -- sympy's and torch's infinities refuse int() in several ways
        return None


class DirectCall:
    """The program called like ``ep.module()`` is, without building it, for a program whose inputs are
    all tensors, each dim a number or a dynamic dim of its own (a symbol with a recorded range), and
    that records no guards: a call whose inputs match the program's (structure, dtypes, devices, each
    static dim, each dynamic dim within its range and the same wherever its symbol recurs) runs the
    lifted graph and writes the mutated state back as the unlifted module's copy_ nodes would; any
    other call returns NotImplemented, and the caller goes through ``ep.module()``, whose guards decide
    (and name) what is wrong."""

    def __init__(self, ep):
        self.binding = b = Binding(ep)
        if b.other_outputs or getattr(ep, "_guards_code", None) or ep.call_spec.out_spec is None:
            raise Unbindable("outputs or guards a direct call does not reproduce")
        placeholders = {n.name: n for n in ep.graph.nodes if n.op == "placeholder"}
        self.expected = []  # per user input: (dims, dtype, device); a dim: int, or (symbol, lowest, highest)
        for kind, name, _ in b.inputs:
            if kind != InputKind.USER_INPUT:
                continue
            val = placeholders[name].meta.get("val") if name in placeholders else None
            if not isinstance(val, torch.Tensor):
                raise Unbindable(f"input {name!r} is not a tensor")
            dims = []
            for size in val.shape:
                if isinstance(size, int):
                    dims.append(size)
                    continue
                expr = size.node.expr
                if not expr.is_Symbol or expr not in ep.range_constraints:
                    raise Unbindable(f"input {name!r} has a dim {expr} that is not a dynamic dim of its own")
                vr = ep.range_constraints[expr]
                dims.append((expr, finite_int(vr.lower), finite_int(vr.upper)))
            self.expected.append((tuple(dims), val.dtype, val.device))
        self.gm, self.in_spec, self.out_spec = ep.graph_module, ep.call_spec.in_spec, ep.call_spec.out_spec

    def _matches(self, flat: list) -> bool:
        sizes = {}
        for x, (dims, dtype, device) in zip(flat, self.expected):
            if not isinstance(x, torch.Tensor) or x.dtype != dtype or x.device != device or x.dim() != len(dims):
                return False
            for n, d in zip(x.shape, dims):
                if type(d) is int:
                    if n != d:
                        return False
                    continue
                sym, lo, hi = d
                if sizes.setdefault(sym, n) != n or (lo is not None and n < lo) or (hi is not None and n > hi):
                    return False
        return True

    def __call__(self, args: tuple, kwargs: dict):
        flat, spec = pytree.tree_flatten((args, kwargs))
        if spec != self.in_spec or len(flat) != len(self.expected) or not self._matches(flat):
            return NotImplemented
        inputs = self.binding.bind(flat)
        out = self.gm(*inputs)
        out = out if isinstance(out, (list, tuple)) else [out]
        for i, at in self.binding.writes:
            if out[i] is not inputs[at]:  # an in-place write into the input already landed there
                inputs[at].copy_(out[i])
        return pytree.tree_unflatten([out[i] for i in self.binding.user_outputs], self.out_spec)
