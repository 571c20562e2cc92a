"""What happens to a run's flat outputs: buffer/parameter mutations written back to the runtime's
state, user-input mutations copied into the caller's tensors, user outputs unflattened with out_spec."""

from __future__ import annotations

import torch
from torch.export.graph_signature import OutputKind

from exporter._torch.pytree import pytree
from exporter.errors import LoweringError

__all__ = ["OutputHandler"]

_STATE_MUTATIONS = (OutputKind.BUFFER_MUTATION, OutputKind.PARAMETER_MUTATION)
_USER = (OutputKind.USER_OUTPUT, OutputKind.LOSS_OUTPUT)
_UNSUPPORTED = (OutputKind.GRADIENT_TO_PARAMETER, OutputKind.GRADIENT_TO_USER_INPUT)


class OutputHandler:
    """Splits the graph's flat outputs by their output spec kind and applies each."""

    def __init__(self, ep: torch.export.ExportedProgram, state_by_name: dict, user_inputs: list[str]):
        specs = ep.graph_signature.output_specs
        bad = [s.arg.name for s in specs if s.kind in _UNSUPPORTED]
        if bad:
            raise LoweringError(f"the program returns gradients ({', '.join(bad)}): joint training graphs are "
                                "not supported by the reference runtime; export an inference program")
        leaf_of = {name: i for i, name in enumerate(user_inputs)}
        self.state_updates = [(i, state_by_name[s.target]) for i, s in enumerate(specs) if s.kind in _STATE_MUTATIONS]
        self.input_updates = [(i, leaf_of[s.target]) for i, s in enumerate(specs)
                              if s.kind == OutputKind.USER_INPUT_MUTATION]
        self.user = [i for i, s in enumerate(specs) if s.kind in _USER]
        self.out_spec = ep.call_spec.out_spec
        self._contiguous_tail = self.user == list(range(len(specs) - len(self.user), len(specs)))
        self._leaf = self.out_spec.is_leaf()
        self._flat_tuple = (self.out_spec.type is tuple
                            and all(c.is_leaf() for c in self.out_spec.children()))

    def __call__(self, outs, leaves):
        """Apply mutations (in place) and return the user outputs in the caller's structure."""
        for i, target in self.state_updates:
            target.copy_(outs[i])
        for i, leaf in self.input_updates:
            leaves[leaf].copy_(outs[i])
        user = outs[len(outs) - len(self.user):] if self._contiguous_tail else [outs[i] for i in self.user]
        if self._leaf:
            return user[0]
        if self._flat_tuple:
            return tuple(user)
        return pytree.tree_unflatten(list(user), self.out_spec)
