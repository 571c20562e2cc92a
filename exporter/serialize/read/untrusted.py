"""Checks on a decoded program before torch's deserializer sees it, so that nothing in a file is
evaluated or resolved to an arbitrary Python object: node targets, symbolic expressions (parsed, never
evaluated), value and argument names, state/module paths (names.py aliases the unsafe ones), guards,
string inputs, how deep JSON text nests. Why each check:
docs/untrusted.md#every-name-from-the-file-that-becomes-a-python-object."""

from __future__ import annotations

import ast
import dataclasses
import functools
import json
import operator
import re

import torch

from ..._torch import compat
from ..._torch.serde import Union as _Union
from ..._torch.serde import schema as S
from ... import names, ops
from ...errors import CorruptArtifactError
from ...util import nesting
from .regions import check_regions

@functools.cache
def _python_targets() -> frozenset:
    """The Python functions torch's deserializer accepts as call targets (SymInt arithmetic and
    getitem), as its serializer names them (imported on first use: torch.export's serializer brings
    torch._dynamo along, which `pt2b inspect` need not load)."""
    from ..._torch.serializer import SYM_OPS as _SYM_OPS

    return frozenset(f"{fn.__module__}.{fn.__name__}" for fn in (*_SYM_OPS, operator.getitem))


def _predispatch_targets() -> frozenset:
    """The plain functions a pre-dispatch export leaves in the graph around torch.vmap / forward-mode
    AD / grad-mode and autocast regions (torch's own verifier allows exactly these), spelled as
    torch's serializer writes them. Looked up by attribute, so a release lacking one just has fewer."""
    wanted = {
        "torch._functorch.predispatch": (
            "_add_batch_dim", "_remove_batch_dim", "_vmap_increment_nesting", "_vmap_decrement_nesting",
            "lazy_load_decompositions", "_make_dual", "_unpack_dual", "_jvp_increment_nesting",
            "_jvp_decrement_nesting", "_unwrap_for_grad", "_enter_dual_level", "_exit_dual_level"),
        "torch.amp.autocast_mode": ("_enter_autocast", "_exit_autocast"),
    }
    found = {"torch._C._set_grad_enabled"}
    found.update(f"{fn.__module__}.{fn.__name__}" for fn in compat.functions_of(wanted))
    return frozenset(found)


PREDISPATCH_TARGETS = _predispatch_targets()
_SYMBOL = re.compile(r"[a-z]{1,8}\d+")
_SYMPY_NAMES = {
    # the functions torch's deserializer hands to sympify (the running torch's whole set is added:
    # _expr_functions)
    "FloorDiv", "ModularIndexing", "Where", "PythonMod", "Mod", "CleanDiv", "CeilToInt", "FloorToInt",
    "CeilDiv", "LShift", "RShift", "PowByNatural", "FloatPow", "FloatTrueDiv", "IntTrueDiv",
    "IsNonOverlappingAndDenseIndicator", "TruncToFloat", "TruncToInt", "RoundToInt", "RoundDecimal",
    "ToFloat", "Identity",
    # sympy names that str() and srepr() print for shape expressions
    "Symbol", "Integer", "Rational", "Float", "Mul", "Add", "Pow", "Max", "Min", "Abs", "floor", "ceiling",
    "Eq", "Ne", "Lt", "Le", "Gt", "Ge", "StrictLessThan", "LessThan", "StrictGreaterThan", "GreaterThan",
    "Equality", "Unequality", "And", "Or", "Not", "Piecewise", "ExprCondPair", "sqrt", "sign",
    "BooleanTrue", "BooleanFalse", "true", "false", "Infinity", "NegativeInfinity", "oo", "zoo", "nan",
    "Half", "One", "Zero", "NegativeOne", "IntInfinity", "NegativeIntInfinity", "int_oo", "True", "False",
}
# keyword arguments srepr writes: Symbol('s77', positive=True, integer=True)
_ASSUMPTIONS = {"positive", "negative", "nonnegative", "nonpositive", "integer", "real", "finite",
                "infinite", "zero", "nonzero", "even", "odd", "rational", "commutative", "extended_real",
                "precision"}
_QUOTED_NAME = re.compile(r"[A-Za-z_]\w{0,63}")
# srepr writes a float as its decimal text: Float('2.0', precision=53)
_DECIMAL = re.compile(r"[-+]?(\d{1,32}(\.\d{0,32})?|\.\d{1,32})([eE][-+]?\d{1,3})?")
_NUMBER_CALLS = frozenset({"Float", "Integer", "Rational"})


@functools.cache
def _expr_functions() -> frozenset:
    """The names an expression may call or name: sympy's own that shape expressions print, and every
    sympy function the running torch writes symbolic shapes with (sym_float's ToFloat and FloatTrueDiv,
    sym_sqrt's OpaqueUnaryFn_sqrt, FloatPow, the bitwise functions, ...), read from torch itself."""
    from ..._torch.symbolic import sympy_function_names

    return frozenset(_SYMPY_NAMES) | sympy_function_names()
MAX_EXPR_LEN = 4096
MAX_EXPONENT = 64  # 9**9**9 would make sympy compute forever
MAX_INT = 1 << 64
_AST_OK = (ast.Expression, ast.BinOp, ast.UnaryOp, ast.Compare, ast.Call, ast.Name, ast.Constant,
           ast.keyword, ast.Load, ast.operator, ast.unaryop, ast.cmpop, ast.Tuple)


# sympy's Max and Min compare their arguments pairwise (nested ones are flattened first), and so do
# And/Or/Piecewise conditions: Max(s0, ..., s119) takes minutes. Real programs hold a few per expression.
_QUADRATIC_CALLS = frozenset({"Max", "Min", "Piecewise", "And", "Or"})
MAX_MINMAX_ARGS = 8  # in one expression, all such calls together
MAX_CALL_ARGS = 64
MAX_EXPR_DEPTH = 128  # nested syntax nodes in one expression or guard (a sum of n terms nests n deep)
# torch's value-range analysis of an expression (bound_sympy, when a fake tensor is made from it) takes
# time exponential in the factors of a product and in nested calls: a product of 12 symbols, or 16
# nested FloorDivs, already take far longer than any load should. Real programs (transformers architectures with dynamic shapes)
# stay far below these caps.
MAX_FACTORS = 5  # non-constant factors of one product
MAX_CALL_NESTING = 8  # function calls (FloorDiv, Mod, Max, ...) inside one another (real programs: up to 6)
MAX_SYMBOLS = 12  # distinct symbols in one expression
# all distinct guards together: ep.module() compiles and runs every guard, pt2b checks each (both linear in
# the text). torch repeats a guard per use; the most distinct guard text a real program was seen to hold:
# 145 KB (transformers' olmo_hybrid, 470 guards at 4 and at 8 layers)
MAX_GUARDS_TEXT = 256 * 1024


def _nodes(tree, bad) -> list:
    """Every node of ``tree`` in ast.walk's order (breadth first), walked once for all the checks;
    bad(...) when it nests deeper than MAX_EXPR_DEPTH."""
    nodes, depths, i = [tree], [0], 0
    while i < len(nodes):
        depth = depths[i] + 1
        for child in ast.iter_child_nodes(nodes[i]):
            if depth > MAX_EXPR_DEPTH:
                raise bad(f"nests deeper than {MAX_EXPR_DEPTH} levels")
            nodes.append(child)
            depths.append(depth)
        i += 1
    return nodes


_ATOMS = frozenset({"Symbol", "Integer", "Rational", "Float", "Half", "One", "Zero", "NegativeOne"})
_ARITHMETIC = _ATOMS | {"Mul", "Add", "Pow"}  # srepr's spelling of + * **: not counted as nested calls


def _call_name(node) -> str:
    return node.func.id if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) else ""


def _constant(node) -> bool:
    return isinstance(node, ast.Constant) or _call_name(node) in _ATOMS - {"Symbol"} or (
        isinstance(node, ast.UnaryOp) and _constant(node.operand))


def _factors(node, chain: set) -> list:
    """The operands of the product ``node`` heads, flattened (a*b*c parses as (a*b)*c; srepr writes
    Mul(a, Mul(b, c))); the ids of the product's own nodes are added to ``chain``."""
    out, stack = [], [node]
    while stack:
        n = stack.pop()
        if isinstance(n, ast.BinOp) and isinstance(n.op, ast.Mult):
            chain.add(id(n))
            stack += [n.left, n.right]
        elif _call_name(n) == "Mul":
            chain.add(id(n))
            stack += n.args
        else:
            out.append(n)
    return out


def expression_cost(tree) -> tuple[int, int, int]:
    """(distinct symbols, most non-constant factors of one product, deepest nesting of function
    calls other than arithmetic) of a parsed expression, in either spelling torch writes: str()'s
    (s0*FloorDiv(s1, 2)) or srepr()'s (Mul(Symbol('s0', ...), FloorDiv(...)))."""
    symbols, chain = set(), set()
    factors = nesting = 0
    stack = [(tree, 0)]
    while stack:
        node, calls = stack.pop()
        name = _call_name(node)
        if isinstance(node, ast.Name) and _SYMBOL.fullmatch(node.id):
            symbols.add(node.id)
        elif name == "Symbol" and node.args and isinstance(node.args[0], ast.Constant):
            symbols.add(node.args[0].value)
        elif name and name not in _ARITHMETIC:
            calls += 1
            nesting = max(nesting, calls)
        if id(node) not in chain and ((isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mult))
                                      or name == "Mul"):
            factors = max(factors, sum(not _constant(f) for f in _factors(node, chain)))
        stack.extend((child, calls) for child in ast.iter_child_nodes(node))
    return len(symbols), factors, nesting


def _check_torch_cost(tree, bad) -> None:
    """Raise bad(...) past the caps on what makes torch's analysis of an expression exponential:
    MAX_FACTORS, MAX_CALL_NESTING, MAX_SYMBOLS (module constants)."""
    symbols, factors, nesting = expression_cost(tree)
    if factors > MAX_FACTORS:
        raise bad(f"multiplies more than {MAX_FACTORS} non-constant factors")
    if nesting > MAX_CALL_NESTING:
        raise bad(f"nests more than {MAX_CALL_NESTING} function calls")
    if symbols > MAX_SYMBOLS:
        raise bad(f"names more than {MAX_SYMBOLS} symbols")


def _small_exponent(node) -> bool:
    return (isinstance(node, ast.Name) and _SYMBOL.fullmatch(node.id) is not None) or (
        isinstance(node, ast.Call) and getattr(node.func, "id", "") == "Symbol") or (
        isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and abs(node.value) <= MAX_EXPONENT) or (
        isinstance(node, ast.Constant) and isinstance(node.value, str) and _DECIMAL.fullmatch(node.value) is not None
        and abs(float(node.value)) <= MAX_EXPONENT) or (
        isinstance(node, ast.UnaryOp) and _small_exponent(node.operand)) or (
        isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in _NUMBER_CALLS
        and all(_small_exponent(a) for a in node.args[:2]))


def _parse(text: str, bad) -> ast.Expression:
    """``text`` parsed as one Python expression (never evaluated); bad("does not parse") otherwise."""
    try:
        return ast.parse(text, mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        raise bad("does not parse") from None


def _check_constant(v, name_ok, name_what: str, bad) -> None:
    """Raise ``bad(...)`` unless the literal ``v`` of an expression or guard is a number of at most 64
    bits or a string ``name_ok`` accepts (``name_what`` says what it must be)."""
    if isinstance(v, str) and not name_ok(v):
        raise bad(f"contains a string that is not {name_what}")
    if isinstance(v, int) and abs(v) > MAX_INT:
        raise bad("contains an integer beyond 64 bits")
    if not isinstance(v, (str, int, float)):  # (bool is an int)
        raise bad(f"contains the constant {v!r}")


def check_expr(expr: str, where: str) -> None:
    """Raise unless ``expr`` is arithmetic over numbers, symbols and known sympy names.
    It is parsed with ast (never evaluated); exponents must be small or symbolic."""
    def bad(why: str):
        return CorruptArtifactError(f"{where}: symbolic expression {expr[:80]!r} {why}; pt2b never "
                                    f"evaluates such text (it is not arithmetic over symbols).")

    if not isinstance(expr, str) or len(expr) > MAX_EXPR_LEN:
        raise bad("is too long")
    tree = _parse(expr, bad)
    nodes = _nodes(tree, bad)
    _check_torch_cost(tree, bad)
    functions = _expr_functions()
    # the decimal text a number's constructor is given: Float('2.0', precision=53)
    decimals = {id(n.args[0]) for n in nodes if isinstance(n, ast.Call) and getattr(n.func, "id", "") in _NUMBER_CALLS
                and n.args and isinstance(n.args[0], ast.Constant) and isinstance(n.args[0].value, str)}
    minmax = 0
    for node in nodes:
        if not isinstance(node, _AST_OK):
            raise bad(f"contains {type(node).__name__}")
        if isinstance(node, ast.Call) and getattr(node.func, "id", "") in _QUADRATIC_CALLS:
            minmax += len(node.args)
            if minmax > MAX_MINMAX_ARGS:
                raise bad(f"holds more than {MAX_MINMAX_ARGS} arguments of Max/Min/Piecewise (sympy compares "
                          f"them pairwise: quadratic work)")
        if isinstance(node, ast.Call) and len(node.args) + len(node.keywords) > MAX_CALL_ARGS:
            raise bad(f"calls a function with more than {MAX_CALL_ARGS} arguments")
        if isinstance(node, ast.Name) and not (node.id in functions or _SYMBOL.fullmatch(node.id)):
            raise bad(f"names {node.id!r}")
        if isinstance(node, ast.Call) and not (isinstance(node.func, ast.Name) and node.func.id in functions):
            raise bad("calls something that is not a known sympy name")
        if isinstance(node, ast.keyword) and node.arg not in _ASSUMPTIONS:
            raise bad(f"passes keyword {node.arg!r}")
        if isinstance(node, ast.Constant) and id(node) in decimals:
            _check_constant(node.value, _DECIMAL.fullmatch, "a decimal number", bad)
        elif isinstance(node, ast.Constant):
            _check_constant(node.value, _QUOTED_NAME.fullmatch, "a symbol name", bad)
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Pow) and not _small_exponent(node.right):
            raise bad("raises to a large or nested power")
        if isinstance(node, ast.Call) and getattr(node.func, "id", "") in ("Pow", "PowByNatural", "FloatPow") \
                and (len(node.args) != 2 or not _small_exponent(node.args[1])):
            raise bad("raises to a large or nested power")


IDENT, FQN, CLASS = "identifier", "path", "class name"
_CLASS_NAME = re.compile(r"[A-Za-z0-9_]{1,255}(\.[A-Za-z0-9_]{1,255}){0,63}")
# field -> the kind of name it holds: fx value names and argument names become Python variables;
# state paths are attribute paths (names.path_ok); torchbind class names are resolved by torch
_NAME_FIELDS = {"name": IDENT, "as_name": IDENT, "user_input_name": IDENT, "parameter_name": FQN,
                "buffer_name": FQN, "tensor_constant_name": FQN, "custom_obj_name": FQN, "class_fqn": CLASS}
_VALUE_MAPS = ("tensor_values", "sym_int_values", "sym_bool_values", "sym_float_values", "custom_obj_values")


def _name_ok(value, kind, may_be_self: bool = False) -> bool:
    # fx binds the module as `self` in generated code: a value or forward argument named "self"
    # would shadow it (only operator argument names, such as add's `self`, may be). State paths
    # may be anything nn.Module accepts: names.safe_path aliases what generated code cannot hold.
    if kind is FQN:
        return names.path_ok(value)
    if kind is CLASS:
        return type(value) is str and _CLASS_NAME.fullmatch(value) is not None
    if may_be_self:  # an operator argument's name: what op schemas hold, Python keywords included
        return names.schema_argument_ok(value)  # (aten::uniform_'s `from`); torch passes them positionally
    return names.identifier_ok(value) and value != "self"


def check_name(value, kind, where: str, what: str, *, may_be_self: bool = False) -> None:
    if not _name_ok(value, kind, may_be_self):
        rule = {IDENT: "an identifier" if may_be_self else "a Python identifier (not a keyword, not 'self')",
                FQN: "a path of non-empty names joined by '.' (what nn.Module accepts)",
                CLASS: "a dotted class name"}[kind]
        raise CorruptArtifactError(
            f"{where}: {what} {str(value)[:80]!r} is not {rule}; names from a file end up in "
            f"generated Python code or attribute paths, so pt2b accepts only such names.")


_HOP_PREFIX = "torch.ops.higher_order."
# The higher-order ops pt2b knows the semantics of (what torch.export writes for control flow, effects,
# grad-mode and autocast regions and custom ops made functional): every other one (foreach_map,
# flat_apply, print, dynamo_bypassing_wrapper, ...) takes Python callables or runs code of its own, so a
# file naming it is refused. Value: (the positional inputs that are its subgraphs, the input that is its
# operator or None), as torch's serializer writes them: every callable argument is a subgraph of the same
# file (Argument.as_graph) or a registered OpOverload (Argument.as_operator), at exactly these places.
ALLOWED_HOPS: dict[str, tuple[tuple[int, ...], int | None]] = {
    "cond": ((1, 2), None),  # (pred, true_fn, false_fn, operands)
    "while_loop": ((0, 1), None),  # (cond_fn, body_fn, carried_inputs, additional_inputs)
    "map_impl": ((0,), None),  # (f, xs, pos_args)
    "scan": ((0,), None),  # (combine_fn, init, xs, additional_inputs)
    "invoke_subgraph": ((0,), None),  # (subgraph, identifier, *operands)
    "wrap_with_set_grad_enabled": ((1,), None),  # (enabled, body, *args)
    "wrap_with_autocast": ((4,), None),  # (device_type, dtype, enabled, cache_enabled, body, *args)
    "with_effects": ((), 1),  # (token, op, *args)
    "auto_functionalized": ((), 0),  # (op, **kwargs)
    "auto_functionalized_v2": ((), 0),
    "out_dtype": ((), 0),  # (op, output_dtype, *args)
}


def _target_ok(target, recorded=frozenset()) -> bool:
    """A registered operator (a higher-order op only from ALLOWED_HOPS), SymInt arithmetic, a
    pre-dispatch region function, or an op the artifact's op table records (those are resolved,
    upgraded or refused by name by versioning/schema_drift before anything runs)."""
    if type(target) is not str:
        return False
    if target.startswith(_HOP_PREFIX):
        return target[len(_HOP_PREFIX):] in ALLOWED_HOPS and ops.op_of_target(target) is not None
    # the operator registry first: a program of operators alone never imports torch's serializer (with
    # torch._dynamo, the slowest import of `pt2b verify`), which _python_targets needs
    return (ops.op_of_target(target) is not None or target in PREDISPATCH_TARGETS or target in recorded
            or target in _python_targets())


def check_target(target: str, where: str, recorded=frozenset()) -> None:
    if _target_ok(target, recorded):
        return
    if type(target) is str and target.startswith(_HOP_PREFIX):
        raise CorruptArtifactError(
            f"{where}: node calls the higher-order op {target[:120]!r}, which pt2b does not accept from a file "
            f"(it accepts {', '.join(sorted(ALLOWED_HOPS))}: ops whose callables are subgraphs of the file or "
            f"registered operators).")
    raise CorruptArtifactError(
        f"{where}: node calls {str(target)[:120]!r}, which is neither an operator registered with this torch "
        f"({torch.__version__}) nor SymInt arithmetic nor a pre-dispatch region function, and the artifact's "
        f"op table does not record it; pt2b does not resolve or call arbitrary Python objects from a file."
    )


def check_operator_argument(value, where: str) -> None:
    """An operator passed as an argument (Argument.as_operator; torch's deserializer resolves it with
    getattr from torch, operator or math): only a registered OpOverload."""
    if type(value) is str and not value.startswith(_HOP_PREFIX) and isinstance(
            ops.op_of_target(value), torch._ops.OpOverload):
        return
    raise CorruptArtifactError(
        f"{where}: an operator argument names {str(value)[:120]!r}, which is not an operator registered with this "
        f"torch ({torch.__version__}); pt2b resolves operator arguments only through the operator registry, "
        f"never as Python paths.")


def _operator_fits(hop: str, value) -> bool:
    """Whether the higher-order op ``hop`` takes the operator ``value`` names, by torch's own rule for
    it: with_effects an op with effects, auto_functionalized(_v2) an op it can make functional, out_dtype
    one of its allowed ops. True where this torch has no such rule, or the name is no operator (the
    walk refuses that one by itself)."""
    op = ops.op_of_target(value) if type(value) is str else None
    if not isinstance(op, torch._ops.OpOverload):
        return True
    return compat.hop_takes_operator(hop, op)


def _check_node_callables(d: dict, where: str) -> None:
    """A node's callable arguments (subgraphs, operators) only where its op takes them: at the places
    ALLOWED_HOPS names for a higher-order op, nowhere for any other op. A higher-order op handed a
    callable where it takes another kind of value fails inside torch (an AssertionError, a KeyError);
    one handed an operator where it calls a subgraph would call it."""
    target = d["target"]
    name = target[len(_HOP_PREFIX):] if type(target) is str and target.startswith(_HOP_PREFIX) else None
    graphs, operator_at = ALLOWED_HOPS.get(name, ((), None))
    for i, inp in enumerate(d["inputs"]):
        arg = inp.arg
        kind = str.__str__(arg.__dict__["_type"]) if type(arg) is S.Argument else ""
        is_graph, is_operator = kind == "as_graph", kind.startswith("as_operator")
        wanted_graph, wanted_operator = i in graphs, i == operator_at
        if is_operator and wanted_operator and not _operator_fits(name, arg.__dict__[kind]):
            raise CorruptArtifactError(
                f"{where}: node {d['name'] or '?'} calls {str(target)[:120]} on the operator "
                f"{str(arg.__dict__[kind])[:120]}, which {name} does not take (torch would fail inside it).")
        if is_graph != wanted_graph or is_operator != wanted_operator:
            wanted = "a subgraph" if wanted_graph else "an operator" if wanted_operator else "a value, not a callable"
            raise CorruptArtifactError(
                f"{where}: node {d['name'] or '?'} calls {str(target)[:120]} with {kind or 'an argument'} as input "
                f"{i}, where it takes {wanted}; pt2b accepts callables only where the op calls one.")
    missing = [i for i in (*graphs, *(() if operator_at is None else (operator_at,))) if i >= len(d["inputs"])]
    if missing:
        raise CorruptArtifactError(f"{where}: node {d['name'] or '?'} calls {str(target)[:120]} without its input "
                                   f"{missing[0]} (a subgraph or operator it calls).")


INT64_MAX = (1 << 63) - 1


def _itemsize(dtype) -> int:
    # pt2b's own dtype table (its codes are torch's export-schema codes): torch's serializer, whose table
    # this once read, brings torch._dynamo along (the slowest import of `pt2b verify`)
    from ..mapping.dtypes import itemsize_of

    size = itemsize_of(dtype)
    return 8 if size is None else size


def extent_problem(sizes, strides, offset: int, itemsize: int) -> str | None:
    """What is wrong with a strided layout's known (integer) sizes and strides: a negative one, or an
    element count or byte extent beyond int64 (torch would fail with a raw integer-overflow error)."""
    if any(x < 0 for x in sizes) or any(x < 0 for x in strides) or offset < 0:
        return "has a negative size, stride or offset"
    numel = 1
    for x in sizes:
        numel *= x
    if numel > INT64_MAX or numel * itemsize > INT64_MAX:
        return f"holds {numel} elements, more than an int64 can count"
    if numel and (offset + 1 + sum((a - 1) * b for a, b in zip(sizes, strides))) * itemsize > INT64_MAX:
        return "reaches past the largest byte offset an int64 can hold"
    return None


def check_tensor_meta(d: dict, where: str) -> None:
    """A tensor's metadata in the graph (fake tensors are made from it): its integer sizes and strides
    must not overflow int64 (symbolic ones are bounded by their ranges when the program runs)."""
    sizes = [s.__dict__["as_int"] for s in d["sizes"] if str.__str__(s.__dict__["_type"]) == "as_int"]
    strides = [s.__dict__["as_int"] for s in d["strides"] if str.__str__(s.__dict__["_type"]) == "as_int"]
    if len(sizes) != len(d["sizes"]) or len(strides) != len(d["strides"]):
        strides = []  # a symbolic dimension: only the known sizes' product is checked
    why = extent_problem(sizes, strides if strides else [0] * len(sizes), 0, _itemsize(d["dtype"]))
    if why is not None:
        raise CorruptArtifactError(f"{where}: tensor metadata (sizes {sizes[:8]}, strides {strides[:8]}) {why}; "
                                   f"the file is damaged or crafted.")


# Lists and maps from a file, in JSON text (pytree specs, node metadata custom/from_node) or decoded
# (the metadata map) nest at most this deep: JSON text reaches recursive Python code in torch
# (treespec_loads, NodeSource._from_dict), and what either builds meets recursive walks later (pytree
# flatten and unflatten, comparisons, copies, printing). At the cap each of those still works (a test
# loads, runs and lowers such a program); real programs nest far less (a test measures the zoo).
MAX_DATA_DEPTH = 128
_JSON_METADATA = ("custom", "from_node")  # node and graph metadata torch's deserializer json.loads


def check_json_text(text, where: str, what: str) -> None:
    """CorruptArtifactError if the JSON ``text`` nests brackets deeper than MAX_DATA_DEPTH (scanned in
    linear time, before any parser sees it)."""
    if isinstance(text, str):
        nesting.check_text(text, MAX_DATA_DEPTH, where, what, quotes='"')


def check_treespec(spec, where: str, what: str = "pytree spec") -> None:
    """A serialized pytree spec (treespec_dumps's JSON, each node's context a JSON string of its own),
    before treespec_loads: the spec and every context nested at most MAX_DATA_DEPTH deep. A spec
    that is not JSON of that shape is left for treespec_loads to refuse."""
    check_json_text(spec, where, what)
    try:
        _, root = json.loads(spec)
    except (TypeError, ValueError):
        return
    stack = [root]
    while stack:
        node = stack.pop()
        if not isinstance(node, dict):
            continue
        check_json_text(node.get("context"), where, f"{what} context")
        children = node.get("children_spec")
        if isinstance(children, list):
            stack.extend(children)


def _check_metadata_json(metadata, where: str) -> None:
    """The metadata entries of a node or graph that torch's deserializer json.loads (check_json_text)."""
    if isinstance(metadata, dict):
        for key in _JSON_METADATA:
            check_json_text(metadata.get(key), where, f"metadata {key}")


_LEAF_TYPES = frozenset((str, int, float, bool, type(None)))  # values the walk does not descend into


@functools.cache
def _nested_fields(cls) -> tuple[tuple, frozenset]:
    """((name field, pattern), ...) checked on ``cls``, and the fields (union members) whose values
    can hold further schema dataclasses: the only ones the walk descends into."""
    from ..mapping.schema_map import fields as schema_fields

    def holds(desc) -> bool:
        return desc[0] == "dc" or (desc[0] in ("list", "opt", "dict", "listlist") and holds(desc[1]))

    fields = schema_fields(cls)
    names = tuple((f, p) for f, p in _NAME_FIELDS.items() if any(f == name for name, *_ in fields))
    return names, frozenset(name for name, _, desc, _ in fields if holds(desc))


@functools.cache
def _kind(cls):
    """(is a union, name fields, nested fields) of a schema dataclass; None for anything else."""
    if not dataclasses.is_dataclass(cls):
        return None
    names, nested = _nested_fields(cls)
    return issubclass(cls, _Union), names, nested


def _path_text(path) -> str:
    """A walk path: a str, or (parent path, dict key) built lazily (only an error prints it)."""
    if isinstance(path, str):
        return path
    parent, key = path
    return f"{_path_text(parent)}[{key!r}]"


def check_program(ep: S.ExportedProgram, where: str, recorded=frozenset()) -> None:
    """Walk every value of the decoded program (subgraphs included) and check it. Values are read
    from the objects' __dict__ (torch's _Union answers attribute reads in Python code) and messages
    are built only for a value that fails. ``recorded``: the node targets of the op-table records
    (accepted here although unregistered: schema_drift upgrades them or refuses them by name)."""
    stack = [(ep, "program")]
    pop, push, extend = stack.pop, stack.append, stack.extend
    exprs_ok = set()  # each distinct expression text is checked once (a program repeats its sizes' expressions)
    leaf = _LEAF_TYPES
    while stack:
        obj, path = pop()
        cls = type(obj)
        if cls is list or cls is tuple:
            extend((x, path) for x in obj if type(x) not in leaf)
            continue
        if cls is dict:
            extend((v, (path, k)) for k, v in obj.items() if type(v) not in leaf)
            continue
        kind = _kind(cls)
        if kind is None:
            continue
        d = obj.__dict__
        if cls is S.SymExpr:
            expr = d["expr_str"]
            if type(expr) is not str or expr not in exprs_ok:
                check_expr(expr, f"{where}: {_path_text(path)}")
                exprs_ok.add(expr)
        elif cls is S.Node:
            if not _target_ok(d["target"], recorded):
                check_target(d["target"], f"{where}: node {d['name'] or '?'}", recorded)
            _check_node_callables(d, where)
            if d["metadata"]:
                _check_metadata_json(d["metadata"], f"{where}: node {d['name'] or '?'}")
        elif cls is S.TensorMeta:
            check_tensor_meta(d, f"{where}: {_path_text(path)}")
        elif cls is S.Graph:
            for field in _VALUE_MAPS:
                for key in d[field]:
                    if not _name_ok(key, IDENT):
                        check_name(key, IDENT, f"{where}: {_path_text(path)}", f"value name in {field}")
        elif cls is S.ModuleCallEntry:
            if d["fqn"]:
                check_name(d["fqn"], FQN, f"{where}: module_call_graph", "module path")
            sig = d["signature"]
            for arg_name in (sig.forward_arg_names or []) if sig else []:
                check_name(arg_name, IDENT, f"{where}: module_call_graph {d['fqn']!r}", "forward argument name")
            for field in ("in_spec", "out_spec") if sig else ():
                check_treespec(getattr(sig, field), f"{where}: module_call_graph {d['fqn']!r}", field)
        elif cls is S.GraphModule:
            _check_metadata_json(d["metadata"], f"{where}: graph module")
        union, names, nested = kind
        if union:
            active = str.__str__(d["_type"])
            if active.startswith("as_operator"):  # as_operator (and as_operators where a release has it)
                for value in (d[active] if isinstance(d[active], list) else [d[active]]):
                    check_operator_argument(value, f"{where}: {_path_text(path)}")
            if active in nested:
                push((d[active], path))
            continue
        named_arg = cls is S.NamedArgument
        for field, pattern in names:
            value = d[field]
            if isinstance(value, str) and not (named_arg and field == "name" and not value) \
                    and not _name_ok(value, pattern, named_arg):
                check_name(value, pattern, f"{where}: {_path_text(path)}", f"{cls.__name__}.{field}",
                           may_be_self=named_arg)
        if cls is S.Node:
            label = d["name"]
            if label:
                base = _path_text(path)
                for field in nested:
                    push((d[field], f"{base}.{label}"))
                continue
        for field in nested:
            push((d[field], path))
    for name in ep.range_constraints:
        if not _SYMBOL.fullmatch(name):
            check_expr(name, f"{where}: range constraint key")
    calls = ep.graph_module.module_call_graph
    if not calls or calls[0].fqn != "" or calls[0].signature is None:
        raise CorruptArtifactError(
            f"{where}: module_call_graph must start with the root module's entry (fqn '' with a signature).")
    constant_inputs = [spec.value for spec in ep.graph_module.signature.input_specs if spec.type == "constant_input"]
    check_plain_strings(([a for a in ep.graph_module.graph.inputs if a.type == "as_string"], constant_inputs),
                        f"{where}: program inputs", "string input value")
    _check_python_call_arguments(ep.graph_module.graph, where)
    check_regions(ep.graph_module.graph, where)  # region nodes pair up (regions.py)


def _check_python_call_arguments(graph: S.Graph, where: str) -> None:
    """SymInt arithmetic (torch.sym_max, operator.mul...) takes symbols and numbers, never tensors:
    torch would fail with an internal assertion mid-run."""
    stack = [graph]
    while stack:
        g = stack.pop()
        for node in g.nodes:
            for inp in node.inputs:
                if inp.arg.type == "as_graph":
                    stack.append(inp.arg.value.graph)
            if (not node.target.startswith("torch.ops.") and node.target in _python_targets()  # (operators: no
                    and node.target != "_operator.getitem"):  # import of torch's serializer for them)
                kinds = {inp.arg.type for inp in node.inputs} & _TENSOR_ARGUMENTS
                if kinds:
                    raise CorruptArtifactError(
                        f"{where}: node {node.name!r} calls {node.target} on a tensor ({sorted(kinds)[0]}); "
                        f"that is SymInt arithmetic, which takes symbols and numbers only.")


_TENSOR_ARGUMENTS = {"as_tensor", "as_tensors", "as_optional_tensor", "as_optional_tensors"}
PLAIN_TEXT_MAX = 4096


def _plain_text(value: str) -> bool:
    # torch splices these into guard code inside '...' and "..." literals: no quotes, escapes or
    # line breaks may reach it
    return len(value) <= PLAIN_TEXT_MAX and value.isprintable() and not any(c in value for c in "'\\\"")


def check_plain_strings(obj, where: str, what: str) -> None:
    """Every str inside ``obj`` (dataclasses, unions, lists, dicts) must be plain printable text
    without quotes or backslashes."""
    stack = [obj]
    while stack:
        o = stack.pop()
        if isinstance(o, str):
            if not _plain_text(o):
                raise CorruptArtifactError(
                    f"{where}: {what} {o[:80]!r} holds a quote, backslash or control character; torch "
                    f"writes such values into generated guard code, so pt2b refuses them.")
        elif isinstance(o, _Union):
            stack.append(o.value)
        elif dataclasses.is_dataclass(o):
            stack.extend(getattr(o, f.name) for f in dataclasses.fields(o))
        elif isinstance(o, (list, tuple)):
            stack.extend(o)
        elif isinstance(o, dict):
            stack.extend(o.keys())
            stack.extend(o.values())


# What torch's own guards_code looks like: "(L['x'].size()[0] % 2) == 0", "L['y'].size()[0] <= L['x'].size()[0]"
_GUARD_NODES = (ast.Expression, ast.Compare, ast.BoolOp, ast.BinOp, ast.UnaryOp, ast.Subscript, ast.Attribute,
                ast.Call, ast.Name, ast.Constant, ast.Load, ast.operator, ast.unaryop, ast.cmpop, ast.boolop)
_GUARD_METHODS = {"size", "stride", "storage_offset", "dim", "numel"}
_GUARD_MATH = {"floor", "ceil", "trunc", "isnan", "isinf", "inf", "sqrt", "fabs", "log2"}
_GUARD_NAMES = {"L", "math", "inf", "abs", "min", "max", "int", "float", "round",
                "IsNonOverlappingAndDenseIndicator"}


def check_guard(code, root_args: set, where: str) -> list[tuple]:
    """Raise unless ``code`` is an input guard as torch writes them: comparisons and arithmetic over
    L['<forward argument>']... sizes/strides, numbers and a few math functions. ep.module() exec()s it.
    Returns the input paths it reads (L['x'][0] -> ('x', 0)) for check_guards."""
    def bad(why: str):
        return CorruptArtifactError(f"{where}: guard {str(code)[:80]!r} {why}; ep.module() would execute "
                                    f"it as Python, so pt2b accepts only shape comparisons.")

    if not isinstance(code, str) or not _plain_guard_text(code):
        raise bad("is too long or holds a double quote, backslash or control character")
    tree = _parse(code, bad)
    nodes = _nodes(tree, bad)
    subscripted = {id(n.value) for n in nodes if isinstance(n, ast.Subscript) or _field_of_input(n)}
    for node in nodes:
        if not isinstance(node, _GUARD_NODES):
            raise bad(f"contains {type(node).__name__}")
        if isinstance(node, ast.Name) and node.id not in _GUARD_NAMES:
            raise bad(f"names {node.id!r}")
        if isinstance(node, ast.Attribute):
            ok = node.attr in _GUARD_MATH if isinstance(node.value, ast.Name) and node.value.id == "math" \
                else node.attr in _GUARD_METHODS or _field_of_input(node)
            if not ok:
                raise bad(f"reads attribute {node.attr!r}")
        if isinstance(node, ast.Call) and (node.keywords or not isinstance(node.func, (ast.Name, ast.Attribute))):
            raise bad("makes a call that is not a size query or math function")
        if isinstance(node, ast.Subscript):
            key = node.slice
            if not (isinstance(key, ast.Constant) and isinstance(key.value, (int, str))
                    and not isinstance(key.value, bool)):
                raise bad("indexes with something other than a name or a number")
            if isinstance(node.value, ast.Name) and (node.value.id != "L" or key.value not in root_args | {"flat_args"}):
                raise bad(f"reads {ast.unparse(node)}, which is not a forward argument")
        if isinstance(node, ast.Name) and node.id == "L" and id(node) not in subscripted:
            raise bad("uses L other than to read an argument")
        if isinstance(node, ast.Constant):
            _check_constant(node.value, names.identifier_ok, "a name", bad)
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Pow) and not _small_exponent(node.right):
            raise bad("raises to a large power")
    return _input_paths(nodes, subscripted)


def _field_of_input(node) -> bool:
    """``node`` reads a field of an input by name, as torch writes a path through a registered
    dataclass or namedtuple input (L['d'].a: pytree's GetAttrKey): a public identifier on an
    L[...] chain. torch rewrites the whole path of each input leaf into args[i] textually, and
    check_guards admits only paths that are leaves."""
    if not (isinstance(node, ast.Attribute) and node.attr.isidentifier() and not node.attr.startswith("_")
            and node.attr not in _GUARD_METHODS):
        return False
    while isinstance(node, (ast.Attribute, ast.Subscript)):
        node = node.value
    return isinstance(node, ast.Name) and node.id == "L"


@dataclasses.dataclass(frozen=True)
class _Field:
    """A step of an input path that reads a field by name (pytree's GetAttrKey, a guard's ``.name``),
    never equal to an index or a dict key."""
    name: str

    def __str__(self) -> str:
        return f".{self.name}"


def _path_key(key) -> object:
    """A step of an input path as _input_paths and check_guards compare them: an index or a dict
    key as it is, a field as a _Field."""
    name = getattr(key, "name", None)
    return getattr(key, "key", getattr(key, "idx", _Field(name) if name is not None else None))


def _input_paths(nodes: list, inner: set) -> list[tuple]:
    """The longest L[k1][k2].f... chains among ``nodes`` (an expression's, _nodes) as key tuples (a
    field as a _Field); ``inner``: the ids of the nodes subscripted or whose field is read."""
    paths = []
    for n in nodes:
        if (isinstance(n, ast.Subscript) or _field_of_input(n)) and id(n) not in inner:
            keys = []
            while isinstance(n, ast.Subscript) or _field_of_input(n):
                keys.append(n.slice.value if isinstance(n, ast.Subscript) else _Field(n.attr))
                n = n.value
            if isinstance(n, ast.Name) and n.id == "L":
                paths.append(tuple(reversed(keys)))
    return paths


def distinct_guards(guards):
    """``guards`` (guards_code: Python assertions) without repeats, in first-seen order: asserting the
    same text twice checks nothing more. Anything but a list of strings is returned as it is (the
    reader refuses it by name)."""
    if isinstance(guards, list) and all(type(g) is str for g in guards):
        return list(dict.fromkeys(guards))
    return guards


def check_guards(guards_code, example_inputs, forward_arg_names, where: str) -> None:
    """Every guard is a shape comparison (check_guard); when example inputs are stored (then
    ep.module() generates the guard function) each must also read only input leaves that function
    binds: torch rewrites L['<arg>']... of each example-input leaf (and L['flat_args'][i]) into
    args[i] textually; any other L[...] is left for Python to fail on (NameError) at every call.
    ``guards_code``: without repeats (distinct_guards), as the reader hands it on."""
    from ..._torch.pytree import pytree

    total = sum(len(code) if isinstance(code, str) else 0 for code in guards_code or [])
    if total > MAX_GUARDS_TEXT:
        raise CorruptArtifactError(
            f"{where}: {len(guards_code)} distinct guards of {total} characters in all, more than {MAX_GUARDS_TEXT}; "
            f"ep.module() compiles and runs every guard on every call (the most a real program was seen to "
            f"hold: 470 distinct guards of 145 KB).")
    reads = [(code, check_guard(code, set(forward_arg_names), where)) for code in guards_code or []]
    if not reads or example_inputs is None:
        return
    try:
        args, kwargs = example_inputs
        ctx = dict(zip(forward_arg_names, args), **(kwargs or {}))
        leaves = [tuple(_path_key(k) for k in path) for path, _ in pytree.tree_flatten_with_path(ctx)[0]]
    except (TypeError, ValueError) as e:
        raise CorruptArtifactError(f"{where}: example inputs do not match the forward arguments ({e}).") from None
    bound = set(leaves) | {("flat_args", i) for i in range(len(leaves))}
    for code, paths in reads:
        for path in paths:
            if path not in bound:
                raise CorruptArtifactError(
                    f"{where}: guard {code[:80]!r} reads L{''.join(str(k) if isinstance(k, _Field) else f'[{k!r}]' for k in path)}, which is not an "
                    f"input of the program; torch's guard function would fail with NameError on every call.")


def _plain_guard_text(code: str) -> bool:
    return len(code) <= MAX_EXPR_LEN and code.isprintable() and not any(c in code for c in "\"\\")



