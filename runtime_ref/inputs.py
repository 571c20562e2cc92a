"""Call-time input handling: flatten (args, kwargs) with the program's in_spec and check every user
input against its placeholder's recorded value (kind, dtype, device, rank, static and symbolic dims)."""

from __future__ import annotations

import torch

from exporter._torch.pytree import pytree
from exporter.errors import RuntimeInputError

from .shapes import SymbolTable, make_leaf_check

__all__ = ["InputChecker", "leaf_names", "positional_names"]


def positional_names(in_spec, forward_names: list[str]) -> list[str]:
    """Names of the positional arguments ('args[i]' where the program did not record one)."""
    n = in_spec.children()[0].num_children
    return [forward_names[i] if i < len(forward_names) else f"args[{i}]" for i in range(n)]


def leaf_names(in_spec, forward_names: list[str]) -> list[str]:
    """Readable pytree paths of the flat inputs: 'x', "inputs['a'][1]", 'scale' (a kwarg)."""
    dummy = pytree.tree_unflatten(list(range(in_spec.num_leaves)), in_spec)
    positional = positional_names(in_spec, forward_names)
    names = []
    for path, _ in pytree.tree_flatten_with_path(dummy)[0]:
        key = path[1]
        head = str(key.key) if isinstance(key, pytree.MappingKey) else positional[key.idx]
        names.append(head + pytree.keystr(path[2:]))
    return names


def _node_children(value):
    """(type, context, children) of a pytree node, or None for a leaf."""
    if pytree.tree_is_leaf(value):
        return None
    handler = pytree.SUPPORTED_NODES[pytree._get_node_type(value)]
    children, context = handler.flatten_fn(value)
    return pytree._get_node_type(value), context, list(children)


def _describe_spec(spec) -> str:
    if spec.is_leaf():
        return "a leaf"
    name = getattr(spec.type, "__name__", str(spec.type))
    if spec.type is dict:
        return f"a dict with keys {list(spec.context)}"
    return f"a {name} of {spec.num_children} item(s)"


def _structure_diff(spec, value, path: str) -> str | None:
    """Where `value` first departs from `spec`, in words, or None if it matches."""
    if spec.is_leaf():
        return None
    node = _node_children(value)
    if node is None or node[0] is not spec.type or node[1] != spec.context or len(node[2]) != spec.num_children:
        got = type(value).__name__ if node is None else f"{type(value).__name__} of {len(node[2])} item(s)"
        if isinstance(value, dict):
            got = f"a dict with keys {list(value)}"
        return f"{path}: expected {_describe_spec(spec)}, got {got}"
    for i, (child_spec, child) in enumerate(zip(spec.children(), node[2])):
        key = repr(spec.context[i]) if spec.type is dict else str(i)
        diff = _structure_diff(child_spec, child, f"{path}[{key}]")
        if diff:
            return diff
    return None


class InputChecker:
    """Flattens a call's (args, kwargs) to the program's user inputs and checks each of them."""

    def __init__(self, ep: torch.export.ExportedProgram, device: torch.device, dim_names: dict | None = None):
        self.in_spec = ep.call_spec.in_spec
        sig = ep.module_call_graph[0].signature if ep.module_call_graph else None
        forward_names = list(getattr(sig, "forward_arg_names", None) or [])
        self.names = leaf_names(self.in_spec, forward_names)
        self.positional = positional_names(self.in_spec, forward_names)
        args_spec, kwargs_spec = self.in_spec.children()
        self.n_positional = args_spec.num_children
        self.kw_keys = list(kwargs_spec.context)
        self.n = self.in_spec.num_leaves
        self._fast = not self.kw_keys and all(c.is_leaf() for c in args_spec.children())
        placeholders = {n.name: n for n in ep.graph.nodes if n.op == "placeholder"}
        metas = [placeholders[n.arg.name].meta if getattr(n.arg, "name", None) in placeholders else {}
                 for n in ep.graph_signature.input_specs if n.kind.name == "USER_INPUT"]
        self.symbols = SymbolTable(ep.range_constraints, dim_names)
        self._checks = [make_leaf_check(name, meta, device, self.symbols) for name, meta in zip(self.names, metas)]
        self._symbolic = any(c.symbolic for c in self._checks)

    def __call__(self, args: tuple, kwargs: dict):
        """The checked flat user inputs of one call."""
        leaves = self.flatten(args, kwargs)
        self.check(leaves)
        return leaves

    def flatten(self, args: tuple, kwargs: dict):
        if self._fast and not kwargs and len(args) == self.n:
            return args
        if kwargs and list(kwargs) != self.kw_keys and set(kwargs) == set(self.kw_keys):
            kwargs = {k: kwargs[k] for k in self.kw_keys}  # the recorded keyword order
        leaves, spec = pytree.tree_flatten((args, kwargs))
        if spec != self.in_spec:
            raise RuntimeInputError(self._mismatch(args, kwargs))
        return leaves

    def _mismatch(self, args, kwargs) -> str:
        expected = f"{self.n_positional} positional argument(s) ({', '.join(self.positional)})"
        if self.kw_keys:
            expected += f" and keyword argument(s) {self.kw_keys}"
        got = f"{len(args)} positional and keyword argument(s) {list(kwargs)}"
        head = f"inputs do not match the program's signature: expected {expected}; got {got}"
        missing = [k for k in self.kw_keys if k not in kwargs]
        unexpected = [k for k in kwargs if k not in self.kw_keys]
        if missing or unexpected:
            head += f" (missing {missing}, unexpected {unexpected})"
        if len(args) == self.n_positional and set(kwargs) == set(self.kw_keys):
            args_spec, kwargs_spec = self.in_spec.children()
            pairs = [*zip(self.positional, args_spec.children(), args),
                     *((k, s, kwargs[k]) for k, s in zip(self.kw_keys, kwargs_spec.children()))]
            for name, spec, value in pairs:
                detail = _structure_diff(spec, value, name)
                if detail:
                    return f"{head}\n  first difference: {detail}"
        return head

    def check(self, leaves) -> None:
        if not self._symbolic:
            for check, x in zip(self._checks, leaves):
                check(x, None)
            return
        env: dict = {}
        for check, x in zip(self._checks, leaves):
            check(x, env)
        self.symbols.check_derived(env)
