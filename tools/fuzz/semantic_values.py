"""Values for the semantic mutations (tools/fuzz/semantic.py): callable strings (aten ops, higher-order
ops that take callables, Python paths) with the arguments that make each one do something visible,
grown symbolic expressions, sizes and strides at their limits, and torch-like guards.

Every payload that reaches the outside world is harmless and observable from the worker's current
directory (a fresh, watched temporary folder): ``touch PT2B_FUZZ_CANARY`` for the shell, a relative
path for ``torch.save`` and ``os.makedirs``. Nothing here removes, overwrites or reads anything.
"""

from __future__ import annotations

from .values import CANARY

CANARY_FILE = CANARY  # created in the worker's cwd when a shell command from the file runs
SHELL_COMMAND = f"touch {CANARY_FILE}"
SAVED_FILE = "pt2b_fuzz_saved.pt"  # torch.save(..., SAVED_FILE) from the file
MADE_DIR = "pt2b_fuzz_dir"

# (a) registered ops (and a few that are not): a swap of a node's target or an as_operator value
ATEN_TARGETS = [
    "torch.ops.aten.relu.default", "torch.ops.aten.sigmoid.default", "torch.ops.aten.add.Tensor",
    "torch.ops.aten.mul.Tensor", "torch.ops.aten.linear.default", "torch.ops.aten.t.default",
    "torch.ops.aten.view.default", "torch.ops.aten.reshape.default", "torch.ops.aten.empty.memory_format",
    "torch.ops.aten.full.default", "torch.ops.aten.zeros.default", "torch.ops.aten.as_strided.default",
    "torch.ops.aten.copy_.default", "torch.ops.aten.resize_.default", "torch.ops.aten.set_.source_Storage",
    "torch.ops.aten.expand.default", "torch.ops.aten.repeat.default", "torch.ops.aten.index.Tensor",
    "torch.ops.aten.item.default", "torch.ops.aten._local_scalar_dense.default", "torch.ops.aten.detach_.default",
    "torch.ops.aten._assert_async.msg", "torch.ops.aten._assert_scalar.default", "torch.ops.aten.sym_size.int",
    "torch.ops.aten.sym_constrain_range_for_size.default", "torch.ops.aten.gelu.default",
    "torch.ops.aten.sum.default", "torch.ops.aten.cat.default", "torch.ops.aten.mm.default",
    "torch.ops.aten.no_such_op.default", "torch.ops.no_such_ns.op.default", "torch.ops.aten.add",
]
# (b) higher-order ops, each with the positions of its callable arguments in a call and a template of
# the rest: "OP" a callable slot, "ARGS" the callable's own arguments spliced in, "T" a tensor of the
# graph, other strings/values literal arguments
HOP_CALLS = {
    "foreach_map": ["OP", "ARGS"],
    "flat_apply": ["OP", "ARGS"],
    "dynamo_bypassing_wrapper": ["OP", "OP", "ARGS"],
    "print": ["{}", "ARGS"],
    "cond": [True, "OP", "OP", "ARGS_LIST"],
    "map_impl": ["OP", ["T"], "ARGS_LIST"],
    "while_loop": ["OP", "OP", "ARGS_LIST", []],
    "wrap_with_set_grad_enabled": [False, "OP", "ARGS"],
    "wrap_with_autocast": ["cpu", None, True, False, "OP", "ARGS"],
    "wrap": ["OP", "ARGS"],
    "tag_activation_checkpoint": ["OP", "ARGS"],
    "wrap_activation_checkpoint": ["OP", "ARGS"],
    "invoke_subgraph": ["OP", "subgraph_0", "ARGS"],
    "with_effects": ["T", "OP", "ARGS"],
    "hints_wrapper": ["OP", "ARGS_LIST", [], []],
    "strict_mode": ["OP", "ARGS_LIST"],
    "scan": ["OP", ["T"], ["T"], "ARGS_LIST"],
    "associative_scan": ["OP", ["T"], "ARGS_LIST"],
    "run_const_graph": ["OP", "ARGS_LIST"],
    "invoke_leaf_function": ["OP", "OP", "ARGS"],
    "autograd_function_apply": ["OP", "OP", "ARGS"],
    "run_with_rng_state": ["T", "OP", "ARGS"],
    "out_dtype": ["OP", 6, "ARGS"],
    "custom_function_call": ["OP", "ARGS"],
    "executorch_call_delegate": ["OP", "ARGS"],
    "inductor_compiled_code": ["OP", "ARGS_LIST"],
    "auto_functionalized": ["OP", "ARGS"],
    "_export_tracepoint": ["ARGS"],
    "no_such_hop": ["OP", "ARGS"],
}
HOP_TARGETS = [f"torch.ops.higher_order.{h}" for h in HOP_CALLS]
# (c) Python paths, each with the arguments that make it act: torch's deserializer resolves
# "torch.<path>", "_operator.<path>" and "math.<path>" by getattr (as a node target or an
# as_operator value); "T" a tensor of the graph
PYTHON_CALLS = {
    "torch.os.system": [SHELL_COMMAND],
    "torch.os.popen": [SHELL_COMMAND],
    "torch.os.makedirs": [MADE_DIR],
    "torch.save": ["T", SAVED_FILE],
    "torch.load": [SAVED_FILE],
    "builtins.eval": [f"{CANARY}()"],
    "builtins.exec": [f"{CANARY}()"],
    "os.system": [SHELL_COMMAND],
    "_operator.attrgetter": ["__class__"],
    "_operator.methodcaller": ["__reduce__"],
    "math.pow": [2.0, 2000.0],
    "math.factorial": [10**5],
    "torch._C._set_grad_enabled": [False],
    "torch.manual_seed": [0],
    "torch.sys.exit": [3],
    "torch.ops.aten.__class__.__init__": ["T"],
}
PYTHON_TARGETS = list(PYTHON_CALLS)
CALLABLES = {"aten": ATEN_TARGETS, "hop": HOP_TARGETS, "python": PYTHON_TARGETS}

# sizes, strides, storage offsets at and beyond int64's limits
BIG = [2**62, 2**63 - 1, 2**40, 2**32, 2**31, 2**48 + 1, 3037000500]  # 3037000500**2 > 2**63
NEGATIVE = [-1, -(2**63), -(2**62), -2]
SIZE_SHAPES = [  # (sizes, strides) templates; "=" keeps that entry of the original
    ([2**62, 2**62], [0, 0]), ([2**40], [0]), ([2**63 - 1], [1]), ([2**63 - 1], [0]),
    ([3037000500, 3037000500], [1, 1]), ([2**32, 2**32], [0, 0]), ([-1], [1]), ([2, -3], [1, 1]),
    ([4, 4], [-(2**62), 1]), ([2**31, 2**31, 4], [0, 0, 1]), ([0, 2**62], [2**62, 1]),
    ([2**40, "="], [0, "="]), (["=", 2**40], ["=", 0]), ([2**62, "="], [2**62, "="]),
]
STORAGE_OFFSETS = [2**62, 2**63 - 1, -1, -(2**63), 2**40]


def symbols(n: int, prefix: str = "s") -> list[str]:
    """n symbol names torch would write (``s0``, ``s1``...; the reader's pattern is [a-z]{1,8}digits)."""
    return [f"{prefix}{1000 + i}" for i in range(n)]


def grow_expr(form: str, syms: list[str], limit: int = 4096) -> str:
    """A symbolic expression of the given form over ``syms``, at most ``limit`` characters long
    (shorter when the symbols run out)."""
    if form == "max":
        return _fit(lambda k: f"Max({', '.join(syms[:k])})", len(syms), limit)
    if form == "min_max":
        def min_max(k):
            return f"Min(Max({', '.join(syms[:k // 2 or 1])}), Max({', '.join(syms[k // 2:k] or syms[:1])}))"
        return _fit(min_max, len(syms), limit)
    if form == "nested":  # Max(Min(Max(s0, s1), s2), s3)...
        def nested(k):
            e = syms[0]
            for i, s in enumerate(syms[1:k]):
                e = f"{'Max' if i % 2 == 0 else 'Min'}({e}, {s})"
            return e
        return _fit(nested, len(syms), limit)
    if form == "nested_right":  # Max(s0, Min(s1, Max(s2, ...)))
        def nested_right(k):
            e = syms[k - 1]
            for i, s in enumerate(reversed(syms[:k - 1])):
                e = f"{'Max' if i % 2 == 0 else 'Min'}({s}, {e})"
            return e
        return _fit(nested_right, len(syms), limit)
    if form == "sum":
        return _fit(lambda k: " + ".join(syms[:k]), len(syms), limit)
    if form == "product":
        return _fit(lambda k: "*".join(syms[:k]), len(syms), limit)
    if form == "sum_of_products":
        return _fit(lambda k: " + ".join(f"{a}*{b}" for a, b in zip(syms[:k], reversed(syms[:k]))), len(syms), limit)
    if form == "max_of_sums":
        return _fit(lambda k: "Max(" + ", ".join(f"{a} + {b}" for a, b in zip(syms[:k], syms[1:k + 1])) + ")",
                    len(syms) - 1, limit)
    if form.endswith("_chain"):  # FloorDiv(FloorDiv(s0, s1), s2)...
        fn = {"floordiv_chain": "FloorDiv", "ceildiv_chain": "CeilDiv", "mod_chain": "Mod",
              "pythonmod_chain": "PythonMod"}[form]

        def chain(k):
            e = syms[0]
            for s in syms[1:k]:
                e = f"{fn}({e}, {s})"
            return e
        return _fit(chain, len(syms), limit)
    if form == "srepr":  # the spelling torch's serializer writes: Symbol('s0', positive=True, integer=True)
        return _fit(lambda k: "Max(" + ", ".join(f"Symbol('{s}', positive=True, integer=True)" for s in syms[:k]) + ")",
                    len(syms), limit)
    raise ValueError(form)


EXPR_FORMS = ("max", "min_max", "nested", "nested_right", "sum", "product", "sum_of_products", "max_of_sums",
              "floordiv_chain", "ceildiv_chain", "mod_chain", "pythonmod_chain", "srepr")


def _fit(make, n: int, limit: int) -> str:
    """make(k) for the largest k <= n whose text fits in ``limit`` characters (binary search)."""
    lo, hi = 1, max(1, n)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if len(make(mid)) <= limit:
            lo = mid
        else:
            hi = mid - 1
    return make(lo)


def guard_text(rng, arg: str, dims: int, length: int) -> str:
    """A torch-like guard over input ``arg`` (``dims`` dimensions), about ``length`` characters,
    true for any input: comparisons of sizes and strides joined by ``and``."""
    parts, n = [], 0
    templates = [
        "L['{a}'].size()[{d}] >= 0", "L['{a}'].size()[{d}] <= {big}", "(L['{a}'].size()[{d}] % 1) == 0",
        "L['{a}'].stride()[{d}] >= 0", "L['{a}'].size()[{d}] * {k} + {k} >= {k}",
        "max(L['{a}'].size()[{d}], {k}) >= {k}", "L['{a}'].size()[{d}] <= 2**62",
    ]
    while n < length:
        t = rng.choice(templates).format(a=arg, d=rng.randrange(max(1, dims)), big=rng.choice((2**31, 2**62, 10**12)),
                                         k=rng.randrange(1, 1000))
        parts.append(t)
        n += len(t) + 5
    return " and ".join(parts)


# ---- nesting: every recursive structure of the file, hundreds to thousands deep ----
NEST_DEPTHS = (64, 128, 200, 500, 700, 1000, 1023, 1024, 3000, 10000)
_LEAF_SPEC = '{"type": null, "context": null, "children_spec": []}'
_SPEC_WRAPPERS = {  # a pytree treespec node (torch's treespec_dumps JSON) with one child
    "list": '{"type": "builtins.list", "context": "null", "children_spec": [',
    "tuple": '{"type": "builtins.tuple", "context": "null", "children_spec": [',
    "dict": '{"type": "builtins.dict", "context": "[\\"k\\"]", "children_spec": [',
}


def nested_spec(text: str, depth: int, kind: str = "list") -> str:
    """Treespec JSON ``text`` with its first leaf wrapped ``depth`` times in a one-child ``kind``."""
    i = text.find(_LEAF_SPEC)
    if i < 0:
        raise ValueError("no leaf")
    return text[:i] + _SPEC_WRAPPERS[kind] * depth + _LEAF_SPEC + "]}" * depth + text[i + len(_LEAF_SPEC):]


def nested_msgpack(depth: int, kind: str = "list") -> bytes:
    """A msgpack value nested ``depth`` deep: one-element arrays, or one-entry maps {"k": ...}, around 1."""
    return (b"\x91" if kind == "list" else b"\x81\xa1k") * depth + b"\x01"


# torch's schema types nested around an argument's type (torch._C.parse_schema recurses on each)
SCHEMA_NESTINGS = {
    "parens": lambda n: "(" * n + "Tensor" + ")" * n,
    "lists": lambda n: "Tensor" + "[]" * n,
    "optionals": lambda n: "Tensor" + "?" * n,
    "dicts": lambda n: "Dict(str, " * n + "Tensor" + ")" * n,
    "tuples": lambda n: "(" * n + "Tensor, int" + ")" * n,
    "futures": lambda n: "Future(" * n + "Tensor" + ")" * n,
}
SCHEMA_MAX = 1 << 16  # the longest schema string the op table records


def nested_schema(name: str, form: str, length: int) -> str:
    """``name(TYPE self) -> Tensor`` with TYPE nested by ``form`` as deep as fits ``length`` characters."""
    make = SCHEMA_NESTINGS[form]
    return _fit(lambda k: f"{name}({make(k)} self) -> Tensor", length, length)


def odd_schemas(name: str, length: int) -> list[str]:
    """Schema strings of up to ``length`` characters that torch's C++ schema parser must meet safely:
    huge names and literals, control characters, unbalanced brackets, many arguments and returns."""
    n = max(16, length - len(name) - 40)
    return [
        f"{'a' * n}(Tensor self) -> Tensor",
        f"{name}(Tensor self, int x={'9' * n}) -> Tensor",
        f"{name}(Tensor({'a' * n}!) self) -> Tensor",
        f"{name}(Tensor self) -> " + ", ".join(["Tensor"] * (n // 8)),
        f"{name}(" + ", ".join(f"Tensor a{i}" for i in range(n // 12)) + ") -> Tensor",
        f"{name}(" + "(" * n,
        f"{name}(Tensor self) -> Tensor" + ")" * n,
        f"{name}(Tensor self, str s=\"{'x' * n}\") -> Tensor",
        f"{name}(Tensor self, str s=\"\x1b]52;c;aGk=\x07\x9b2J\") -> Tensor",
        f"{name}\x00(Tensor self) -> Tensor",
        f"{name}(Tensor self, float f={'1e' + '9' * n}) -> Tensor",
        f"{name}.{'o' * n}(Tensor self) -> Tensor",
        "\u202e" * (n // 3) + f"{name}(Tensor self) -> Tensor",
        "",
    ]


# device strings for torch.device's C++ parser; dtypes, layouts, memory formats out of their enums
ODD_DEVICES = [
    "cpu:" + "9" * 64, "cpu:" + "9" * 20000, "cuda:-1", "cpu:-2", "cpu:0:0", "cpu" * 20000, "", " cpu",
    "meta", "mps", "xla:99999999999999999999", "privateuseone:0", "\x1b[2J\x1b]0;pwned\x07", "cpu\x00cuda",
    "c\u0440u", "CPU", "cuda:0x1", "cpu:+1", "hpu:2147483648", "lazy",
]
ODD_DEVICE_INDEXES = [None, -1, -2, 2**31, 2**62, 2**63 - 1, -(2**63)]
ODD_ENUMS = [0, 14, 27, 36, 99, 255, 2**31 - 1, -1, -(2**31)]
