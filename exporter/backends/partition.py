"""A program split between a backend and the reference: the runs of nodes the backend lists, each handed
to it as a program of its own, and the nodes between them run by their own ATen kernels (as runtime_ref runs them)."""

from __future__ import annotations

import dataclasses
import operator
import re
from typing import Callable

import torch
import torch.fx

from ..errors import BackendHandOffError, Pt2bError
from ..lifted import Binding, Unbindable
from ..lowering.opset_check import is_infrastructure
from ..ops import op_name
from .._torch.pytree import pytree
from .part_sizes import number_type, sizes_from_tensors
from .probe import first_wrong

__all__ = ["Partitioned", "Share", "ops_named", "split_for"]


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
    wrong: tuple = ()  # (node, op, why) for every node the backend refuses, cannot run or computes wrong

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
        for node, op, why in self.wrong:
            text += f"; the reference runs node {node} ({op}), which the backend {why}"
        return text


# an op named in a backend's refusal: "aten.randn.default" (OpenVINO's "No conversion rule found for
# operations: ..."), "aten::histc.default", or torch.onnx's "<OpOverload(op='aten._is_all_true', overload='default')>"
_OP_NAMED = re.compile(r"\b([A-Za-z_]\w*)(?:\.|::)(\w+)\.(\w+)\b|OpOverload\(op='(\w+)\.(\w+)', overload='(\w+)'\)")


def ops_named(reason: str, ep) -> frozenset:
    """The ops of ``ep``'s graph that ``reason`` (the one line a backend's refusal comes down to,
    ``first_line``) names: a split leaves them to the reference from the start, where cutting parts down
    would find them one hand-off at a time. A name that is not an op of the program is no op named."""
    named = {f"{m[0] or m[3]}::{m[1] or m[4]}.{m[2] or m[5]}" for m in _OP_NAMED.findall(reason)}
    return frozenset(name for name in {op_name(n.target) for n in ep.graph.nodes if n.op == "call_function"
                                       and isinstance(n.target, torch._ops.OpOverload)} if name in named)


# the most parts one split hands over (each a trace and a backend compile): a program the backend computes
# wrong in many places stops being cut there, and what is left wrong runs on the reference whole
MAX_PARTS = 256


class _Listed(torch.fx.passes.operator_support.OperatorSupportBase):
    def __init__(self, supported: Callable, excluded: set):
        self.supported, self.excluded = supported, excluded

    def is_node_supported(self, submodules, node: torch.fx.Node) -> bool:
        if node.op != "call_function" or node.name in self.excluded:
            return False
        if node.target is operator.getitem:  # (a multi-output op's results go where the op goes)
            return True
        if is_infrastructure(node.target):  # sizes and runtime checks go with the part around them
            return True
        return isinstance(node.target, torch._ops.OpOverload) and self.supported(node.target)


class _Handed(torch.nn.Module):
    """A part of the program run by the backend, called as the part's GraphModule was."""

    def __init__(self, compiled, single: bool, part: torch.fx.GraphModule):
        super().__init__()
        self.compiled, self.single, self.part = compiled, single, part  # (part: the nodes it runs)
        # a size the part returns comes back from a backend as a 0-dim tensor: the next part takes a number
        outs = part.graph.output_node().args[0]
        self.numbers = [number_type(o) for o in ([outs] if single else outs)]

    def forward(self, *args):
        # (the weights the program binds, Parameters, are the compiled part's own: _with_weights)
        out = self.compiled(*handed_args(args))
        out = [out] if self.single else list(out)
        # (a bool comes back as a 0-dim tensor or a plain 0 or 1 from some runtimes: it is made a bool again,
        # which the next part's sym_ite requires)
        out = [o if kind is None else kind(o.item() if isinstance(o, torch.Tensor) else o)
               for o, kind in zip(out, self.numbers)]
        return out[0] if self.single else tuple(out)


class Partitioned:
    """The program run part by part: calling it runs the split graph with the program's own state bound,
    each backend part by the backend's compiled program; the program's outputs, structured."""

    def __init__(self, ep, split: torch.fx.GraphModule, share: Share):
        self.binding, self.split, self.share = Binding(ep), split, share
        self.out_spec = ep.call_spec.out_spec

    def __call__(self, *args, **kwargs):
        from .calling import flat_inputs

        out = self.split(*self.binding.bind(flat_inputs(self.binding.ep, args, kwargs)))
        out = out if isinstance(out, (list, tuple)) else [out]
        return pytree.tree_unflatten([out[i] for i in self.binding.user_outputs], self.out_spec)


def _op_nodes(gm: torch.fx.GraphModule) -> list:
    """The op nodes of ``gm``: where a wrong part is cut (a size read among them: IREE computed
    cosmos3_edge_text wrong until one ran on the reference)."""
    return [n for n in gm.graph.nodes if n.op == "call_function" and isinstance(n.target, torch._ops.OpOverload)]


def _counted(gm: torch.fx.GraphModule) -> list:
    """The op nodes of ``gm`` a share counts: those that compute, sizes and runtime checks aside (a split
    adds size reads to its parts, which had been counted beyond the program's own nodes)."""
    return [n for n in _op_nodes(gm) if not is_infrastructure(n.target)]


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


def _flops(fn, args) -> int | None:
    """The FLOPs torch's counter counts in a run of ``fn`` on ``args``; None where the run fails under the
    counter: a dispatch mode sends some composite ops (attention) down their decomposed path, whose
    outputs may have other strides than the kernel the program was traced on, and a view traced on
    those strides then refuses them."""
    from torch.utils.flop_counter import FlopCounterMode

    counter = FlopCounterMode(display=False)
    try:
        with counter, torch.no_grad():
            fn(*args)
    # any failure of the counted run: the FLOPs are then estimated from the graph (_graph_flops)
    except Exception:  # noqa: BLE001
        return None
    return counter.get_total_flops()


def _graph_flops(gm) -> int:
    """The FLOPs of one run of ``gm`` from its graph at the sizes it was traced with (torch's formulas)."""
    from ..lowering.run_cost import program_work

    return int(sum(program_work(gm).flops.values()))


def split_for(backend, ep, supported: Callable, hand_off: Callable, options: dict,
              check: Callable | None = None, ties_first: Callable | None = None) -> Partitioned:
    """``ep`` split into the longest runs of nodes ``supported(op)`` accepts, each handed to ``backend``
    (``hand_off(part_ep, **options)`` -> a Compiled) as a program of its own, traced on the values it
    takes in the stored example inputs' run; a part the backend refuses runs on the reference instead
    (Share.refused says why). ``check(compiled, part_ep)`` (the hand-off check, raising
    BackendResultError) runs on each part. A part the backend refuses, cannot run or computes wrong is
    cut at its middle op, which the reference runs, and its halves handed over again, until every part
    handed over is taken and right; the cuts found right then go back to the backend (Share.wrong
    names the nodes left).
    ``ties_first(graph_module, inputs)`` (given where the backend computed the whole program wrong: the
    hand-off check's tied_nodes): the names of the nodes that pick among equal values in the example run
    (a topk at a tie, an argmax of a maximum held twice), whose picks a backend may make otherwise than
    torch; they run on the reference from the start.
    BackendHandOffError where the program cannot be split (no stored example inputs, inputs of a kind
    a direct run cannot bind)."""
    from .calling import flat_inputs

    key = backend.key
    if ep.example_inputs is None:
        raise BackendHandOffError(f"splitting the program for {key} needs its stored example inputs, and it has "
                                  f"none: export it with example inputs (export_model does).")
    try:
        binding = Binding(ep)
    except Unbindable as e:
        raise BackendHandOffError(f"the program cannot be split for {key}: {e}.") from None
    args, kwargs = pytree.tree_map(lambda t: t.clone() if isinstance(t, torch.Tensor) else t, ep.example_inputs)
    inputs = binding.bind(flat_inputs(ep, args, kwargs))
    whole = torch.fx.GraphModule(ep.graph_module, ep.graph_module.graph.__deepcopy__())
    nodes, total_flops = len(_counted(whole)), _flops(whole, inputs)
    counted = total_flops is not None  # else every share's FLOPs come from the graphs, the whole's and the parts'
    if not counted:
        total_flops = _graph_flops(whole)
    excluded: set[str] = set()  # op nodes the reference runs because a part holding them came out wrong
    cuts: list[str] = []  # those excluded to cut a wrong part in two, not found wrong themselves
    handed: dict[tuple, tuple] = {}  # a part's nodes -> (its Compiled, its program) or (None, why, the cut)
    found: dict[str, str] = {}  # excluded node -> how the part it was cut from differed
    if ties_first is not None:
        try:
            tied = ties_first(whole, inputs)
        except Exception:  # noqa: BLE001 -- a run the reference cannot make finds no ties; the split cuts as ever
            tied = frozenset()
        excluded.update(tied)
        found.update(dict.fromkeys(tied, "picks among equal values in the example run"))
    once = lambda listed: _split_once(ep, inputs, listed, handed, hand_off, options, check)  # noqa: E731
    while True:
        split, wrong = once(_Listed(supported, excluded))
        if wrong is None:
            break
        name, alone, why = wrong
        excluded.add(name)
        found[name] = why
        if not alone:
            cuts.append(name)
    for name in reversed(cuts):  # a cut the backend computes right goes back to it, where the parts stay right
        # (once the hand-offs are spent, a trial's new parts are not handed over and no trial does better: each
        # only split and ran the program again, hundreds of times on d_fine)
        if len(handed) >= MAX_PARTS:
            break
        trial = excluded - {name}
        tried, wrong = once(_Listed(supported, trial))
        # (a trial whose parts were not handed over, the hand-offs spent, is no better)
        if wrong is None and _backend_nodes(tried) >= _backend_nodes(split):
            excluded, split = trial, tried
    refused = [(name, handed[_key(part)][1]) for name, part in split.named_children()
               if not isinstance(part, _Handed) and _key(part) in handed]
    targets = {n.name: n.target for n in ep.graph.nodes}
    wrong_nodes = tuple((n, op_name(targets[n]), found[n]) for n in sorted(excluded))
    backend_nodes = backend_flops = 0
    recorded = _part_inputs(split, inputs)
    for name, part in list(split.named_children()):
        if isinstance(part, _Handed):
            backend_nodes += len(_counted(part.part))
            flops = _flops(part.part, recorded[name]) if counted else None
            backend_flops += flops if flops is not None else _graph_flops(part.part)
    on_reference: dict[str, int] = {}
    for part in (split, *(p for p in split.children() if not isinstance(p, _Handed))):
        for node in _counted(part):
            on_reference[op_name(node.target)] = on_reference.get(op_name(node.target), 0) + 1
    share = Share(backend_nodes, nodes, backend_flops, total_flops, dict(sorted(on_reference.items())),
                  tuple(refused), wrong_nodes)
    return Partitioned(ep, split, share)


def _key(part: torch.fx.GraphModule) -> tuple:
    """A part by the nodes it holds (the same nodes: the same part, handed over once)."""
    return tuple(n.name for n in part.graph.nodes if n.op == "call_function")


def _backend_nodes(split: torch.fx.GraphModule) -> int:
    return sum(len(_counted(part.part)) for part in split.children() if isinstance(part, _Handed))


def _split_once(ep, inputs: list, listed: _Listed, handed: dict, hand_off: Callable, options: dict,
                check: Callable | None) -> tuple:
    """(the split program with every part the backend takes handed over, None), or (None, (the name of an
    op node to leave to the reference, whether it is the wrong part's only one, how the part differed))
    where ``check`` finds a part wrong."""
    from torch.fx.passes.infra.partitioner import CapabilityBasedPartitioner

    from ..errors import BackendResultError

    gm = torch.fx.GraphModule(ep.graph_module, ep.graph_module.graph.__deepcopy__())
    split = CapabilityBasedPartitioner(gm, listed, allows_single_node_partition=True).partition_and_fuse()
    sizes_from_tensors(split)  # (a part takes tensors only, where its sizes can be read from them)
    recorded = _part_inputs(split, inputs)
    for name, part in list(split.named_children()):
        if name not in recorded:
            continue
        ops = _op_nodes(part)
        key = _key(part)
        if key not in handed and len(handed) >= MAX_PARTS:
            handed[key] = (None, f"not handed over: the split already tried {MAX_PARTS} parts", None)
        if key not in handed:  # (compiled, its program) | (None, why it was refused or came out wrong, the cut)
            compiled, part_ep = _hand_part(split, name, part, recorded[name], hand_off, options)
            handed[key] = (compiled, part_ep, None)
            if compiled is None and ops:  # refused: cut down alike, to find the nodes the backend refuses
                handed[key] = (None, part_ep, (ops[len(ops) // 2].name, len(ops) == 1, f"refused: {part_ep}"))
            elif compiled is not None and check is not None:
                try:
                    check(compiled, part_ep)
                # (a part the backend computes wrong or cannot run is cut down alike)
                except Exception as e:  # noqa: BLE001
                    why = ("computes wrong: " + str(e).split(": the backend computes")[0]
                           if isinstance(e, BackendResultError) else
                           f"cannot run: {type(e).__name__}: {(str(e).strip().splitlines() or [''])[-1]}")
                    cut = (ops[len(ops) // 2].name, len(ops) == 1, why) if ops else None  # (none: it stays whole)
                    if isinstance(e, BackendResultError) and len(ops) > 1 and len(handed) < MAX_PARTS:
                        first = first_wrong(part, handed_args(recorded[name]), lambda module: _hand_part(
                            split, name, module, recorded[name], hand_off, options))
                        handed[("probe", *key)] = (None, "the part's values, each compared", None)
                        cut = (first, False, why) if first is not None else cut
                    handed[key] = (None, why, cut)
        compiled, _, cut = handed[key]
        if cut is not None:  # (found wrong now, or before in the same split: a trial holding it fails alike)
            return None, cut
        if compiled is not None:
            single = not isinstance(part.graph.output_node().args[0], (tuple, list))
            setattr(split, name, _Handed(compiled, single, part))
    return split, None


def _held(value) -> bool:
    """Whether a part's input is one of the program's weights (a Parameter the split binds), which the
    part's own program holds (_with_weights)."""
    return isinstance(value, torch.nn.Parameter)


def handed_args(args: tuple) -> tuple:
    """The inputs a part handed over takes of its ``args``: all but the weights it holds."""
    return tuple(a for a in args if not _held(a))


def _with_weights(part: torch.fx.GraphModule, part_args: tuple) -> torch.fx.GraphModule:
    """``part`` with each input bound to one of the program's weights (a Parameter) read as a weight of its
    own: exported, it is a parameter of the part's program, which a backend takes as a constant, as it does
    in a whole program's hand-off. As an input, OpenVINO typed a convolution's weight with no static size
    and its CPU plugin refused the convolution ("Ngraph::Node::evaluate() is not implemented for op:
    opset1::GroupConvolution": vibevoice_acoustic_tokenizer's parts). The part takes the other
    inputs (handed_args)."""
    held = torch.fx.GraphModule(part, part.graph.__deepcopy__())
    placeholders = [n for n in held.graph.nodes if n.op == "placeholder"]
    for k, (node, value) in enumerate(zip(placeholders, part_args)):
        if _held(value):
            held.register_parameter(f"_weight_{k}", value)
            with held.graph.inserting_before(node):
                weight = held.graph.get_attr(f"_weight_{k}")
            weight.meta.update(node.meta)
            node.replace_all_uses_with(weight)
            held.graph.erase_node(node)
    held.recompile()
    return held


def _hand_part(split, name: str, part, part_args: tuple, hand_off: Callable, options: dict) -> tuple:
    """(the part's Compiled, its ExportedProgram), or (None, why the backend or the trace refused it). The
    Compiled takes the part's inputs but its weights (handed_args), which it holds (_with_weights)."""
    # an input recorded as a view of another tensor (a select the reference ran) is traced as a tensor of its
    # own: torch.export guards a view's base (``select._base.size()``), which no retrace of the part's
    # program has ("'NoneType' object has no attribute 'size'": tapas's ids on OpenVINO)
    part_args = tuple(a.clone() if isinstance(a, torch.Tensor) and a._is_view() else a for a in part_args)
    given = [not _held(a) for a in part_args]
    dynamic = tuple(d for d, g in zip(_dynamic(split, name), given) if g)
    try:
        part_ep = torch.export.export(_with_weights(part, part_args) if not all(given) else part,
                                      handed_args(part_args), dynamic_shapes=dynamic, strict=False)
        return hand_off(part_ep, **options), part_ep
    except Pt2bError as e:
        return None, str(e).splitlines()[0]
    except Exception as e:  # noqa: BLE001 (a part the backend or the trace refuses runs on the reference)
        return None, f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
