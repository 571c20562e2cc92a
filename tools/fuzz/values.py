"""Mutated field values for the structured mutations: hostile op targets, symbolic expressions,
code-injection payloads that call the worker's canary, special numbers, and ``mutate_value``, which
turns any value of an object tree (scalar, string, list, dict, table) into a damaged one."""

from __future__ import annotations

import enum
import re

EVIL_TARGETS = [
    "torch.os.system", "builtins.eval", "torch.ops.aten.__class__.__init__", "torch.load", "os.system",
    "torch.ops.aten.add_.Tensor", "torch.ops.aten.mul.Tensor", "torch.ops.aten.sigmoid.default",
    "torch.ops.aten.relu.default", "torch.ops.aten.no_such_op.default", "torch.ops.no_such_ns.op.default",
    "torch.ops.higher_order.cond", "torch.ops.higher_order.while_loop", "torch.ops.higher_order.map_impl",
    "torch.ops.higher_order.no_such_hop", "_operator.getitem", "_operator.mul", "_operator.floordiv",
    "_operator.truediv", "math.trunc", "torch.sym_max", "torch.sym_float", "torch.ops.pt2b_zoo.scaled_add.default",
    "torch.ops.aten.view.default", "torch.ops.aten.empty.memory_format", "torch.ops.aten.full.default",
    "torch.ops.aten._assert_async.msg", "torch.ops.aten.sym_size.int", "torch.ops.aten.as_strided.default",
    "torch.ops.aten.copy_.default", "torch.ops.aten.detach_.default", "torch.ops.aten.linear.default",
    "torch.ops.aten.t.default", "torch.ops.aten.addmm.default", "torch.ops.aten._local_scalar_dense.default",
    "torch.ops.aten.set_.source_Storage", "torch.ops.aten.resize_.default", "torch.ops.aten.index.Tensor",
    "torch.ops.aten.sym_constrain_range_for_size.default", "torch.ops.aten._assert_scalar.default",
    "torch.ops.aten.item.default", "torch.ops.aten.add", "torch.ops.aten", "torch.ops", "",
]
EXPRESSIONS = [
    "s0", "s77", "s0 + 1", "2*s0", "s0**2", "s0*s1", "u0", "-s0", "s0 - s0", "FloorDiv(s0, 2)",
    "FloorDiv(s0, 0)", "Mod(s0, 0)", "1/0", "zoo", "oo", "-oo", "nan", "int_oo", "Max(s0, oo)",
    "Piecewise((1, s0 > 0), (0, True))", "Eq(s0, 1)", "s0 >= 2", "True", "False", "0", "-1", "1.5",
    "Symbol('s0', positive=True, integer=True)", "Mul(Integer(2), Symbol('s0', integer=True))",
    "9**9**9**9", "s0**99999999", "10**10**10", "2**(2**40)", "Integer(10)**Integer(10)**Integer(10)",
    "Rational(1, 0)", "Float('nan')", "sqrt(-1)", "__import__('os')", "s0.__class__", "lambda: 1",
    "(" * 200 + "s0" + ")" * 200, "s0" + "+s0" * 1500, "s0" + "+s0" * 3000, "1e308*10", "", "s0 s1",
    "Min()", "Max(s0)", "IsNonOverlappingAndDenseIndicator(s0)", "FloorDiv(s0, s1)",
    "s999999999999999999999", "Symbol('')", "Symbol('s0', commutative=False)", "Eq(s0)",
    "Integer(1.5)", "Float(1, precision=99999999)", "Integer('9'*4000)", "ModularIndexing(s0, 0, 0)",
    "Abs(", "(s0", "s0)", "s0 = 1", "s0 == 1 == 2", "~s0", "s0 & s1", "s0 | True", "s0 % 0",
]
# Strings that execute the worker's canary if a name from the file is pasted into generated Python
# source unescaped (fx codegen, ep.module(), guard functions): a hit is outcome other:CodeExecution.
CANARY = "PT2B_FUZZ_CANARY"
INJECTIONS = [
    f'x="""):\n    {CANARY}()\n    return 0 #',
    f'x={CANARY}()):#',
    f'a")+{CANARY}()+getattr(self,"b',
    f"a')+{CANARY}()+getattr(self,'b",
    f'{CANARY}()',
    f'__import__("builtins").{CANARY}()',
    f"x\n{CANARY}()\n",
    f'x=1, y={CANARY}()',
    f"{{{CANARY}()}}",
    f"a\\\"+{CANARY}()+\"",
]
INT_SPECIALS = [0, 1, -1, 2, 3, 7, 64, 2**31 - 1, -(2**31), 2**32, 2**62, 2**63 - 1, -(2**63)]
FLOAT_SPECIALS = [0.0, -0.0, float("nan"), float("inf"), float("-inf"), 1e308, 5e-324, 1.0, -1.0]

# names that end up in generated Python source or in attribute lookups
NAME_PATH = re.compile(r"(forward_arg_names|_name|\.fqn|\.name|\.arg|in_spec|out_spec)(\[\d+\])?$")


class Retry(Exception):
    """This draw cannot be applied (or encoded): the mutator draws again."""


DELETE = object()  # mutate_value's answer "delete this field / element"


def mutate_value(rng, value, strings, path, tree_objs=()):
    """A mutated version of ``value`` and a description of the change."""
    from torch._export.serde.union import _Union

    short = lambda v: repr(v)[:60]  # noqa: E731
    if value is None:
        if path.endswith((".target", "Name", ".name")):
            v = rng.choice(EVIL_TARGETS)
            return v, f"None -> {short(v)}"
        raise Retry
    if isinstance(value, bool):
        return (not value), f"{value} -> {not value}"
    if isinstance(value, enum.IntEnum):
        members = list(type(value))
        v = rng.choice(members + [len(members) + 5, -1, 255])
        return v, f"{short(value)} -> {short(v)}"
    if isinstance(value, int):
        v = rng.choice(INT_SPECIALS + [value + 1, value - 1, -value, value * 2, value + 2**32,
                                       rng.randint(-1000, 1000)])
        if v == value:
            v = value + 1
        return v, f"{value} -> {v}"
    if isinstance(value, float):
        v = rng.choice(FLOAT_SPECIALS + [value * 2, -value, value + 1])
        return v, f"{value} -> {v}"
    if isinstance(value, (str, bytes)):
        was_bytes = isinstance(value, bytes)
        text = value.decode("utf-8", "replace") if was_bytes else value
        v = _mutate_string(rng, text, strings, path)
        if was_bytes:
            v = v.encode("utf-8", "surrogatepass") if isinstance(v, str) else v
            if rng.random() < 0.05:
                v = b"\xff\xfe" + v
        return v, f"{short(value)} -> {short(v)}"
    if isinstance(value, (list, tuple)) or type(value).__name__ == "ndarray":
        lst = list(value)
        how = rng.choice(("drop", "dup", "clear", "reverse", "swap", "elem", "elem"))
        if not lst and how != "dup":
            raise Retry
        if how == "drop":
            i = rng.randrange(len(lst))
            del lst[i]
        elif how == "dup":
            if not lst:
                raise Retry
            i = rng.randrange(len(lst))
            lst.insert(i, lst[i])
        elif how == "clear":
            lst = []
        elif how == "reverse":
            lst.reverse()
        elif how == "swap":
            if len(lst) < 2:
                raise Retry
            i, j = rng.sample(range(len(lst)), 2)
            lst[i], lst[j] = lst[j], lst[i]
        else:
            i = rng.randrange(len(lst))
            lst[i], what = mutate_value(rng, lst[i], strings, f"{path}[{i}]", tree_objs)
            if lst[i] is DELETE:
                raise Retry
            return lst, f"element {i}: {what}"
        return lst, f"list of {len(value)} -> {how} ({len(lst)})"
    if isinstance(value, dict):
        d = dict(value)
        if not d:
            raise Retry
        how = rng.choice(("drop", "clear", "elem"))
        k = rng.choice(list(d))
        if how == "drop":
            del d[k]
        elif how == "clear":
            d = {}
        else:
            d[k], what = mutate_value(rng, d[k], strings, f"{path}[{k!r}]", tree_objs)
            if d[k] is DELETE:
                raise Retry
            return d, f"entry {k!r}: {what}"
        return d, f"dict {how} {k!r}"
    # a table / dataclass / union: delete it or swap in another of the same class from the tree
    same = [x[2] for x in tree_objs if type(x[2]) is type(value) and x[2] is not value]
    if same and rng.random() < 0.6:
        import copy

        other = copy.deepcopy(rng.choice(same))
        return other, f"replaced by another {type(value).__name__}" + (
            f" ({value.type} -> {other.type})" if isinstance(value, _Union) else "")
    return DELETE, f"{type(value).__name__} deleted"


def _mutate_string(rng, text: str, strings, path: str):
    r = rng.random()
    if path.endswith(".target") and r < 0.6:
        return rng.choice(EVIL_TARGETS + [x for x in strings if x.startswith("torch.ops.")])
    if (path.endswith(".expr_str") or path.endswith("<key>")) and r < 0.7:
        return rng.choice(EXPRESSIONS)
    if re.search(NAME_PATH, path) and r < 0.4:
        inj = rng.choice(INJECTIONS)
        return rng.choice((inj, text + inj))
    how = rng.choice(("other", "other", "empty", "truncate", "append", "char", "long", "nul", "expr", "target",
                      "inject", "inject"))
    if how == "inject":
        inj = rng.choice(INJECTIONS)
        return rng.choice((inj, text + inj, inj + text))
    if how == "other" and strings:
        return rng.choice(strings)
    if how == "empty":
        return ""
    if how == "truncate" and text:
        return text[: rng.randrange(len(text))]
    if how == "append":
        return text + rng.choice(("_", "0", ".", "\u00e9", "'", '"', "\\", " ", "\n", "-", "#", ")"))
    if how == "char" and text:
        i = rng.randrange(len(text))
        return text[:i] + chr(rng.choice((0x21 + rng.randrange(94), 0xe9, 0x2603))) + text[i + 1:]
    if how == "long":
        return text * rng.choice((100, 5000)) if text else "x" * 100000
    if how == "nul":
        return text + "\0"
    if how == "expr":
        return rng.choice(EXPRESSIONS)
    return rng.choice(EVIL_TARGETS)
