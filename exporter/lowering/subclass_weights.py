"""A program whose weights are tensor subclasses, lowered over their plain inner tensors: torch's own
unwrapping (what run_decompositions does to them) before pt2b's lowering, so that the subclass's
arithmetic becomes ATen ops in the graph that a backend runs."""

from __future__ import annotations

from ..tensor_subclasses import is_subclass


def has_subclass_weights(ep) -> bool:
    return any(is_subclass(v) for v in (*ep.state_dict.values(), *ep.constants.values()))


def unwrapped(ep):
    """``ep`` with its tensor-subclass weights replaced by their inner tensors and the graph computing
    the subclass's arithmetic (torch's ``run_decompositions({})``: no decomposition, only the
    unwrapping and functionalization it always does). A program whose own inputs or outputs are
    subclasses stays as it is: torch's unwrapped program cannot return them, so its lowering keeps
    the weights as subclasses (the reference runs it; a backend refuses it at hand-off)."""
    if not has_subclass_weights(ep):
        return ep
    out = ep.run_decompositions({})
    # a subclass output comes back as its inner tensors (a loaded program's recorded values are plain
    # fake tensors, so the count is what tells)
    same = [len(p.graph_signature.user_inputs) for p in (ep, out)] + [len(p.graph_signature.user_outputs)
                                                                     for p in (ep, out)]
    return out if same[0] == same[1] and same[2] == same[3] else ep
