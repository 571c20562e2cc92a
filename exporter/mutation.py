"""What is mutation: the ops that write an argument (declared in their schemas, or hidden: running
stats), their functional variants, and whether a program has any; functionalization removes them."""

from __future__ import annotations

import torch
import torch.fx

from .graph_walk import iter_graphs
from .ops import op_name

__all__ = ["HIDDEN_MUTATION", "functional_variant", "is_mutating", "may_mutate", "returns_alias",
           "updates_hidden_state", "written_args"]

# Ops whose schemas do not declare that they update an argument, but do (running stats).
HIDDEN_MUTATION = {
    "aten::batch_norm.default", "aten::_batch_norm_impl_index.default", "aten::instance_norm.default",
    "aten::native_batch_norm.default", "aten::_native_batch_norm_legit.default",
    "aten::cudnn_batch_norm.default", "aten::miopen_batch_norm.default",
}


def is_mutating(op) -> bool:
    """In-place, out= and other ops that write an argument: functionalization removes them."""
    return isinstance(op, torch._ops.OpOverload) and any(
        a.alias_info is not None and a.alias_info.is_write for a in op._schema.arguments)


def written_args(node) -> list:
    """The nodes a call writes in place: its arguments that its op's schema declares written (one node
    each; a written list of tensors is not followed)."""
    if node.op != "call_function" or not is_mutating(node.target):
        return []
    values = [node.args[i] if i < len(node.args) else node.kwargs.get(a.name)
              for i, a in enumerate(node.target._schema.arguments) if a.alias_info is not None and a.alias_info.is_write]
    return [v for v in values if isinstance(v, torch.fx.Node)]


def functional_variant(op):
    """The functional op that replaces the in-place op ``op`` (aten.add.Tensor for aten.add_.Tensor), or
    None: ``op`` is an aten op writing only its first argument, which it returns, named ``base_`` (no
    leading underscore); the variant is the overload of ``base`` of the same name, else (floor_divide_.Tensor
    -> floor_divide.default) the default one, taking exactly ``op``'s arguments (names and types) and
    neither taking nor returning an alias. So ``variant(*args, **kwargs)`` computes, into a new tensor,
    what ``op(*args, **kwargs)`` writes: the node-local lowering (lowering/engines/local.py) puts it in
    a write's place, eager mode (lowering/eager.py) runs it and copies the result into the written tensor."""
    schema = op._schema
    written = [i for i, a in enumerate(schema.arguments) if a.alias_info is not None and a.alias_info.is_write]
    if written != [0] or len(schema.returns) != 1 or schema.name.split("::")[0] != "aten":
        return None
    base = op._overloadpacket.__name__
    if not base.endswith("_") or base.startswith("_"):
        return None
    packet = getattr(torch.ops.aten, base[:-1], None)
    if packet is None:
        return None
    for name in dict.fromkeys((op._overloadname, "default")):
        overload = getattr(packet, name, None)
        if isinstance(overload, torch._ops.OpOverload) and \
                [(a.name, str(a.type)) for a in overload._schema.arguments] == \
                [(a.name, str(a.type)) for a in schema.arguments] and \
                not any(a.alias_info is not None for a in overload._schema.arguments) and \
                not any(r.alias_info is not None for r in overload._schema.returns):
            return overload
    return None


def updates_hidden_state(node) -> bool:
    """A call whose schema declares no write but that updates running stats in place (HIDDEN_MUTATION)."""
    return op_name(node.target) in HIDDEN_MUTATION and _updates_running_stats(node)


def may_mutate(ep) -> bool:
    """True when functionalization has work to do on ``ep``."""
    for graph in iter_graphs(ep.graph_module):
        for node in graph.nodes:
            if node.op == "call_function" and isinstance(node.target, torch._ops.OpOverload) and (
                    is_mutating(node.target) or updates_hidden_state(node)):
                return True
    return False


def _updates_running_stats(node) -> bool:
    """A batch/instance norm node updates its running stats unless its training (use_input_stats)
    flag is literally False (eval mode), or it has no running stats."""
    names = [a.name for a in node.target._schema.arguments]

    def arg(name):
        if name not in names:
            return None
        i = names.index(name)
        return node.args[i] if i < len(node.args) else node.kwargs.get(name)

    flag = arg("training") if "training" in names else arg("use_input_stats")
    return flag is not False and not (arg("running_mean") is None and arg("running_var") is None)


def returns_alias(op) -> bool:
    """Whether an op's schema returns a view of an input (reshape, contiguous, flatten: what their
    decompositions give depends on the strides they see)."""
    return any(r.alias_info is not None for r in op._schema.returns)
