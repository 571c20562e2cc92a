"""Builders for the semantic mutations: schema-tree edits (nodes calling callables, grown
expressions, tensor metadata, guards), packing with FlatBuffers offsets shared (one table referenced
many times: Program.methods over one exported_program, one subgraph under many nodes), and the
concrete attacks (``ATTACKS``) that tests/untrusted/test_fuzz_semantic.py replays as regressions.

Every builder returns the bytes of a whole artifact: a valid FlatBuffer with the program CRC and the
header CRC repaired (layout.with_program), so it reaches pt2b's checks, torch's deserializer, the
lowering and the runtime. Schema trees go through schema_tree (pt2b's own codec).
"""

from __future__ import annotations

import contextlib
import copy
import sys

import flatbuffers

from .layout import with_program
from .schema_tree import set_graph
from .seeds import Seed
from .semantic_values import HOP_CALLS, PYTHON_CALLS, SAVED_FILE, SHELL_COMMAND, grow_expr, symbols
from .values import Retry


# ---- schema-tree values ----
def argument(value, tensor: str):
    """torch's schema Argument of a template value: "T" a tensor of the graph, a callable spelled
    ("torch.os.system") given as ("OP", name), a dtype as ("DTYPE", ScalarType value), a list, or a literal."""
    from torch._export.serde import schema as S

    if isinstance(value, tuple) and value[0] == "OP":
        return S.Argument.create(as_operator=value[1])
    if isinstance(value, tuple) and value[0] == "DTYPE":
        return S.Argument.create(as_scalar_type=S.ScalarType(value[1]))
    if value == "T":
        return S.Argument.create(as_tensor=S.TensorArgument(name=tensor))
    if value is None:
        return S.Argument.create(as_none=True)
    if isinstance(value, bool):
        return S.Argument.create(as_bool=value)
    if isinstance(value, int):
        return S.Argument.create(as_int=value)
    if isinstance(value, float):
        return S.Argument.create(as_float=value)
    if isinstance(value, str):
        return S.Argument.create(as_string=value)
    if isinstance(value, list):
        if all(v == "T" for v in value):
            return S.Argument.create(as_tensors=[S.TensorArgument(name=tensor) for _ in value])
        if all(isinstance(v, str) for v in value):
            return S.Argument.create(as_strings=list(value))
        if all(isinstance(v, int) and not isinstance(v, bool) for v in value):
            return S.Argument.create(as_ints=list(value))
        raise Retry
    raise Retry


def positional(values, tensor: str) -> list:
    from torch._export.serde import schema as S

    return [S.NamedArgument(name="", arg=argument(v, tensor), kind=S.ArgumentKind.POSITIONAL) for v in values]


def payload(callable_name: str) -> list:
    """The arguments that make ``callable_name`` act (PYTHON_CALLS); a tensor for an op."""
    return list(PYTHON_CALLS.get(callable_name, ["T"]))


def hop_arguments(hop: str, callables: list[str], args: list) -> list:
    """The template values of a call of higher-order op ``hop`` (HOP_CALLS) with its callable slots
    filled from ``callables`` (cycled) and the callable's own arguments ``args``."""
    out, k = [], 0
    for slot in HOP_CALLS.get(hop, ["OP", "ARGS"]):
        if slot == "OP":
            out.append(("OP", callables[k % len(callables)]))
            k += 1
        elif slot == "ARGS":
            out.extend(args)
        elif slot == "ARGS_LIST":
            lists = [a for a in args if a == "T"]
            strings = [a for a in args if isinstance(a, str) and a != "T"]
            out.append(lists if len(lists) >= len(strings) and lists else strings)
            out.extend(a for a in args if not isinstance(a, str))
        else:
            out.append(copy.deepcopy(slot))
    return out


def new_node(target: str, inputs: list, name: str, outputs=None):
    from torch._export.serde import schema as S

    return S.Node(target=target, inputs=inputs, outputs=outputs or [S.Argument.create(as_none=True)],
                  metadata={}, is_hop_single_tensor_return=None, name=name)


def first_tensor_input(ep, user: bool = True) -> str:
    """The name of the graph's first user-input tensor (else its first tensor placeholder)."""
    sig = ep.graph_module.signature
    for spec in sig.input_specs:
        if user and spec.type == "user_input" and spec.value.arg.type == "as_tensor":
            return spec.value.arg.value.name
    for a in ep.graph_module.graph.inputs:
        if a.type == "as_tensor":
            return a.value.name
    raise Retry


def insert_node(ep, node, position: str = "first") -> None:
    nodes = ep.graph_module.graph.nodes
    taken = {n.name for n in nodes}
    base, k = node.name, 0
    while node.name in taken:
        k += 1
        node.name = f"{base}_{k}"
    i = 0 if position == "first" else (max(0, len(nodes) - 1) if position == "last" else len(nodes) // 2)
    nodes.insert(i, node)


# ---- packing ----
def pack_schema(s: Seed, tree, ep) -> bytearray:
    """The artifact of seed ``s`` with its program's schema tree replaced by ``ep``."""
    from exporter.errors import ExportError

    try:
        set_graph(tree, ep)
    except (ExportError, TypeError, ValueError, AttributeError, KeyError, AssertionError, OverflowError,
            RecursionError):
        raise Retry from None
    return pack_tree(s, tree)


def pack_tree(s: Seed, tree) -> bytearray:
    from exporter.layout.container import FILE_IDENTIFIER

    try:
        b = flatbuffers.Builder(1 << 16)
        b.Finish(tree.Pack(b), file_identifier=FILE_IDENTIFIER)
    except Exception:  # a value out of its field's range
        raise Retry from None
    return with_program(s, bytes(b.Output()))


class Prepacked:
    """Stands in an object-API tree for a table already in the builder: Pack answers its offset,
    so every field set to it points at the one table."""

    def __init__(self, offset: int):
        self.offset = offset

    def Pack(self, builder) -> int:  # noqa: N802 (flatc's name)
        return self.offset


@contextlib.contextmanager
def shared_tables(types: tuple):
    """While active, pt2b's schema encoder packs each object of ``types`` once per builder: a
    second reference to the same Python object reuses the first's offset (a DAG in the buffer)."""
    from exporter.serialize.write import encode_schema

    original = encode_schema.pack
    memo: dict[tuple[int, int], int] = {}

    def pack(builder, obj):
        if isinstance(obj, types):
            key = (id(builder), id(obj))
            if key not in memo:
                memo[key] = original(builder, obj)
            return memo[key]
        return original(builder, obj)

    encode_schema.pack = pack
    try:
        yield
    finally:
        encode_schema.pack = original


def pack_shared_schema(s: Seed, tree, ep, types: tuple) -> bytearray:
    """pack_schema with every object of ``types`` in ``ep`` packed once and shared."""
    from exporter.serialize.write import encode_schema
    from exporter.layout.container import FILE_IDENTIFIER

    try:
        with shared_tables(types):
            b = flatbuffers.Builder(1 << 16)
            off = encode_schema.pack(b, ep)
            tree.exportedProgram = Prepacked(off)
            b.Finish(tree.Pack(b), file_identifier=FILE_IDENTIFIER)
    except Retry:
        raise
    except Exception:
        raise Retry from None
    return with_program(s, bytes(b.Output()))


def pack_shared_methods(s: Seed, n: int, share_vectors: bool = True, tree=None) -> bytearray:
    """Seed ``s`` with ``n`` more methods (Program.methods, format 1.2), every one pointing at the
    root's one exported_program table (and, with ``share_vectors``, at its one tensor-record and
    op-table vectors): the file grows by a few bytes per method, a per-method walk n-fold."""
    from exporter.layout.container import FILE_IDENTIFIER
    from exporter.layout.generated import pt2b_generated as G

    tree = tree or s.program_tree()
    b = flatbuffers.Builder(1 << 16)
    graph = tree.exportedProgram.Pack(b)

    def vector(items):
        offs = [x.Pack(b) for x in items]
        b.StartVector(4, len(offs), 4)
        for o in reversed(offs):
            b.PrependUOffsetTRelative(o)
        return b.EndVector()

    shared = (vector(tree.tensors or []), vector(tree.operators or [])) if share_vectors else None
    ir = b.CreateString(tree.irLevel or "")
    spec = b.CreateString(tree.exampleInputsSpec) if tree.exampleInputsSpec is not None else None
    leaves = b.CreateNumpyVector(tree.exampleInputsLeaves) if tree.exampleInputsLeaves is not None else None
    methods = []
    for i in range(n):
        tensors, operators = shared or (vector(tree.tensors or []), vector(tree.operators or []))
        name = b.CreateString(f"m{i}")
        G.MethodStart(b)
        G.MethodAddName(b, name)
        G.MethodAddIrLevel(b, ir)
        G.MethodAddExportedProgram(b, graph)
        G.MethodAddTensors(b, tensors)
        G.MethodAddOperators(b, operators)
        if spec is not None:
            G.MethodAddExampleInputsSpec(b, spec)
        if leaves is not None:
            G.MethodAddExampleInputsLeaves(b, leaves)
        methods.append(Prepacked(G.MethodEnd(b)))
    tree.exportedProgram = Prepacked(graph)
    tree.methods = methods
    b.Finish(tree.Pack(b), file_identifier=FILE_IDENTIFIER)
    return with_program(s, bytes(b.Output()))


# ---- schema edits used by several kinds ----
def add_ranges(ep, syms, lo: int = 2, hi: int | None = 64) -> None:
    from torch._export.serde import schema as S

    for sym in syms:
        ep.range_constraints[sym] = S.RangeConstraint(min_val=lo, max_val=hi)


def sym_int(expr: str, hint: int | None = 4):
    from torch._export.serde import schema as S

    hint = None if hint is None else S.SymExprHint.create(as_int=hint)
    return S.SymInt.create(as_expr=S.SymExpr(expr_str=expr, hint=hint))


def int_list(values):
    from torch._export.serde import schema as S

    return [copy.deepcopy(v) if isinstance(v, S.SymInt) else S.SymInt.create(as_int=int(v)) for v in values]


def cond_inputs(graph, tensor: str, label) -> list:
    """The inputs of cond(True, graph, graph, [tensor]): both branches the one Graph object."""
    from torch._export.serde import schema as S

    def branch(kind):
        return S.Argument.create(as_graph=S.GraphArgument(name=f"{kind}_graph_{label}", graph=graph))

    return [S.NamedArgument(name="", arg=a, kind=S.ArgumentKind.POSITIONAL)
            for a in (S.Argument.create(as_bool=True), branch("true"), branch("false"), argument(["T"], tensor))]


def cond_dag(ep, depth: int, tensor: str):
    """A Graph whose one node is a cond over two references to the Graph one level down, ``depth``
    levels: packed with Graph tables shared, the buffer grows linearly, a walk 2**depth-fold."""
    from torch._export.serde import schema as S

    meta = copy.deepcopy(ep.graph_module.graph.tensor_values[tensor])
    g = S.Graph(inputs=[argument("T", "a")], outputs=[argument("T", "a")], nodes=[],
                tensor_values={"a": meta}, sym_int_values={}, sym_bool_values={}, is_single_tensor_return=False,
                custom_obj_values={}, sym_float_values={})
    for level in range(depth):
        node = new_node("torch.ops.higher_order.cond", cond_inputs(g, "a", level), f"cond_{level}",
                        outputs=[S.Argument.create(as_tensors=[S.TensorArgument(name="b")])])
        g = S.Graph(inputs=[argument("T", "a")], outputs=[argument("T", "b")], nodes=[node],
                    tensor_values={"a": meta, "b": meta}, sym_int_values={}, sym_bool_values={},
                    is_single_tensor_return=False, custom_obj_values={}, sym_float_values={})
    return g


def cond_chain(ep, depth: int, tensor: str):
    """A Graph whose one node is a cond over the Graph one level down and a node-less leaf Graph,
    ``depth`` levels: each subgraph nested in the one before (a walk visits each once)."""
    from torch._export.serde import schema as S

    leaf = g = cond_dag(ep, 0, tensor)
    for level in range(depth):
        inputs = cond_inputs(g, "a", level)
        inputs[2].arg = S.Argument.create(as_graph=S.GraphArgument(name=f"false_graph_{level}", graph=leaf))
        node = new_node("torch.ops.higher_order.cond", inputs, f"cond_{level}", outputs=[argument(["T"], "b")])
        g = copy.copy(leaf)
        g.nodes, g.outputs = [node], [argument("T", "b")]
        g.tensor_values = dict(leaf.tensor_values, b=leaf.tensor_values["a"])
    return g


@contextlib.contextmanager
def deep_recursion(limit: int = 100_000):
    """Packing a structure nested thousands deep: the encoder recurses once per level (Python frames
    only), so the interpreter's limit is raised while building, and restored before the mutant runs."""
    old = sys.getrecursionlimit()
    sys.setrecursionlimit(max(old, limit))
    try:
        yield
    finally:
        sys.setrecursionlimit(old)


# ---- the concrete attacks (name -> (seed model, builder(seed) -> (bytes, description))) ----
def attack_foreach_map_system(s: Seed):
    """A node calling torch.ops.higher_order.foreach_map(as_operator="torch.os.system", "touch ...")."""
    tree = s.program_tree()
    ep = s.schema_tree(tree)
    x = first_tensor_input(ep)
    insert_node(ep, new_node("torch.ops.higher_order.foreach_map",
                             positional([("OP", "torch.os.system"), SHELL_COMMAND], x), "foreach_map"))
    return pack_schema(s, tree, ep), f"foreach_map(as_operator='torch.os.system', {SHELL_COMMAND!r})"


def attack_torch_save(s: Seed):
    """A node whose arguments hold as_operator="torch.save", a tensor and a path (writes a file)."""
    tree = s.program_tree()
    ep = s.schema_tree(tree)
    x = first_tensor_input(ep)
    insert_node(ep, new_node("torch.ops.higher_order.foreach_map",
                             positional([("OP", "torch.save"), "T", SAVED_FILE], x), "foreach_map"))
    return pack_schema(s, tree, ep), f"foreach_map(as_operator='torch.save', {x}, {SAVED_FILE!r})"


def attack_shared_methods(s: Seed, n: int = 1000):
    return pack_shared_methods(s, n), f"{n} methods sharing the one exported_program table"


def attack_shared_subgraph(s: Seed, depth: int = 40):
    """A cond node over a DAG of shared subgraphs, 2**depth paths through ``depth`` tables."""
    from torch._export.serde import schema as S

    tree = s.program_tree()
    ep = s.schema_tree(tree)
    x = first_tensor_input(ep)
    g = cond_dag(ep, depth, x)
    node = new_node("torch.ops.higher_order.cond", cond_inputs(g, x, "top"), "cond_dag",
                    outputs=[S.Argument.create(as_tensors=[S.TensorArgument(name="cond_dag_out")])])
    ep.graph_module.graph.tensor_values["cond_dag_out"] = copy.deepcopy(ep.graph_module.graph.tensor_values[x])
    insert_node(ep, node, "last")
    return pack_shared_schema(s, tree, ep, (S.Graph,)), f"cond over a DAG of {depth} shared subgraphs ({2**depth} paths)"


def attack_expr_max(s: Seed, form: str = "max", n: int = 900, lo: int = 2, hi: int | None = 64,
                    value: str | None = None):
    """The first size of the first input's TensorMeta (or of value ``value``'s) set to a grown expression
    over up to ``n`` symbols, each with the range [lo, hi], within MAX_EXPR_LEN."""
    tree = s.program_tree()
    ep = s.schema_tree(tree)
    syms = symbols(n)
    expr = grow_expr(form, syms)
    used = [x for x in syms if x in expr]
    x = value or first_tensor_input(ep)
    ep.graph_module.graph.tensor_values[x].sizes[0] = sym_int(expr)
    add_ranges(ep, used, lo, hi)
    return pack_schema(s, tree, ep), (f"{x}.size(0) = {form} over {len(used)} symbols ({len(expr)} chars), "
                                      f"ranges [{lo}, {hi}]")


def attack_huge_weight(s: Seed):
    """A stored weight's record set to sizes [2**62, 2**62], strides [0, 0]."""
    tree = s.program_tree()
    rec = next(r for r in tree.tensors if r.kind == 0 and len(r.sizes) == 2)
    rec.sizes, rec.strides = [2**62, 2**62], [0, 0]
    return pack_tree(s, tree), f"weight {rec.name!r}: sizes [2**62, 2**62], strides [0, 0]"


def attack_huge_example_input(s: Seed):
    """The stored example input set to 2**40 rows of stride 0 (its graph metadata left as it was)."""
    tree = s.program_tree()
    rec = next(r for r in tree.tensors if r.kind == 3)
    rec.sizes = [2**40] + [int(v) for v in rec.sizes[1:]]
    rec.strides = [0] + [int(v) for v in rec.strides[1:]]
    return pack_tree(s, tree), f"example input {rec.name!r}: sizes {list(rec.sizes)}, stride 0"


def attack_huge_meta(s: Seed):
    """The graph's TensorMeta of the first input set to sizes [2**62, 2**62], strides [0, 0]."""
    tree = s.program_tree()
    ep = s.schema_tree(tree)
    x = first_tensor_input(ep)
    meta = ep.graph_module.graph.tensor_values[x]
    meta.sizes, meta.strides = int_list([2**62, 2**62]), int_list([0, 0])
    return pack_schema(s, tree, ep), f"TensorMeta {x}: sizes [2**62, 2**62], strides [0, 0]"


def attack_many_guards(s: Seed, n: int = 500, length: int = 4000):
    """guards_code: ``n`` true, torch-like guards of ~``length`` characters each."""
    import random

    from .semantic_values import guard_text

    tree = s.program_tree()
    ep = s.schema_tree(tree)
    arg = ep.graph_module.module_call_graph[0].signature.forward_arg_names[0]
    rng = random.Random(0)
    ep.guards_code = [guard_text(rng, arg, 2, length) for _ in range(n)]
    return pack_schema(s, tree, ep), f"{n} guards of ~{length} chars over L[{arg!r}]"


ATTACKS = {
    "foreach_map_system": ("mlp", attack_foreach_map_system),
    "torch_save": ("mlp", attack_torch_save),
    "shared_methods": ("mlp", attack_shared_methods),
    "shared_subgraph": ("cond", attack_shared_subgraph),
    "expr_max": ("mlp", attack_expr_max),
    "expr_nested": ("mlp", lambda s: attack_expr_max(s, "nested")),
    "expr_floordiv": ("mlp", lambda s: attack_expr_max(s, "floordiv_chain", 64, 0, None, "relu")),
    "expr_product": ("mlp", lambda s: attack_expr_max(s, "product", 32, 0, None, "p_fc2_weight")),
    "huge_weight": ("mlp", attack_huge_weight),
    "huge_example_input": ("mlp", attack_huge_example_input),
    "huge_meta": ("mlp", attack_huge_meta),
    "many_guards": ("mlp", attack_many_guards),
}
