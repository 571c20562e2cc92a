"""A view of a complex tensor given to a backend as the same view of its real pairs: ``op(x)`` becomes
``view_as_complex(op'(view_as_real(x)))``, the dims it names those of the real tensor (whose last dim,
of size 2, holds each number's parts) and a shape it names one more trailing 2. The same elements in
the same places, moved, never computed. torch.onnx translates complex tensors as real pairs but has no
translation of ``unsqueeze`` and the other views for them ("No decompositions registered for the
complex-valued input": the rotary embeddings of DeepSeek-V2 and Llama 4, which multiply by
``polar(...)`` unsqueezed)."""

from __future__ import annotations

import torch
import torch.fx

from .program_copy import nodes_rewritten

__all__ = ["REAL_ARGS", "complex_views_as_real", "real_dim"]

aten = torch.ops.aten


def real_dim(d: int, rank: int) -> int:
    """Dim ``d`` of a complex tensor of rank ``rank`` as the same dim of its real pairs (counted from the
    front: the pairs' trailing dim of 2 comes after it)."""
    return d % rank if rank else 0


# view op -> its arguments for the real pairs, from its own arguments and the complex input's rank
REAL_ARGS = {
    aten.unsqueeze.default: lambda a, r: (a[0], a[1] % (r + 1)),
    aten.view.default: lambda a, r: (a[0], [*a[1], 2]),
    aten.reshape.default: lambda a, r: (a[0], [*a[1], 2]),
    aten._unsafe_view.default: lambda a, r: (a[0], [*a[1], 2]),
    aten.expand.default: lambda a, r: (a[0], [*a[1], 2], *a[2:]),
    aten.permute.default: lambda a, r: (a[0], [real_dim(d, r) for d in a[1]] + [r]),
    aten.transpose.int: lambda a, r: (a[0], real_dim(a[1], r), real_dim(a[2], r)),
    aten.select.int: lambda a, r: (a[0], real_dim(a[1], r), a[2]),
    aten.slice.Tensor: lambda a, r: (a[0], real_dim(a[1] if len(a) > 1 else 0, r), *a[2:]),
    aten.squeeze.dim: lambda a, r: (a[0], real_dim(a[1], r)),
    aten.squeeze.dims: lambda a, r: (a[0], [real_dim(d, r) for d in a[1]]),
}


def _complex_view(node: torch.fx.Node) -> bool:
    if node.op != "call_function" or node.target not in REAL_ARGS or node.kwargs or not node.args:
        return False
    x = node.args[0]
    val = x.meta.get("val") if isinstance(x, torch.fx.Node) else None
    return isinstance(val, torch.Tensor) and val.is_complex()


def complex_views_as_real(ep: torch.export.ExportedProgram) -> torch.export.ExportedProgram:
    """``ep`` with each view of a complex tensor made the same view of its real pairs between
    ``view_as_real`` and ``view_as_complex``; ``ep`` itself where it has none (it is never changed)."""
    def as_real(graph: torch.fx.Graph, node: torch.fx.Node) -> None:
        x = node.args[0]
        args = REAL_ARGS[node.target](node.args, x.meta["val"].dim())
        real = graph.call_function(aten.view_as_real.default, (x,))
        real.meta["val"] = aten.view_as_real.default(x.meta["val"])
        moved = graph.call_function(node.target, (real, *args[1:]))
        moved.meta["val"] = node.target(real.meta["val"], *args[1:])
        back = graph.call_function(aten.view_as_complex.default, (moved,))
        back.meta["val"] = node.meta["val"]
        node.replace_all_uses_with(back)
        graph.erase_node(node)

    return nodes_rewritten(ep, _complex_view, as_real)
