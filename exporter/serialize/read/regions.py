"""The pairing rule for a decoded program's region nodes (grad mode, autocast, vmap/jvp and dual levels): every
region a graph opens, the same graph closes, innermost first; checked before anything runs."""

from __future__ import annotations

from ...errors import CorruptArtifactError
from ...graph_walk import iter_serialized_graphs
from ...shared.regions import SERIALIZED_ENTER_AUTOCAST, SERIALIZED_EXIT_AUTOCAST, SERIALIZED_GRAD

_GRAD = SERIALIZED_GRAD
_PREDISPATCH = "torch._functorch.predispatch."
# target -> (family, the region kind it opens or None, the kind it closes or None). vmap and jvp levels
# share one family: both push onto functorch's one stack of levels, and a decrement pops whatever is on top
_MARKERS = {
    SERIALIZED_ENTER_AUTOCAST: ("autocast", "autocast", None),
    SERIALIZED_EXIT_AUTOCAST: ("autocast", None, "autocast"),
    f"{_PREDISPATCH}_vmap_increment_nesting": ("functorch level", "vmap", None),
    f"{_PREDISPATCH}_vmap_decrement_nesting": ("functorch level", None, "vmap"),
    f"{_PREDISPATCH}_jvp_increment_nesting": ("functorch level", "jvp", None),
    f"{_PREDISPATCH}_jvp_decrement_nesting": ("functorch level", None, "jvp"),
    f"{_PREDISPATCH}_enter_dual_level": ("forward-AD dual level", "dual level", None),
    f"{_PREDISPATCH}_exit_dual_level": ("forward-AD dual level", None, "dual level"),
}


def _a(kind: str) -> str:
    return f"{'an' if kind[0] in 'aeiou' else 'a'} {kind}"


def _bad(where: str, node, why: str) -> CorruptArtifactError:
    return CorruptArtifactError(
        f"{where}: node {node.name!r} ({node.target}) {why}; torch.export records every such region as a pair "
        f"in one graph, innermost closed first, and running this one would leave the caller's process changed.")


def _grad_value(node, where: str) -> bool:
    args = [inp.arg for inp in node.inputs]
    if len(args) != 1 or args[0] is None or args[0].type != "as_bool":
        raise _bad(where, node, "does not take exactly one bool")
    return args[0].value


def _check_grad(markers: list, where: str) -> None:
    """``markers``: a graph's _set_grad_enabled nodes in order. torch.export records a region as the mode it
    sets on entry, then, on exit, the mode the region was entered from (the mode it was traced in for
    the outermost ones); on and off calls look alike. Read in order, a call that sets back the mode the
    innermost open region was entered from closes it, any other opens one, and the mode the graph
    starts in is the one its last call sets (an outermost exit's). Every region must be closed at the
    end. This reading accepts exactly the sequences some nesting of regions explains."""
    values = [_grad_value(node, where) for node in markers]
    if not values:
        return
    current, opened = values[-1], []  # (the mode before the region, its opening node, the mode it sets)
    for node, value in zip(markers, values):
        if opened and opened[-1][0] == value:
            opened.pop()
        else:
            opened.append((current, node, value))
        current = value
    if opened:
        before, node, value = opened[-1]
        raise _bad(where, node, f"opens a grad-mode region (sets grad mode to {value}) that no later call in its "
                                f"graph closes (sets back the mode it was opened from)")


def _names(node) -> set:
    """What a later node calls an _enter_autocast's result: the node's name, or a name it outputs."""
    out = {node.name}
    for arg in node.outputs:
        if arg is not None and arg.type == "as_tensor":
            out.add(arg.value.name)
    return out


def _check_graph(graph, where: str) -> None:
    grad, stacks = [], {}  # family -> [(kind, opening node)]
    for node in graph.nodes:
        target = node.target
        if target == _GRAD:
            grad.append(node)
            continue
        marker = _MARKERS.get(target)
        if marker is None:
            continue
        family, opens, closes = marker
        stack = stacks.setdefault(family, [])
        if opens is not None:
            stack.append((opens, node))
            continue
        if not stack:
            raise _bad(where, node, f"closes {_a(closes)} region that is not open in its graph")
        kind, opener = stack[-1]
        if kind != closes:
            raise _bad(where, node, f"closes {_a(closes)} region where the innermost open one is the {kind} "
                                    f"region {opener.name!r} opened")
        if family == "autocast":
            args = [inp.arg for inp in node.inputs]
            if len(args) != 1 or args[0] is None or args[0].type != "as_tensor" \
                    or args[0].value.name not in _names(opener):
                raise _bad(where, node, f"does not close the innermost open autocast region, which "
                                        f"{opener.name!r} opened")
        stack.pop()
    for family, stack in stacks.items():
        if stack:
            kind, opener = stack[-1]
            raise _bad(where, opener, f"opens {_a(kind)} region that nothing after it in its graph closes")
    _check_grad(grad, where)


def check_regions(graph, where: str) -> None:
    """Raise a CorruptArtifactError naming the first region node of ``graph`` (a decoded program's
    root graph; its subgraphs are checked each by itself) that does not pair up."""
    seen = set()
    for g in iter_serialized_graphs(graph):
        if id(g) not in seen:
            seen.add(id(g))
            _check_graph(g, where)
