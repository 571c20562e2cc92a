"""The node where a backend starts computing a part wrong, found in one hand-off: the part handed over
returning every floating value it computes, each compared with the part's own run on the same inputs."""

from __future__ import annotations

import torch
import torch.fx

__all__ = ["first_wrong"]


def first_wrong(part: torch.fx.GraphModule, args: tuple, dynamic_shapes, hand_off, options: dict) -> str | None:
    """The name of the first op node of ``part`` (in its order) whose value the backend computes beyond
    its dtype's bound (lowering/verdicts.WRONG_REL) on ``args``; None where the probe cannot be traced,
    handed over or run, or finds every value right. The node found may only amplify an error from
    before it (within the bound there): the split hands it back where the part is right without it."""
    from ..lowering.verdicts import WRONG_REL, relative_difference

    probe = torch.fx.GraphModule(part, part.graph.__deepcopy__())
    values = [n for n in probe.graph.nodes if n.op == "call_function" and isinstance(n.target, torch._ops.OpOverload)
              and isinstance(n.meta.get("val"), torch.Tensor) and n.meta["val"].is_floating_point()]
    if not values:
        return None
    probe.graph.output_node().args = (tuple(values),)
    probe.graph.eliminate_dead_code()
    probe.recompile()
    plain = tuple(a.detach() if isinstance(a, torch.nn.Parameter) else a for a in args)
    # (whatever the trace, the backend or its run refuses: the split cuts the part in two instead)
    try:
        program = torch.export.export(probe, args, dynamic_shapes=dynamic_shapes, strict=False)
        compiled = hand_off(program, **options)
        with torch.no_grad():
            got, want = compiled(*plain), program.module()(*plain)
    except Exception:  # noqa: BLE001
        return None
    for node, g, w in zip(values, got, want):
        if not isinstance(g, torch.Tensor) or g.shape != w.shape or g.dtype != w.dtype:
            return node.name
        if w.numel() and relative_difference(g, w) > WRONG_REL.get(w.dtype, WRONG_REL[torch.float32]):
            return node.name
    return None
