"""torch.vmap and forward-mode AD (torch.func.jvp) regions in a pre-dispatch program, flattened for
lowering: each region is traced alone below the batching layer (make_fx on its nodes, in the program's
fake mode) and spliced back in its place, before the retrace above autograd. Why:
docs/lowering.md#lowering-leaves-global-state-alone."""

from __future__ import annotations

import torch

from ..._torch.functorch import predispatch_functions as _functions
from ...graph_walk import iter_graphs

__all__ = ["has_regions", "flatten_regions"]


_OPEN = _functions("_vmap_increment_nesting", "_jvp_increment_nesting", "_enter_dual_level")
_CLOSE = _functions("_vmap_decrement_nesting", "_jvp_decrement_nesting", "_exit_dual_level")
_LOADERS = _functions("lazy_load_decompositions")
MARKERS = _OPEN | _CLOSE | _LOADERS | _functions(
    "_add_batch_dim", "_remove_batch_dim", "_make_dual", "_unpack_dual", "_unwrap_for_grad")


def has_regions(gm: torch.fx.GraphModule) -> bool:
    return any(n.op == "call_function" and n.target in MARKERS for g in iter_graphs(gm) for n in g.nodes)


def _spans(graph: torch.fx.Graph) -> list[list[torch.fx.Node]]:
    """The outermost regions: the nodes from an opening call to the closing call that balances it."""
    spans, current, depth = [], [], 0
    for node in graph.nodes:
        opens = node.op == "call_function" and node.target in _OPEN
        closes = node.op == "call_function" and node.target in _CLOSE
        if depth or opens:
            current.append(node)
        depth += opens - closes
        if depth < 0:
            raise ValueError(f"node {node.name} closes a functorch region that was never opened")
        if closes and depth == 0:
            spans.append(current)
            current = []
    if depth:
        raise ValueError(f"a functorch region opened at {current[0].name} is never closed")
    return spans


def _flatten(gm: torch.fx.GraphModule, span: list[torch.fx.Node], fake_mode) -> None:
    from torch.fx.experimental.proxy_tensor import make_fx

    graph = gm.graph
    inside = set(span)
    inputs = []
    for node in span:
        for arg in node.all_input_nodes:
            if arg not in inside and arg not in inputs:
                inputs.append(arg)
    outputs = [n for n in span if any(user not in inside for user in n.users)]

    def region(*values):
        env = dict(zip(inputs, values))
        for node in span:
            args, kwargs = torch.fx.node.map_arg((node.args, node.kwargs), env.__getitem__)
            if node.op == "get_attr":
                env[node] = getattr(gm, node.target)
            else:
                env[node] = node.target(*args, **kwargs)
        return [env[n] for n in outputs]

    with fake_mode:
        traced = make_fx(region, tracing_mode="real")(*[n.meta["val"] for n in inputs])
    with graph.inserting_before(span[0]):
        env = dict(zip([n for n in traced.graph.nodes if n.op == "placeholder"], inputs))
        for node in traced.graph.nodes:
            if node.op == "placeholder":
                continue
            if node.op == "output":
                for old, new in zip(outputs, node.args[0]):
                    old.replace_all_uses_with(env[new] if isinstance(new, torch.fx.Node) else new)
                break
            if node.op == "get_attr":
                name = _fresh_attr(gm, node.target)
                setattr(gm, name, getattr(traced, node.target))
                env[node] = graph.get_attr(name)
                env[node].meta.update(node.meta)
                continue
            env[node] = graph.node_copy(node, env.__getitem__)
    for node in reversed(span):
        graph.erase_node(node)


def _fresh_attr(gm, base: str) -> str:
    name, i = f"_functorch_{base}", 0
    while hasattr(gm, name):
        i += 1
        name = f"_functorch_{base}_{i}"
    return name


def flatten_regions(gm: torch.fx.GraphModule, fake_mode) -> torch.fx.GraphModule:
    """A copy of ``gm`` whose top-level functorch regions are traced below the batching layer and
    spliced back (docs/lowering.md#lowering-leaves-global-state-alone); ``gm`` itself is not changed."""
    graph = torch.fx.Graph(owning_module=gm)
    graph._codegen = gm.graph._codegen
    graph.output(graph.graph_copy(gm.graph, {}))
    gm = torch.fx.GraphModule(gm, graph)
    for node in list(gm.graph.nodes):
        if node.op == "call_function" and node.target in _LOADERS and not node.users:
            gm.graph.erase_node(node)
    for span in _spans(gm.graph):
        _flatten(gm, span, fake_mode)
    gm.graph.lint()
    gm.recompile()
    return gm
