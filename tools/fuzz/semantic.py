"""The semantic mode's mutations (``python -m tools.fuzz --semantic``): edits of the decoded program's
meaning, each packed into a valid FlatBuffer with both CRCs repaired (semantic_build), so every mutant
gets past the checksums and the FlatBuffers parser. Mutant ``index`` of seed ``seed`` depends only on
(seed, index) and the seed artifacts (its own random stream, apart from the byte mode's).

Kinds (``SEMANTIC_KINDS``: name -> weight in percent), by family:
  callables (semantic_values: (a) aten ops, (b) higher-order ops taking callables, (c) Python paths,
  each with arguments that make it act: ``touch PT2B_FUZZ_CANARY``, torch.save to a relative path):
    callable_hop_operator   a new node calling a higher-order op (foreach_map most often) whose
                            callable slots are Argument.as_operator strings of the three pools
    callable_node_target    an existing node's target swapped for a pool entry (its inputs kept, or
                            replaced by the entry's acting arguments)
    callable_as_operator    an argument of an existing node retagged as_operator, or as_operator
                            (+ acting arguments) appended
    callable_save           as_operator="torch.save" (or torch.os.makedirs) with a tensor and a path
    callable_hop_swap       an existing higher-order op's target swapped, or its subgraphs replaced by
                            as_operator callables (seeds holding one: cond)
  shared tables (FlatBuffers offsets reused: the file stays small, a walk multiplies):
    shared_methods          2..1000 Program.methods all pointing at the root's one exported_program
                            (optionally its one tensor-record and op-table vectors too)
    shared_subgraph         one Graph table under many cond nodes, or a DAG of conds 2**depth deep
  expressions (symbols s1000.., most with a range each; 512..8192 characters, most within MAX_EXPR_LEN
  (4096); counts around the reader's limits: 8 Max/Min arguments, 128 levels of nesting):
    expr_max                Max/Min over many symbols (also srepr spelling, Max of sums)
    expr_nested             Max(Min(Max(...))) nested 8..400 deep, FloorDiv/CeilDiv/Mod/PythonMod chains
    expr_long               long sums, products, sums of products; placed in a TensorMeta size,
                            sym_int_values, a range-constraint key or a node's SymInt argument
  sizes (values at/over int64's limits, products that overflow, negatives, stride 0):
    size_graph_meta         a graph TensorMeta's sizes/strides/storage_offset
    size_tensor_record      a stored weight's TensorRecord (optionally its graph meta to match)
    size_example_input      a stored example input's record (e.g. 2**40 rows of stride 0)
  guards:
    guards_many             50..500 true torch-like guards of ~1..4 KB each
    guards_false            the same with one guard false for the seed's inputs
  nesting (every recursive structure of the file, 64..10,000 deep; NEST_DEPTHS):
    nest_example_input      the stored example inputs' treespec (lists, tuples, dicts around a leaf),
                            or a literal leaf's msgpack value (arrays or maps)
    nest_metadata           the user metadata (msgpack) with a value nested in arrays or maps
    nest_treespec           the module call graph's in_spec / out_spec
    nest_schema             an op-table schema string whose argument type nests parentheses, lists,
                            optionals, Dicts, tuples or Futures, up to the 64 KB a record holds
    nest_graph              a node argument of as_string_to_argument maps inside maps, or a chain of
                            cond subgraphs each inside the one before
    nest_expr               a size expression of nested parentheses, unary minus, Max or FloorDiv
  C++ parsers (what torch parses in C++ from the file's strings):
    parser_schema           an op-table schema string of odd content (huge names and literals,
                            control characters, unbalanced brackets, thousands of arguments), to 64 KB
    parser_device           a TensorMeta's or a device argument's device type/index (odd strings,
                            out-of-range indexes), or a dtype/layout/memory format out of its enum
  regions (pairs that a file can break, and the state they leave behind):
    region_unpaired         a lone _set_grad_enabled(False/True), a lone _enter_autocast("cpu",
                            bfloat16...), an _exit_autocast without its enter, or two enters
  control:
    identity                the seed re-packed unchanged (must run as the seed does)
"""

from __future__ import annotations

import copy
import hashlib
import random

from .mutators import Mutant
from .seeds import Seed
from .semantic_build import (
    ATTACKS, add_ranges, attack_shared_subgraph, cond_chain, cond_dag, cond_inputs, deep_recursion, first_tensor_input,
    hop_arguments, insert_node, int_list, new_node, pack_schema, pack_shared_methods, pack_shared_schema, pack_tree, payload, positional,
    sym_int)
from .semantic_values import (
    ATEN_TARGETS, HOP_TARGETS, MADE_DIR, NEST_DEPTHS, ODD_DEVICE_INDEXES, ODD_DEVICES, ODD_ENUMS, PYTHON_TARGETS,
    SAVED_FILE, SCHEMA_MAX, SCHEMA_NESTINGS, SIZE_SHAPES, STORAGE_OFFSETS, grow_expr, guard_text, nested_msgpack,
    nested_schema, nested_spec, odd_schemas, symbols)
from .values import Retry

SEMANTIC_KINDS = {
    "callable_hop_operator": 10,
    "callable_node_target": 6,
    "callable_as_operator": 5,
    "callable_save": 4,
    "callable_hop_swap": 4,
    "shared_methods": 6,
    "shared_subgraph": 5,
    "expr_max": 4,
    "expr_nested": 4,
    "expr_long": 3,
    "size_graph_meta": 5,
    "size_tensor_record": 4,
    "size_example_input": 4,
    "guards_many": 6,
    "guards_false": 2,
    "nest_example_input": 3,
    "nest_metadata": 3,
    "nest_treespec": 2,
    "nest_schema": 3,
    "nest_graph": 2,
    "nest_expr": 2,
    "parser_schema": 3,
    "parser_device": 2,
    "region_unpaired": 4,
    "identity": 4,
}
assert sum(SEMANTIC_KINDS.values()) == 100
FAMILIES = {"callable": "callables", "shared": "shared tables", "expr": "expressions", "size": "sizes",
            "guards": "guards", "nest": "nesting", "parser": "C++ parsers", "region": "regions",
            "identity": "control"}
ATTACK_SEED = -1  # Mutant.seed of a named concrete attack (semantic_build.ATTACKS)


def family(kind: str) -> str:
    return FAMILIES.get(kind.split("_")[0], "?")


def _needs_hop(s: Seed) -> bool:
    return any(t.startswith("torch.ops.higher_order.") for t in s.strings)


class SemanticMutator:
    """Semantic mutant ``index`` of seed ``seed`` over the given seed artifacts (name -> bytes)."""

    def __init__(self, seeds: dict[str, bytes]):
        self.names = sorted(seeds)
        self.seeds = {n: Seed(n, seeds[n]) for n in self.names}
        self._kinds = list(SEMANTIC_KINDS)
        self._weights = [SEMANTIC_KINDS[k] for k in self._kinds]

    @staticmethod
    def rng_for(seed: int, index: int) -> random.Random:
        h = hashlib.sha256(f"pt2b-fuzz-semantic:{seed}:{index}".encode()).digest()
        return random.Random(int.from_bytes(h[:16], "little"))

    def mutant(self, seed: int, index: int, kind: str | None = None) -> Mutant:
        rng = self.rng_for(seed, index)
        drawn = rng.choices(self._kinds, self._weights)[0]
        kind = kind or drawn
        names = [n for n in self.names if kind != "callable_hop_swap" or _needs_hop(self.seeds[n])]
        if not names:
            kind, names = "callable_hop_operator", self.names
        model = rng.choice(names)
        verify = rng.random() < 0.5
        s = self.seeds[model]
        for _ in range(20):
            try:
                data, desc = getattr(self, "_m_" + kind)(rng, s)
                break
            except Retry:
                continue
        else:
            kind = "identity"
            data, desc = self._m_identity(rng, s)
        return Mutant(seed, index, model, kind, desc, bytes(data), verify, "core")

    def attack(self, name: str) -> Mutant:
        """The named concrete attack (semantic_build.ATTACKS) as a mutant (seed ATTACK_SEED, index = its
        position in ATTACKS)."""
        model, build = ATTACKS[name]
        data, desc = build(self.seeds[model])
        return Mutant(ATTACK_SEED, list(ATTACKS).index(name), model, f"attack:{name}", desc, bytes(data), False, "core")

    # ---- callables ----
    @staticmethod
    def _callable(rng, weights=(0.6, 0.2, 0.2)) -> str:
        pool = rng.choices((PYTHON_TARGETS, HOP_TARGETS, ATEN_TARGETS), weights)[0]
        return rng.choice(pool)

    def _m_callable_hop_operator(self, rng, s):
        tree = s.program_tree()
        ep = s.schema_tree(tree)
        x = first_tensor_input(ep, user=rng.random() < 0.8)
        hop = "foreach_map" if rng.random() < 0.35 else rng.choice(HOP_TARGETS).rsplit(".", 1)[1]
        callables = [self._callable(rng) for _ in range(2)]
        values = hop_arguments(hop, callables, payload(callables[0]))
        insert_node(ep, new_node(f"torch.ops.higher_order.{hop}", positional(values, x), hop),
                    rng.choice(("first", "first", "middle", "last")))
        return pack_schema(s, tree, ep), f"new node {hop}({', '.join(_show(v) for v in values)})"

    def _m_callable_node_target(self, rng, s):
        tree = s.program_tree()
        ep = s.schema_tree(tree)
        node = rng.choice(_all_nodes(ep))
        old = node.target
        node.target = self._callable(rng, (0.45, 0.25, 0.3))
        x = first_tensor_input(ep)
        how = "inputs kept"
        if rng.random() < 0.5:
            node.inputs = positional(payload(node.target), x)
            how = "inputs " + ", ".join(_show(v) for v in payload(node.target))
        return pack_schema(s, tree, ep), f"node {node.name}: target {old} -> {node.target} ({how})"

    def _m_callable_as_operator(self, rng, s):
        from torch._export.serde import schema as S

        tree = s.program_tree()
        ep = s.schema_tree(tree)
        node = rng.choice(_all_nodes(ep))
        op = self._callable(rng)
        x = first_tensor_input(ep)
        if node.inputs and rng.random() < 0.5:
            i = rng.randrange(len(node.inputs))
            node.inputs[i].arg = S.Argument.create(as_operator=op)
            desc = f"node {node.name}: input {i} -> as_operator={op!r}"
        else:
            extra = [("OP", op)] + (payload(op) if rng.random() < 0.7 else [])
            node.inputs = list(node.inputs) + positional(extra, x)
            desc = f"node {node.name}: inputs += {', '.join(_show(v) for v in extra)}"
        return pack_schema(s, tree, ep), desc

    def _m_callable_save(self, rng, s):
        tree = s.program_tree()
        ep = s.schema_tree(tree)
        x = first_tensor_input(ep, user=rng.random() < 0.5)
        op, args = rng.choice((("torch.save", ["T", SAVED_FILE]), ("torch.save", ["T", SAVED_FILE]),
                               ("torch.os.makedirs", [MADE_DIR])))
        how = rng.choice(("hop", "hop", "target", "extra"))
        if how == "hop":
            hop = rng.choice(("foreach_map", "foreach_map", "wrap", "tag_activation_checkpoint", "flat_apply",
                              "dynamo_bypassing_wrapper", "invoke_subgraph", "with_effects", "map_impl"))
            values = hop_arguments(hop, [op], args)
            insert_node(ep, new_node(f"torch.ops.higher_order.{hop}", positional(values, x), hop))
            desc = f"new node {hop}({', '.join(_show(v) for v in values)})"
        elif how == "target":
            insert_node(ep, new_node(op, positional(args, x), "save"))
            desc = f"new node {op}({', '.join(_show(v) for v in args)})"
        else:
            node = rng.choice(_all_nodes(ep))
            node.inputs = list(node.inputs) + positional([("OP", op)] + args, x)
            desc = f"node {node.name}: inputs += as_operator={op!r}, {', '.join(_show(v) for v in args)}"
        return pack_schema(s, tree, ep), desc

    def _m_callable_hop_swap(self, rng, s):
        from torch._export.serde import schema as S

        tree = s.program_tree()
        ep = s.schema_tree(tree)
        hops = [n for n in _all_nodes(ep) if n.target.startswith("torch.ops.higher_order.")]
        if not hops:
            raise Retry
        node = rng.choice(hops)
        if rng.random() < 0.4:
            old, node.target = node.target, rng.choice(HOP_TARGETS)
            return pack_schema(s, tree, ep), f"node {node.name}: target {old} -> {node.target}"
        op = self._callable(rng, (0.7, 0.15, 0.15))
        graphs = [i for i, a in enumerate(node.inputs) if a.arg.type == "as_graph"] or [0]
        for i in graphs if rng.random() < 0.5 else [rng.choice(graphs)]:
            node.inputs[i].arg = S.Argument.create(as_operator=op)
        acting = [v for v in payload(op) if v != "T"]
        if acting:
            node.inputs = list(node.inputs) + positional(acting, first_tensor_input(ep))
        return pack_schema(s, tree, ep), f"node {node.name} ({node.target}): subgraphs -> as_operator={op!r}" + (
            f", + {acting!r}" if acting else "")

    # ---- shared tables ----
    def _m_shared_methods(self, rng, s):
        n = rng.choice((2, 3, 16, 64, 200, 500, 1000))
        share = rng.random() < 0.5
        return pack_shared_methods(s, n, share_vectors=share), (
            f"{n} methods over the one exported_program table" + (", tensor and op vectors shared" if share else ""))

    def _m_shared_subgraph(self, rng, s):
        from torch._export.serde import schema as S

        if rng.random() < 0.5:
            depth = rng.choice((2, 4, 8, 16, 24, 40))
            data, desc = attack_shared_subgraph(s, depth)
            return data, desc
        tree = s.program_tree()
        ep = s.schema_tree(tree)
        hops = [n for n in ep.graph_module.graph.nodes if any(a.arg.type == "as_graph" for a in n.inputs)]
        k = rng.choice((2, 8, 64, 500))
        if hops:  # the existing cond copied k times over the same subgraph objects
            node = rng.choice(hops)
            nodes = ep.graph_module.graph.nodes
            for j in range(k):
                c = copy.copy(node)
                c.name = f"{node.name}_dup{j}"
                c.outputs = [S.Argument.create(as_none=True)]
                nodes.insert(nodes.index(node) + 1, c)
            what = f"node {node.name} copied {k} times, its subgraphs shared"
        else:
            x = first_tensor_input(ep)
            g = cond_dag(ep, 1, x)
            for j in range(k):
                insert_node(ep, new_node("torch.ops.higher_order.cond", cond_inputs(g, x, j), f"cond_shared{j}"), "last")
            what = f"{k} new cond nodes over one shared subgraph"
        return pack_shared_schema(s, tree, ep, (S.Graph,)), what

    # ---- expressions ----
    def _expr(self, rng, s, forms, counts):
        from torch._export.serde import schema as S

        tree = s.program_tree()
        ep = s.schema_tree(tree)
        form = rng.choice(forms)
        syms = symbols(rng.choice(counts), prefix=rng.choice(("s", "s", "u", "q")))
        limit = rng.choice((512, 2048, 4000, 4096, 4096, 4097, 8192))
        expr = grow_expr(form, syms, limit)
        used = [x for x in syms if x in expr]
        g = ep.graph_module.graph
        where = rng.choice(("meta", "meta", "sym_int_values", "range_key", "all"))
        placed = []
        if where in ("meta", "all"):
            metas = [(k, m) for k, m in g.tensor_values.items() if m.sizes]
            k, m = rng.choice(metas)
            m.sizes[rng.randrange(len(m.sizes))] = sym_int(expr, rng.choice((4, 2, None)))
            placed.append(f"{k}.size")
        if where in ("sym_int_values", "all"):
            if g.sym_int_values:
                k = rng.choice(sorted(g.sym_int_values))
            else:
                k = "sym_size_int_fuzz"
            g.sym_int_values[k] = sym_int(expr, 4)
            placed.append(f"sym_int_values[{k}]")
        if where in ("range_key", "all") or not placed:
            ep.range_constraints[expr] = S.RangeConstraint(min_val=2, max_val=64)
            placed.append("range key")
        lo, hi = rng.choice(((2, 64), (2, 64), (0, None), (1, 2**62), (-(2**63), 2**63 - 1)))
        if rng.random() < 0.9:
            add_ranges(ep, used, lo, hi)
        return pack_schema(s, tree, ep), (f"{form} over {len(used)} symbols ({len(expr)} chars) in "
                                          f"{', '.join(placed)}; ranges [{lo}, {hi}]")

    def _m_expr_max(self, rng, s):
        return self._expr(rng, s, ("max", "min_max", "srepr", "max_of_sums"), (3, 8, 9, 64, 300, 900))

    def _m_expr_nested(self, rng, s):
        return self._expr(rng, s, ("nested", "nested_right", "floordiv_chain", "ceildiv_chain", "mod_chain",
                                       "pythonmod_chain"), (8, 12, 16, 50, 64, 120, 190, 400))

    def _m_expr_long(self, rng, s):
        return self._expr(rng, s, ("sum", "product", "sum_of_products"), (16, 64, 120, 127, 200, 900))

    # ---- sizes ----
    @staticmethod
    def _shape(rng, sizes, strides):
        new_sizes, new_strides = rng.choice(SIZE_SHAPES)
        sizes, strides = list(sizes), list(strides)
        def fill(new, old):  # "=": the original entry (1 past its end)
            return [(old[i] if i < len(old) else 1) if v == "=" else v for i, v in enumerate(new)]
        return fill(new_sizes, sizes), fill(new_strides, strides)

    def _m_size_graph_meta(self, rng, s):
        tree = s.program_tree()
        ep = s.schema_tree(tree)
        g = ep.graph_module.graph
        k = rng.choice(sorted(g.tensor_values))
        m = g.tensor_values[k]
        sizes, strides = self._shape(rng, m.sizes, m.strides)  # "=" entries keep their SymInt
        m.sizes, m.strides = int_list(sizes), int_list(strides)
        sizes, strides = _plain(sizes), _plain(strides)
        off = ""
        if rng.random() < 0.3:
            off = rng.choice(STORAGE_OFFSETS)
            m.storage_offset = int_list([off])[0]
        return pack_schema(s, tree, ep), f"TensorMeta {k}: sizes {sizes}, strides {strides}" + (
            f", storage_offset {off}" if off != "" else "")

    def _record(self, rng, s, example: bool):
        tree = s.program_tree()
        recs = [r for r in tree.tensors or [] if (r.kind == 3) == example]
        if not recs:
            raise Retry
        rec = rng.choice(recs)
        name = rec.name.decode() if isinstance(rec.name, bytes) else rec.name
        sizes, strides = self._shape(rng, [int(v) for v in rec.sizes], [int(v) for v in rec.strides])
        rec.sizes, rec.strides = sizes, strides
        desc = f"{'example input' if example else 'tensor'} record {name!r}: sizes {sizes}, strides {strides}"
        if rng.random() < 0.25:
            rec.storageOffset = rng.choice(STORAGE_OFFSETS)
            desc += f", storage_offset {rec.storageOffset}"
        if rng.random() < 0.5:  # the graph's metadata of the same value made to match
            ep = s.schema_tree(tree)
            arg = _placeholder_of(ep, name, example)
            if arg is not None:
                m = ep.graph_module.graph.tensor_values[arg]
                m.sizes, m.strides = int_list(sizes), int_list(strides)
                return pack_schema(s, tree, ep), desc + f"; TensorMeta {arg} to match"
        return pack_tree(s, tree), desc

    def _m_size_tensor_record(self, rng, s):
        return self._record(rng, s, example=False)

    def _m_size_example_input(self, rng, s):
        return self._record(rng, s, example=True)

    # ---- guards ----
    def _guards(self, rng, s, false: bool):
        tree = s.program_tree()
        ep = s.schema_tree(tree)
        args = list(ep.graph_module.module_call_graph[0].signature.forward_arg_names or [])
        if not args:
            raise Retry
        dims = {a: _rank(ep, a) for a in args}
        n = rng.choice((50, 100, 200, 500))
        length = rng.choice((1000, 2000, 4000, 4090))
        guards = [guard_text(rng, a, dims[a], length) for a in (rng.choice(args) for _ in range(n))]
        if false:
            a = rng.choice(args)
            guards[rng.randrange(n)] = f"L['{a}'].size()[0] == {2**40}"
        ep.guards_code = list(ep.guards_code or []) + guards
        desc = f"guards_code += {n} guards of ~{length} chars" + (", one false" if false else "")
        return pack_schema(s, tree, ep), desc

    def _m_guards_many(self, rng, s):
        return self._guards(rng, s, False)

    def _m_guards_false(self, rng, s):
        return self._guards(rng, s, True)

    # ---- nesting ----
    def _m_nest_example_input(self, rng, s):
        import msgpack

        tree = s.program_tree()
        depth = rng.choice(NEST_DEPTHS)
        spec = tree.exampleInputsSpec.decode() if isinstance(tree.exampleInputsSpec, bytes) else tree.exampleInputsSpec
        if not spec:
            raise Retry
        if rng.random() < 0.5:
            kind = rng.choice(("list", "tuple", "dict"))
            tree.exampleInputsSpec = nested_spec(spec, depth, kind)
            return pack_tree(s, tree), f"example inputs' treespec: a leaf inside {depth} nested {kind}s"
        leaves = msgpack.unpackb(bytes(tree.exampleInputsLeaves))
        kind = rng.choice(("list", "map"))
        body = b"".join(msgpack.packb(x) for x in leaves[1:])
        tree.exampleInputsLeaves = _ubytes(bytes([0x90 | len(leaves)]) + b"\x81\xa1v" + nested_msgpack(depth, kind) + body)
        return pack_tree(s, tree), f"example input 0: a literal value of {depth} nested msgpack {kind}s"

    def _m_nest_metadata(self, rng, s):
        tree = s.program_tree()
        depth, kind = rng.choice(NEST_DEPTHS), rng.choice(("list", "map"))
        tree.metadata = _ubytes(b"\x81\xa4user" + nested_msgpack(depth, kind))
        return pack_tree(s, tree), f"metadata {{'user': {depth} nested msgpack {kind}s}}"

    def _m_nest_treespec(self, rng, s):
        tree = s.program_tree()
        ep = s.schema_tree(tree)
        sig = ep.graph_module.module_call_graph[0].signature
        which, depth, kind = rng.choice(("in_spec", "out_spec")), rng.choice(NEST_DEPTHS), rng.choice(("list", "tuple", "dict"))
        try:
            setattr(sig, which, nested_spec(getattr(sig, which), depth, kind))
        except ValueError:
            raise Retry from None
        return pack_schema(s, tree, ep), f"module_call_graph[0].{which}: a leaf inside {depth} nested {kind}s"

    def _op_record(self, rng, s):
        tree = s.program_tree()
        recs = [r for r in tree.operators or [] if r.schema]
        if not recs:
            raise Retry
        return tree, rng.choice(recs)

    def _m_nest_schema(self, rng, s):
        tree, rec = self._op_record(rng, s)
        name = (rec.schema.decode() if isinstance(rec.schema, bytes) else rec.schema).split("(", 1)[0]
        form = rng.choice(sorted(SCHEMA_NESTINGS))
        length = rng.choice((256, 1024, 8192, 8192, SCHEMA_MAX - 1, SCHEMA_MAX, SCHEMA_MAX + 1))
        rec.schema = nested_schema(name, form, length)
        return pack_tree(s, tree), f"op record {name}: schema of {len(rec.schema)} chars, its type nested ({form})"

    def _m_nest_graph(self, rng, s):
        from torch._export.serde import schema as S

        tree = s.program_tree()
        ep = s.schema_tree(tree)
        depth = rng.choice(NEST_DEPTHS[:4])
        if rng.random() < 0.5:
            arg = S.Argument.create(as_int=1)
            for _ in range(depth):
                arg = S.Argument.create(as_string_to_argument={"k": arg})
            node = rng.choice(_all_nodes(ep))
            node.inputs = list(node.inputs) + [S.NamedArgument(name="nested", arg=arg, kind=S.ArgumentKind.KEYWORD)]
            with deep_recursion():
                return pack_schema(s, tree, ep), f"node {node.name}: an argument of {depth} nested string->argument maps"
        x = first_tensor_input(ep)
        g = cond_chain(ep, depth, x)
        out = "cond_chain_out"
        node = new_node("torch.ops.higher_order.cond", cond_inputs(g, x, "top"), "cond_chain",
                        outputs=[S.Argument.create(as_tensors=[S.TensorArgument(name=out)])])
        ep.graph_module.graph.tensor_values[out] = copy.deepcopy(ep.graph_module.graph.tensor_values[x])
        insert_node(ep, node, "last")
        with deep_recursion():
            return pack_shared_schema(s, tree, ep, (S.Graph,)), f"a cond over a chain of {depth} nested subgraphs"

    def _m_nest_expr(self, rng, s):
        from torch._export.serde import schema as S

        tree = s.program_tree()
        ep = s.schema_tree(tree)
        form = rng.choice(("parens", "minus", "max", "floordiv"))
        limit = rng.choice((512, 2048, 4096, 8192))
        wrap = {"parens": ("(", ")"), "minus": ("-(", ")"), "max": ("Max(2, ", ")"), "floordiv": ("FloorDiv(", ", 2)")}[form]
        depth = max(1, (limit - 5) // len(wrap[0] + wrap[1]))
        expr = wrap[0] * depth + "s1000" + wrap[1] * depth
        metas = [m for m in ep.graph_module.graph.tensor_values.values() if m.sizes]
        m = rng.choice(metas)
        m.sizes[rng.randrange(len(m.sizes))] = sym_int(expr, 4)
        ep.range_constraints["s1000"] = S.RangeConstraint(min_val=2, max_val=64)
        return pack_schema(s, tree, ep), f"a size {form} nested {depth} deep ({len(expr)} chars)"

    # ---- C++ parsers ----
    def _m_parser_schema(self, rng, s):
        tree, rec = self._op_record(rng, s)
        name = (rec.schema.decode() if isinstance(rec.schema, bytes) else rec.schema).split("(", 1)[0]
        length = rng.choice((64, 4096, SCHEMA_MAX - 1, SCHEMA_MAX, SCHEMA_MAX + 1))
        rec.schema = rng.choice(odd_schemas(name, length))
        return pack_tree(s, tree), f"op record {name}: schema {rec.schema[:60]!r}... ({len(rec.schema)} chars)"

    def _m_parser_device(self, rng, s):
        from torch._export.serde import schema as S

        tree = s.program_tree()
        ep = s.schema_tree(tree)
        g = ep.graph_module.graph
        k = rng.choice(sorted(g.tensor_values))
        meta = g.tensor_values[k]
        what = rng.random()
        if what < 0.6:
            dev = S.Device(type=rng.choice(ODD_DEVICES), index=rng.choice(ODD_DEVICE_INDEXES))
            if rng.random() < 0.6:
                meta.device = dev
                desc = f"TensorMeta {k}: device {dev.type[:40]!r} index {dev.index}"
            else:
                node = rng.choice(_all_nodes(ep))
                node.inputs = list(node.inputs) + [S.NamedArgument(name="device", arg=S.Argument.create(as_device=dev),
                                                                   kind=S.ArgumentKind.KEYWORD)]
                desc = f"node {node.name}: device={dev.type[:40]!r} index {dev.index}"
        else:
            field = rng.choice(("dtype", "layout"))
            value = rng.choice(ODD_ENUMS)
            setattr(meta, field, value)
            desc = f"TensorMeta {k}: {field} {value}"
        return pack_schema(s, tree, ep), desc

    # ---- regions ----
    def _m_region_unpaired(self, rng, s):
        tree = s.program_tree()
        ep = s.schema_tree(tree)
        x = first_tensor_input(ep)
        enter = ("torch.amp.autocast_mode._enter_autocast", ["cpu", ("DTYPE", 13), True, None])
        plans = {
            "grad off": [("torch._C._set_grad_enabled", [False])],
            "grad on": [("torch._C._set_grad_enabled", [True])],
            "autocast enter": [enter],
            "autocast exit": [("torch.amp.autocast_mode._exit_autocast", [None])],
            "two autocast enters": [enter, enter],
            "exit before enter": [("torch.amp.autocast_mode._exit_autocast", [None]), enter],
        }
        label = rng.choice(sorted(plans))
        position = rng.choice(("first", "middle", "last"))
        for target, values in reversed(plans[label]):
            insert_node(ep, new_node(target, positional(values, x), target.rsplit(".", 1)[1]), position)
        return pack_schema(s, tree, ep), f"{label} ({position})"

    def _m_identity(self, rng, s):
        return pack_tree(s, s.program_tree()), "the seed re-packed unchanged"


def _ubytes(data: bytes):
    import numpy

    return numpy.frombuffer(data, dtype=numpy.uint8)


def _all_nodes(ep) -> list:
    out, stack = [], [ep.graph_module.graph]
    while stack:
        g = stack.pop()
        for n in g.nodes:
            out.append(n)
            for a in n.inputs:
                if a.arg.type == "as_graph":
                    stack.append(a.arg.value.graph)
    if not out:
        raise Retry
    return out


def _placeholder_of(ep, record_name: str, example: bool):
    """The graph input a stored tensor feeds (the i-th user input for example input i)."""
    specs = ep.graph_module.signature.input_specs
    if example:
        users = [sp.value.arg.value.name for sp in specs
                 if sp.type == "user_input" and sp.value.arg.type == "as_tensor"]
        i = int(record_name.rsplit(".", 1)[-1]) if record_name.rsplit(".", 1)[-1].isdigit() else 0
        return users[i] if i < len(users) else None
    for sp in specs:
        v = sp.value
        if getattr(v, "parameter_name", None) == record_name or getattr(v, "buffer_name", None) == record_name \
                or getattr(v, "tensor_constant_name", None) == record_name:
            return v.arg.name
    return None


def _plain(values) -> list:
    """Sizes for a description: ints, SymInts as their int or (the start of) their expression."""
    return [x if isinstance(x, int) else x.value if x.type == "as_int" else x.value.expr_str[:20] for x in values]


def _rank(ep, arg: str) -> int:
    m = ep.graph_module.graph.tensor_values.get(arg)
    return len(m.sizes) if m is not None and m.sizes else 1


def _show(v) -> str:
    if isinstance(v, tuple) and v[0] == "OP":
        return f"as_operator={v[1]!r}"
    return repr(v)
