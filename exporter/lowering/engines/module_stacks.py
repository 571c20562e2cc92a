"""Module stacks for the calls a lowering adds without one: the grad-mode and autocast markers a
retrace records where a region stood (torch.export.unflatten places every call by its stack)."""

from __future__ import annotations

import torch

from ...shared.regions import is_region_marker


def place_markers(gm: torch.fx.GraphModule) -> None:
    """Give each region marker without an ``nn_module_stack`` the stack of the call before it (else
    the one after it), in place: it then runs, unflattened, where it stood between the two, in the
    module of a call next to it. A marker's place in the order of calls is its meaning; the module
    it lands in is not."""
    nodes = list(gm.graph.nodes)
    for i, node in enumerate(nodes):
        if node.op != "call_function" or not is_region_marker(node.target) or node.meta.get("nn_module_stack"):
            continue
        near = [n for n in reversed(nodes[:i]) if n.op == "call_function"][:1] + \
            [n for n in nodes[i + 1:] if n.op == "call_function" and not is_region_marker(n.target)][:1]
        stack = next((n.meta["nn_module_stack"] for n in near if n.meta.get("nn_module_stack")), None)
        if stack is not None:
            node.meta["nn_module_stack"] = dict(stack)
