"""Call-time input handling: flatten (args, kwargs) with the program's in_spec and check every user
input against its placeholder's recorded value (kind, dtype, device, rank, static and symbolic dims)."""

from __future__ import annotations

import torch

from exporter._torch.pytree import pytree
from exporter.errors import RuntimeInputError
from exporter.shared.call_inputs import leaf_names, mismatch, positional_names

from .shapes import SymbolTable, make_leaf_check

__all__ = ["InputChecker", "leaf_names", "positional_names"]


class InputChecker:
    """Flattens a call's (args, kwargs) to the program's user inputs and checks each of them."""

    def __init__(self, ep: torch.export.ExportedProgram, device: torch.device, dim_names: dict | None = None):
        self.in_spec = ep.call_spec.in_spec
        sig = ep.module_call_graph[0].signature if ep.module_call_graph else None
        forward_names = list(getattr(sig, "forward_arg_names", None) or [])
        self.names = leaf_names(self.in_spec, forward_names)
        self.positional = positional_names(self.in_spec, forward_names)
        args_spec, kwargs_spec = self.in_spec.children()
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
            raise RuntimeInputError(mismatch(self.in_spec, self.positional, args, kwargs))
        return leaves

    def check(self, leaves) -> None:
        if not self._symbolic:
            for check, x in zip(self._checks, leaves):
                check(x, None)
            return
        env: dict = {}
        for check, x in zip(self._checks, leaves):
            check(x, env)
        self.symbols.check_derived(env)
