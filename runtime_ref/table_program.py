"""A program planned straight from an artifact's graph table: the checked, decoded graph of a loaded .pt2b
is read into light nodes and handed to the planner, with no fx graph, fake tensor or ExportedProgram
built. ``from_table`` says what it covers and names why not otherwise; then the Runtime plans from the
ExportedProgram. Why: docs/architecture.md#run-runtime_refruntime."""

from __future__ import annotations

import keyword
import operator
import re
import types

import sympy
import torch

from exporter._torch import serializer as _serde
from exporter._torch.serde import schema as S
from exporter._torch.symbolic import ValueRanges, int_oo

from .bindings import TensorSpec
from .nodes import TableNode

__all__ = ["TableProgram", "from_table"]

_DTYPES = _serde.SERIALIZE_TO_TORCH_DTYPE
_MEMORY_FORMATS = _serde.SERIALIZE_TO_TORCH_MEMORY_FORMAT
_LAYOUTS = _serde.SERIALIZE_TO_TORCH_LAYOUT
_POSITIONAL, _KEYWORD = S.ArgumentKind.POSITIONAL, S.ArgumentKind.KEYWORD
_CONSTANTS = ("as_none", "as_int", "as_float", "as_bool", "as_string")
_SYM_RESULTS = ("as_sym_int", "as_sym_bool", "as_sym_float")
_PLAIN_SYMBOL = re.compile(r"(?:Symbol\(')?([A-Za-z_][A-Za-z0-9_]*)(?:'(?:, [a-z_]+=(?:True|False))*\))?")
_SYM_OPS = _serde.SYM_OPS  # the Python functions torch's deserializer accepts for SymInt arithmetic
_SYM_OP_NAMES = {f"{f.__module__}.{f.__name__}": f for f in _SYM_OPS}  # as torch's serializer names them


class _Unplannable(Exception):
    """The table holds something the direct plan does not read (the message says what)."""


class TableProgram:
    """The parts of an ExportedProgram the Runtime reads, made from a checked graph table:
    graph_module.graph.nodes, graph_signature, state_dict, constants, call_spec, module_call_graph,
    range_constraints. Every operator is resolved once per distinct overload, arguments are bound as
    torch's deserializer binds them (positional or keyword by the recorded argument kind, else by the
    schema), weights are the mapped tensors the reader checked."""

    def __init__(self, nodes, signature, module_call_graph, state_dict, constants):
        self.graph = types.SimpleNamespace(nodes=nodes)
        self.graph_module = types.SimpleNamespace(graph=self.graph)
        self.graph_signature = signature
        self.module_call_graph = module_call_graph
        self.call_spec = types.SimpleNamespace(in_spec=module_call_graph[0].signature.in_spec,
                                               out_spec=module_call_graph[0].signature.out_spec)
        self.state_dict = state_dict
        self.constants = constants
        self.range_constraints: dict = {}


def from_table(program) -> tuple[TableProgram | None, str | None]:
    """(TableProgram, None) for a program load() returned whose graph the direct plan reads, else
    (None, why not). Runs the graph's checks first (their errors propagate, as at any first use).

    Covered: strided CPU tensors, ATen/prims/custom operators, SymInt arithmetic, and symbolic shapes
    whose inputs' sizes are plain symbols (bound and range-checked per call as from the program).
    Not covered (the reason names which): control-flow and region subgraphs, custom objects, tokens,
    symbolic inputs, input sizes recorded as expressions, other devices and layouts."""
    checked = getattr(program, "_checked", None)
    if checked is None:
        return None, "not a program loaded from a .pt2b file"
    c = checked.get()
    try:
        return _build(c), None
    except _Unplannable as e:
        return None, str(e)


def _build(c) -> TableProgram:
    ep = c.serialized
    gm = ep.graph_module
    if len(gm.module_call_graph) == 0 or gm.module_call_graph[0].signature is None:
        raise _Unplannable("the program records no call signature")
    kinds = {str(s.type) for s in gm.signature.input_specs} | {str(s.type) for s in gm.signature.output_specs}
    odd = kinds - {"user_input", "parameter", "buffer", "tensor_constant", "constant_input", "user_output",
                   "buffer_mutation", "user_input_mutation", "parameter_mutation", "loss_output"}
    if odd:
        raise _Unplannable(f"the signature holds {', '.join(sorted(odd))}")
    d = _serde.GraphModuleDeserializer()
    signature = d.deserialize_signature(gm.signature)
    module_call_graph = d.deserialize_module_call_graph(gm.module_call_graph)
    names = [s.arg.name for s in signature.input_specs]  # one per graph input, in order
    symbols = {name: sympy.Symbol(name, integer=True) for name in ep.range_constraints}
    program = TableProgram(_nodes(gm.graph, names, symbols), signature, module_call_graph, c.state_dict, c.constants)
    program.range_constraints = {  # as torch's deserializer reads them
        symbols[name]: ValueRanges(_serde.int_to_sympy_int(r.min_val, -int_oo), _serde.int_to_sympy_int(r.max_val, int_oo))
        for name, r in ep.range_constraints.items()}
    return program


def _spec(meta: S.TensorMeta, name: str, symbols: dict | None = None) -> TensorSpec:
    """The recorded tensor: static sizes as ints; a symbolic size as the text torch recorded (what
    in-place planning compares), or, for a graph input (``symbols`` given), as the plain symbol the
    input checks bind."""
    if meta.layout != S.Layout.Strided:
        raise _Unplannable(f"tensor {name!r} is not strided")
    device = meta.device
    if device.type != "cpu":
        raise _Unplannable(f"tensor {name!r} lies on {device.type}")
    sizes = tuple([_size(s, name, symbols) for s in meta.sizes])
    strides = tuple([_size(s, name, None) for s in meta.strides])
    return TensorSpec(_DTYPES[meta.dtype], sizes, strides)


def _size(s: S.SymInt, name: str, symbols: dict | None):
    if s.type == "as_int":
        return s.as_int
    text = s.as_expr.expr_str
    if symbols is None:
        return text
    plain = _PLAIN_SYMBOL.fullmatch(text)  # torch records a symbol as its srepr: Symbol('s0', positive=True, ...)
    if plain is None or plain.group(1) not in symbols:
        raise _Unplannable(f"input {name!r} has a size that is not a plain symbol ({text[:40]})")
    return symbols[plain.group(1)]


def _nodes(graph: S.Graph, input_names: list[str], symbols: dict) -> list:
    metas = graph.tensor_values
    by_name: dict[str, TableNode] = {}
    nodes: list[TableNode] = []
    ops: dict[str, object] = {}  # target text -> operator, resolved once per distinct overload

    def ref(name: str) -> TableNode:
        node = by_name.get(name)
        if node is None:
            raise _Unplannable(f"value {name!r} is read before it is made")
        return node

    if len(graph.inputs) != len(input_names):
        raise _Unplannable("the signature does not name every graph input")
    for arg, spec_name in zip(graph.inputs, input_names):
        if arg.type in _CONSTANTS:  # a constant input (None, a number, a string): its value as recorded
            by_name[spec_name] = node = TableNode(spec_name, "placeholder", spec_name, val=_argument(arg, ref))
            nodes.append(node)
            continue
        if arg.type != "as_tensor":
            raise _Unplannable(f"a graph input is {arg.type}")
        name = arg.as_tensor.name
        if name not in metas:
            raise _Unplannable(f"input {name!r} has no recorded tensor")
        by_name[name] = node = TableNode(name, "placeholder", name, val=_spec(metas[name], name, symbols))
        nodes.append(node)

    def value(arg: S.Argument):
        return _argument(arg, ref)

    for n in graph.nodes:
        target = ops.get(n.target)
        if target is None:
            target = ops[n.target] = _operator(n.target)
        outs = n.outputs
        if target in _SYM_OPS or target is torch.ops.aten.item.default:  # as torch reads them: positional
            args, kwargs = tuple(value(a.arg) for a in n.inputs), {}
        else:
            args, kwargs = _bind(target, n, value)
        if len(outs) == 1 and outs[0].type in _SYM_RESULTS:  # a SymInt/SymBool/SymFloat, by its name
            name = _symbol_name(outs[0].value, n.target)
            by_name[name] = node = TableNode(n.name or name, "call_function", target, args, kwargs)
            nodes.append(node)
            continue
        if target in _SYM_OPS or target is torch.ops.aten.item.default:
            raise _Unplannable(f"{n.target} returns {outs[0].type if outs else 'nothing'}")
        if len(outs) == 1 and outs[0].type == "as_tensor":
            name = outs[0].as_tensor.name
            node = TableNode(n.name or name, "call_function", target, args, kwargs, _result(metas, name))
            by_name[name] = node
            nodes.append(node)
            continue
        node = TableNode(n.name or f"{n.target.rsplit('.', 2)[-2]}_{len(nodes)}", "call_function", target, args,
                         kwargs)
        nodes.append(node)
        items = outs[0].as_tensors if len(outs) == 1 and outs[0].type == "as_tensors" else outs
        for i, item in enumerate(items):
            if isinstance(item, S.TensorArgument):
                name = item.name
            elif item.type == "as_tensor":
                name = item.as_tensor.name
            elif item.type == "as_none":
                continue
            else:
                raise _Unplannable(f"{n.target} returns {item.type}")
            by_name[name] = got = TableNode(name, "call_function", operator.getitem, (node, i), {},
                                            _result(metas, name))
            nodes.append(got)
    outputs = [value(a) for a in graph.outputs]
    nodes.append(TableNode("output", "output", "output", (outputs,)))
    return nodes


def _result(metas, name: str) -> TensorSpec:
    if name not in metas:
        raise _Unplannable(f"value {name!r} has no recorded tensor")
    return _spec(metas[name], name)


def _operator(text: str):
    """The OpOverload or SymInt-arithmetic function a node's target names (the checks at first use
    accepted it already)."""
    if text in _SYM_OP_NAMES:
        return _SYM_OP_NAMES[text]
    parts = text.split(".")
    if len(parts) != 5 or parts[:2] != ["torch", "ops"] or parts[2] == "higher_order":
        raise _Unplannable(f"the graph calls {text}")
    try:
        op = getattr(getattr(getattr(torch.ops, parts[2]), parts[3]), parts[4])
    except (AttributeError, RuntimeError):
        raise _Unplannable(f"{text} is not registered") from None
    if not isinstance(op, torch._ops.OpOverload):
        raise _Unplannable(f"the graph calls {text}")
    return op


def _bind(target, n: S.Node, value):
    """(args, kwargs) as torch's GraphModuleDeserializer.deserialize_inputs makes them."""
    actual = {a.name: value(a.arg) for a in n.inputs}
    kinds = {a.name: a.kind for a in n.inputs}
    args, kwargs = [], {}
    for a in target._schema.arguments:
        if a.name in actual:
            kind = kinds[a.name]
            if kind == _POSITIONAL:
                args.append(actual[a.name])
                continue
            if kind == _KEYWORD and not keyword.iskeyword(a.name):
                kwargs[a.name] = actual[a.name]
                continue
        if keyword.iskeyword(a.name):
            raise _Unplannable(f"{n.target} has an argument named {a.name!r}")
        if not a.has_default_value() and not a.kwarg_only:
            if a.name not in actual:
                raise _Unplannable(f"{n.target} lacks its argument {a.name!r}")
            args.append(actual[a.name])
        elif a.name in actual:
            kwargs[a.name] = actual[a.name]
    return tuple(args), kwargs


def _argument(arg: S.Argument, ref):
    """A node argument as torch's deserializer reads it (node references through ``ref``)."""
    kind, v = arg.type, arg.value
    if kind == "as_none":
        return None
    if kind == "as_tensor":
        return ref(v.name)
    if kind in ("as_int", "as_float", "as_bool", "as_string"):
        return v
    if kind == "as_scalar_type":
        return _DTYPES[v]
    if kind == "as_memory_format":
        return _MEMORY_FORMATS[v]
    if kind == "as_layout":
        return _LAYOUTS[v]
    if kind == "as_device":
        return _serde.deserialize_device(v)
    if kind == "as_complex":
        return complex(v.real, v.imag)
    if kind in ("as_ints", "as_floats", "as_bools", "as_strings"):
        return list(v)
    if kind == "as_tensors":
        return [ref(t.name) for t in v]
    if kind == "as_optional_tensors":
        out = []
        for t in v:
            if t.type == "as_none":
                out.append(None)
            elif t.type == "as_tensor":
                out.append(ref(t.as_tensor.name))
            else:
                raise _Unplannable(f"an optional tensor list holds {t.type}")
        return out
    if kind in ("as_sym_int", "as_sym_float", "as_sym_bool"):
        return _symbol(v, ref)
    if kind in ("as_sym_ints", "as_sym_floats", "as_sym_bools"):
        return [_symbol(x, ref) for x in v]
    raise _Unplannable(f"an argument is {kind}")


def _symbol(v, ref):
    """A SymInt/SymFloat/SymBool argument: its constant, or the node whose value it names."""
    if v.type == "as_name":  # (the other tags are the constant's: as_int, as_float or as_bool)
        return ref(v.value)
    return v.value


def _symbol_name(v, target: str) -> str:
    if v.type != "as_name":
        raise _Unplannable(f"{target} returns a constant {v.type}")
    return v.value
