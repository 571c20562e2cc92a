"""Views sized explicitly: a view's -1 that stands for a constant size is written as that size in
every lowered program, whichever engine made it (a trace keeps or resolves the -1 of
``reshape(x, [1, -1, s, 16])`` depending on the layout it meets). The same view either way; backends
read it more easily (OpenVINO's shape inference failed on doge's -1 after a copy)."""

from __future__ import annotations

import torch

_SIZED_VIEWS = frozenset({torch.ops.aten.view.default, torch.ops.aten._unsafe_view.default})


def size_views(gm: torch.fx.GraphModule) -> None:
    """Write each view's -1 as the constant it stands for (from the node's value), in place; a -1 for a
    symbolic size stays."""
    changed = False
    for node in gm.graph.nodes:
        if node.op != "call_function" or node.target not in _SIZED_VIEWS or len(node.args) < 2:
            continue
        size, val = node.args[1], node.meta.get("val")
        if not isinstance(size, (list, tuple)) or -1 not in size or not isinstance(val, torch.Tensor) \
                or len(size) != val.dim():
            continue
        i = list(size).index(-1)
        if type(val.shape[i]) is int:
            node.args = (node.args[0], [*size[:i], val.shape[i], *size[i + 1:]], *node.args[2:])
            changed = True
    if changed:
        gm.recompile()  # (lazy inside a lowering: _torch/deferred_codegen.py)
