"""A program split between a backend and the reference: the runs of nodes the backend lists, each handed
to it as a program of its own, and the nodes between them run by their own ATen kernels (as runtime_ref runs them)."""

from __future__ import annotations

import dataclasses
import operator
from typing import Callable

import torch
import torch.fx

from ..errors import BackendHandOffError, Pt2bError
from ..lifted import Binding, Unbindable
from ..ops import op_name
from .._torch.pytree import pytree

__all__ = ["Partitioned", "Share", "split_for"]


@dataclasses.dataclass(frozen=True)
class Share:
    """What share of a program the backend runs: op nodes and FLOPs (on the stored example inputs), and
    the ops it left to the reference (op -> call sites) with the parts whose hand-off failed (why)."""

    backend_nodes: int
    nodes: int
    backend_flops: int
    flops: int
    on_reference: dict  # op name -> call sites run by the reference
    refused: tuple = ()  # (part, the backend's reason) for every part handed over and refused

    @property
    def node_share(self) -> float:
        return self.backend_nodes / self.nodes if self.nodes else 1.0

    @property
    def flop_share(self) -> float:
        return self.backend_flops / self.flops if self.flops else self.node_share

    def describe(self) -> str:
        text = (f"the backend runs {self.backend_nodes} of {self.nodes} op nodes ({self.node_share:.1%}) and "
                f"{self.flop_share:.1%} of the FLOPs")
        if self.on_reference:
            text += "; the reference runs " + ", ".join(f"{name} x{n}" for name, n in self.on_reference.items())
        for part, why in self.refused:
            text += f"; {part} went back to the reference: {why}"
        return text


class _Listed(torch.fx.passes.operator_support.OperatorSupportBase):
    def __init__(self, supported: Callable):
        self.supported = supported

    def is_node_supported(self, submodules, node: torch.fx.Node) -> bool:
        if node.op != "call_function":
            return False
        if node.target is operator.getitem:  # (a multi-output op's results go where the op goes)
            return True
        return isinstance(node.target, torch._ops.OpOverload) and self.supported(node.target)


class _Handed(torch.nn.Module):
    """A part of the program run by the backend, called as the part's GraphModule was."""

    def __init__(self, compiled, single: bool):
        super().__init__()
        self.compiled, self.single = compiled, single

    def forward(self, *args):
        out = self.compiled(*args)
        return out if self.single else tuple(out)


class Partitioned:
    """The program run part by part: calling it runs the split graph with the program's own state bound,
    each backend part by the backend's compiled program; the program's outputs, structured."""

    def __init__(self, ep, split: torch.fx.GraphModule, share: Share):
        self.binding, self.split, self.share = Binding(ep), split, share
        self.in_spec, self.out_spec = ep.call_spec.in_spec, ep.call_spec.out_spec

    def __call__(self, *args, **kwargs):
        from .calling import flat_inputs

        out = self.split(*self.binding.bind(flat_inputs(self.binding.ep, args, kwargs)))
        out = out if isinstance(out, (list, tuple)) else [out]
        return pytree.tree_unflatten([out[i] for i in self.binding.user_outputs], self.out_spec)


def _op_nodes(gm: torch.fx.GraphModule) -> list:
    return [n for n in gm.graph.nodes if n.op == "call_function" and isinstance(n.target, torch._ops.OpOverload)]


def _part_inputs(split: torch.fx.GraphModule, inputs: list) -> dict:
    """Each part's call arguments on ``inputs`` (the graph's inputs), recorded by running the split graph."""
    seen: dict[str, tuple] = {}

    class Recorder(torch.fx.Interpreter):
        def call_module(self, target, args, kwargs):
            seen.setdefault(target, tuple(args))
            return super().call_module(target, args, kwargs)

    with torch.no_grad():
        Recorder(split).run(*inputs)
    return seen


def _dynamic(split: torch.fx.GraphModule, name: str) -> tuple:
    """The dynamic shapes of part ``name``'s inputs: a dim the program holds as a symbol is left for
    export to decide (Dim.AUTO), so that the part takes the sizes the program takes."""
    from torch.export import Dim

    call = next(n for n in split.graph.nodes if n.op == "call_module" and n.target == name)
    shapes = []
    for arg in call.args:
        val = arg.meta.get("val") if isinstance(arg, torch.fx.Node) else None
        dims = {i: Dim.AUTO for i, size in enumerate(val.shape) if not isinstance(size, int)} \
            if isinstance(val, torch.Tensor) else {}
        shapes.append(dims or None)
    return tuple(shapes)


def _flops(fn, args) -> int:
    from torch.utils.flop_counter import FlopCounterMode

    counter = FlopCounterMode(display=False)
    with counter, torch.no_grad():
        fn(*args)
    return counter.get_total_flops()


def split_for(backend, ep, supported: Callable, hand_off: Callable, options: dict) -> Partitioned:
    """``ep`` split into the longest runs of nodes ``supported(op)`` accepts, each handed to ``backend``
    (``hand_off(part_ep, **options)`` -> a Compiled) as a program of its own, traced on the values it
    takes in the stored example inputs' run; a part the backend refuses runs on the reference instead
    (Share.refused says why). BackendHandOffError where the program cannot be split (no stored example
    inputs, inputs of a kind a direct run cannot bind)."""
    from torch.fx.passes.infra.partitioner import CapabilityBasedPartitioner

    from .calling import flat_inputs

    key = backend.key
    if ep.example_inputs is None:
        raise BackendHandOffError(f"splitting the program for {key} needs its stored example inputs, and it has "
                                  f"none: export it with example inputs (export_model does).")
    try:
        binding = Binding(ep)
    except Unbindable as e:
        raise BackendHandOffError(f"the program cannot be split for {key}: {e}.") from None
    gm = torch.fx.GraphModule(ep.graph_module, ep.graph_module.graph.__deepcopy__())
    all_ops = _op_nodes(gm)
    args, kwargs = pytree.tree_map(lambda t: t.clone() if isinstance(t, torch.Tensor) else t, ep.example_inputs)
    inputs = binding.bind(flat_inputs(ep, args, kwargs))
    total_flops = _flops(gm, inputs)  # (before the split: the partitioner fuses the graph in place)
    split = CapabilityBasedPartitioner(gm, _Listed(supported), allows_single_node_partition=True).partition_and_fuse()
    recorded = _part_inputs(split, inputs)
    backend_nodes, backend_flops, refused = 0, 0, []
    for name, part in list(split.named_children()):
        if name not in recorded:
            continue
        part_args = recorded[name]
        try:
            part_ep = torch.export.export(part, part_args, dynamic_shapes=_dynamic(split, name), strict=False)
            compiled = hand_off(part_ep, **options)
        except Pt2bError as e:
            refused.append((name, str(e).splitlines()[0]))
            continue
        except Exception as e:  # noqa: BLE001 (a part the backend or the trace refuses runs on the reference)
            refused.append((name, f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"))
            continue
        single = not isinstance(part.graph.output_node().args[0], (tuple, list))
        backend_nodes += len(_op_nodes(part))
        backend_flops += _flops(part, part_args)
        setattr(split, name, _Handed(compiled, single))
    on_reference: dict[str, int] = {}
    for part in (split, *(p for p in split.children() if not isinstance(p, _Handed))):
        for node in _op_nodes(part):
            on_reference[op_name(node.target)] = on_reference.get(op_name(node.target), 0) + 1
    share = Share(backend_nodes, len(all_ops), backend_flops, total_flops, dict(sorted(on_reference.items())),
                  tuple(refused))
    return Partitioned(ep, split, share)
