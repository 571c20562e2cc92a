"""The node where a backend starts computing a part wrong, found in one hand-off: the part handed over
returning every floating value it computes, each compared with the part's own run on the same inputs."""

from __future__ import annotations

import torch
import torch.fx

__all__ = ["first_wrong"]


def first_wrong(part: torch.fx.GraphModule, args: tuple, hand) -> str | None:
    """The name of the first op node of ``part`` (in its order) whose value the backend computes beyond
    its dtype's bound (lowering/verdicts.WRONG_REL) on ``args`` (the inputs a part handed over takes: the
    program's weights are its own); None where the probe cannot be traced, handed over or run, or finds
    every value right. The node found may only amplify an error from
    before it (within the bound there): the split hands it back where the part is right without it.
    ``hand(module)``: the split's hand-off of a module taking the part's inputs, (its Compiled, its
    program) or (None, why it was refused)."""
    from ..lowering.verdicts import WRONG_REL, relative_difference

    probe = torch.fx.GraphModule(part, part.graph.__deepcopy__())
    values = [n for n in probe.graph.nodes if n.op == "call_function" and isinstance(n.target, torch._ops.OpOverload)
              and isinstance(n.meta.get("val"), torch.Tensor) and n.meta["val"].is_floating_point()]
    if not values:
        return None
    probe.graph.output_node().args = (tuple(values),)
    probe.graph.eliminate_dead_code()
    probe.recompile()
    # (what the trace or the backend refuses, or its run fails on: the split cuts the part in two instead)
    compiled, program = hand(probe)
    if compiled is None:
        return None
    try:
        with torch.no_grad():
            got, want = compiled(*args), program.module()(*args)
    except Exception:  # noqa: BLE001
        return None
    for node, g, w in zip(values, got, want):
        if not isinstance(g, torch.Tensor) or g.shape != w.shape or g.dtype != w.dtype:
            return node.name
        if w.numel() and relative_difference(g, w) > WRONG_REL.get(w.dtype, WRONG_REL[torch.float32]):
            return node.name
    return None
