"""The parts of a split program (partition.py) made to take tensors only: a size a part uses, computed
outside it (another part's ``sym_size`` of an input, arithmetic on sizes in the graph between), is
computed inside it from the tensor it is a size of, which the part takes instead. Backends whose compiled
programs take tensors only (torch-mlir's calling convention, TVM's and Core ML's importers) then take
parts they refused; the sizes stay symbolic, read from the tensors of each call."""

from __future__ import annotations

import operator

import torch
import torch.fx

__all__ = ["number_type", "sizes_from_tensors"]

# ATen's size queries: a number from a tensor's metadata, never from its values
_SIZE_QUERIES = frozenset({torch.ops.aten.sym_size.int, torch.ops.aten.sym_numel.default,
                           torch.ops.aten.sym_stride.int, torch.ops.aten.sym_storage_offset.default})


class _Unresolved(Exception):
    """A number that is not an expression of tensors' sizes (a value read from a tensor, a number input)."""


def number_type(node):
    """int, float or bool where ``node`` (a graph node, or its value) is a size or a number, else None."""
    val = node.meta.get("val") if isinstance(node, torch.fx.Node) else node
    for kind, sym in ((bool, torch.SymBool), (int, torch.SymInt), (float, torch.SymFloat)):
        if isinstance(val, (kind, sym)):
            return kind
    return None


def _is_number(node) -> bool:
    return isinstance(node, torch.fx.Node) and number_type(node) is not None


def _arithmetic(node: torch.fx.Node) -> bool:
    """A size query of a tensor, or a Python function of numbers (operator.mul, sym_max, ...)."""
    if node.op != "call_function":
        return False
    if node.target in _SIZE_QUERIES:
        return True
    return (not isinstance(node.target, torch._ops.OpOverload) and node.target is not operator.getitem
            and _is_number(node) and not any(isinstance(x.meta.get("val"), torch.Tensor) for x in node.all_input_nodes))


class _Emitter:
    """Copies, into ``part``'s graph, the computation of numbers of the split graph ``split``, each
    tensor it reads taken as a new input of the part (``added``: the split graph's nodes, in order)."""

    def __init__(self, split: torch.fx.GraphModule, call: torch.fx.Node, part: torch.fx.GraphModule):
        self.split, self.part = split, part
        places = [n for n in part.graph.nodes if n.op == "placeholder"]
        # what is copied goes before the part's first node, args before the node reading them, after every
        # placeholder (the partitioner leaves some between nodes: they read nothing, so they move first);
        # the placeholders added are moved before it all at the end
        self.anchor = next(n for n in part.graph.nodes if n.op != "placeholder")
        for place in places:
            self.anchor.prepend(place)
        self.inputs = {a: p for a, p in zip(call.args, places) if isinstance(a, torch.fx.Node)}
        self.added: list[torch.fx.Node] = []
        self.memo: dict = {}

    def tensor(self, node: torch.fx.Node) -> torch.fx.Node:
        """The part's placeholder for the split graph's tensor ``node``, added after its others if new."""
        if node not in self.inputs:
            with self.part.graph.inserting_before(self.anchor):
                place = self.part.graph.placeholder(node.name)
            place.meta = dict(node.meta)
            self.inputs[node] = place
            self.added.append(node)
        return self.inputs[node]

    def outer(self, node: torch.fx.Node) -> torch.fx.Node:
        """``node`` of the split graph computed in the part."""
        if isinstance(node.meta.get("val"), torch.Tensor):
            return self.tensor(node)
        if (node.op == "call_function" and node.target is operator.getitem
                and isinstance(node.args[0], torch.fx.Node) and node.args[0].op == "call_module"):
            return self.inner(node.args[0], node.args[1])
        if node.op == "call_module":
            return self.inner(node, None)
        if _arithmetic(node):
            return self._copy(("outer", node), node, self.outer)
        raise _Unresolved(node.name)

    def inner(self, call: torch.fx.Node, index) -> torch.fx.Node:
        """Output ``index`` (None: the only one) of the part ``call`` calls, computed in this part."""
        other = getattr(self.split, call.target)
        outs = other.graph.output_node().args[0]
        return self._within(call, other, outs if index is None else outs[index])

    def _within(self, call: torch.fx.Node, other: torch.fx.GraphModule, node) -> torch.fx.Node:
        if not isinstance(node, torch.fx.Node):
            return node
        if node.op == "placeholder":
            places = [n for n in other.graph.nodes if n.op == "placeholder"]
            arg = call.args[places.index(node)]
            return self.outer(arg) if isinstance(arg, torch.fx.Node) else arg
        if isinstance(node.meta.get("val"), torch.Tensor):  # one of that part's results: taken from its call
            outs = other.graph.output_node().args[0]
            if outs is node:  # (its only result, not in a tuple: the call's value)
                return self.tensor(call)
            taken = [u for u in call.users if u.target is operator.getitem and outs[u.args[1]] is node] \
                if isinstance(outs, (tuple, list)) else []
            if not taken:
                raise _Unresolved(node.name)
            return self.tensor(taken[0])
        if _arithmetic(node):
            return self._copy(("inner", call, node), node, lambda n: self._within(call, other, n))
        raise _Unresolved(node.name)

    def placeholders_first(self) -> None:
        """The placeholders added moved before every other node, in the order they were added."""
        first = next(n for n in self.part.graph.nodes if n.op != "placeholder")
        for node in [self.inputs[a] for a in self.added]:
            first.prepend(node)

    def _copy(self, key, node: torch.fx.Node, resolve) -> torch.fx.Node:
        if key not in self.memo:
            args = torch.fx.map_arg((node.args, node.kwargs), resolve)
            with self.part.graph.inserting_before(self.anchor):
                copied = self.part.graph.call_function(node.target, *args)
            copied.meta = dict(node.meta)
            self.memo[key] = copied
        return self.memo[key]


def sizes_from_tensors(split: torch.fx.GraphModule) -> None:
    """Each number a part of ``split`` takes that is an expression of tensors' sizes computed inside the
    part instead, from those tensors (inputs of the part in the number's place), in place; the numbers
    and part results nothing reads any more removed. A number read from a tensor's values (``item``) or
    given to the program stays an input."""
    changed = False
    for call in [n for n in split.graph.nodes if n.op == "call_module"]:
        part = getattr(split, call.target)
        places = [n for n in part.graph.nodes if n.op == "placeholder"]
        numbers = [i for i, a in enumerate(call.args) if _is_number(a)]
        if not numbers or len(places) != len(call.args):
            continue
        emitter, dropped = _Emitter(split, call, part), []
        for i in numbers:
            try:
                value = emitter.outer(call.args[i])
            except _Unresolved:
                continue
            places[i].replace_all_uses_with(value)
            dropped.append(i)
        for i in dropped:
            emitter.inputs.pop(call.args[i], None)
            part.graph.erase_node(places[i])
        if dropped or emitter.added:
            emitter.placeholders_first()
            part.graph.eliminate_dead_code()
            part.recompile()
            call.args = tuple(a for i, a in enumerate(call.args) if i not in dropped) + tuple(emitter.added)
            changed = True
    if changed:
        _unused_removed(split)
        split.recompile()


def _unused_removed(split: torch.fx.GraphModule) -> None:
    """The split graph's numbers nothing reads erased, and the part results they were (each part then
    returns what is read of it)."""
    for node in reversed(list(split.graph.nodes)):
        if not node.users and _is_number(node) and (_arithmetic(node) or node.target is operator.getitem):
            split.graph.erase_node(node)
    for call in [n for n in split.graph.nodes if n.op == "call_module"]:
        part = getattr(split, call.target)
        output = part.graph.output_node()
        outs = output.args[0]
        if not isinstance(outs, (tuple, list)):
            continue
        read = {u.args[1]: u for u in call.users if u.target is operator.getitem}
        keep = [i for i in range(len(outs)) if i in read]
        if not keep or len(keep) == len(outs) or len(read) != len(call.users):
            continue
        output.args = (tuple(outs[i] for i in keep),)
        for new, old in enumerate(keep):
            read[old].args = (call, new)
        if isinstance(call.meta.get("val"), (tuple, list)):
            call.meta["val"] = tuple(call.meta["val"][i] for i in keep)
        part.graph.eliminate_dead_code()
        part.recompile()
