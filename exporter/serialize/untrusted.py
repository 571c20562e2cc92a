"""Checks on a decoded program before torch's deserializer sees it, so that nothing in a file is
evaluated or resolved to an arbitrary Python object: node targets must be operators (or SymInt
arithmetic), and symbolic expressions must be plain arithmetic over symbols.

Why: torch's deserializer parses expressions with sympy.sympify (which uses eval) and resolves a
node's target by getattr from the torch module (so "torch.os.system" would resolve and be called)."""

from __future__ import annotations

import dataclasses
import io
import operator
import re
import tokenize

from torch._export.serde import schema as S
from torch._export.serde.serialize import _SYM_OPS
from torch._export.serde.union import _Union

from ..errors import CorruptArtifactError

_PYTHON_TARGETS = {f"{fn.__module__}.{fn.__name__}" for fn in (*_SYM_OPS, operator.getitem)}
_OP_TARGET = re.compile(r"torch\.ops\.(?!__)\w+\.(?!__)\w+(\.(?!__)\w+)?")
_SYMBOL = re.compile(r"[a-z]{1,8}\d+")
_EXPR_FUNCTIONS = {
    # the functions torch's deserializer hands to sympify, and the sympy names str() prints
    "FloorDiv", "ModularIndexing", "Where", "PythonMod", "Mod", "CleanDiv", "CeilToInt", "FloorToInt",
    "CeilDiv", "LShift", "RShift", "PowByNatural", "FloatPow", "FloatTrueDiv", "IntTrueDiv",
    "IsNonOverlappingAndDenseIndicator", "TruncToFloat", "TruncToInt", "RoundToInt", "RoundDecimal",
    "ToFloat", "Identity", "Max", "Min", "Abs", "floor", "ceiling", "Eq", "Ne", "Lt", "Le", "Gt", "Ge",
    "And", "Or", "Not", "Piecewise", "sqrt", "True", "False", "oo", "zoo", "nan", "Integer", "Rational",
    "Float", "sign", "int_oo",
}
_EXPR_OPS = {"+", "-", "*", "/", "//", "**", "%", "(", ")", ",", "<", "<=", ">", ">=", "==", "!=", "&", "|", "~", "="}
# torch also writes sympy's srepr form: Mul(Integer(2), Symbol('s77', positive=True, integer=True))
_ASSUMPTIONS = {"positive", "negative", "nonnegative", "nonpositive", "integer", "real", "finite",
                "infinite", "zero", "nonzero", "even", "odd", "rational", "commutative", "extended_real",
                "precision", "evaluate"}
_QUOTED_NAME = re.compile(r"""(['"])[A-Za-z_]\w{0,63}\1""")


def _sympy_class(name: str) -> bool:
    """A sympy class (Mul, Integer, Symbol, StrictLessThan, ...): constructing one evaluates nothing."""
    import sympy

    return not name.startswith("_") and isinstance(getattr(sympy, name, None), type)
MAX_EXPR_LEN = 4096


def check_expr(expr: str, where: str) -> None:
    """Raise unless ``expr`` is arithmetic over numbers, symbols and known sympy functions."""
    if len(expr) > MAX_EXPR_LEN:
        raise CorruptArtifactError(f"{where}: symbolic expression of {len(expr)} characters is too long.")
    try:
        tokens = list(tokenize.generate_tokens(io.StringIO(expr).readline))
    except (tokenize.TokenError, SyntaxError, IndentationError) as e:
        raise CorruptArtifactError(f"{where}: symbolic expression {expr[:80]!r} does not parse ({e}).") from None
    for tok in tokens:
        if tok.type in (tokenize.NEWLINE, tokenize.NL, tokenize.ENDMARKER, tokenize.NUMBER):
            continue
        if tok.type == tokenize.NAME and (tok.string in _EXPR_FUNCTIONS or tok.string in _ASSUMPTIONS
                                          or _SYMBOL.fullmatch(tok.string) or _sympy_class(tok.string)):
            continue
        if tok.type == tokenize.STRING and _QUOTED_NAME.fullmatch(tok.string):
            continue
        if tok.type == tokenize.OP and tok.string in _EXPR_OPS:
            continue
        raise CorruptArtifactError(
            f"{where}: symbolic expression {expr[:80]!r} contains {tok.string!r}, which is not "
            f"arithmetic over symbols; pt2b never evaluates such text."
        )


def check_target(target: str, where: str) -> None:
    if _OP_TARGET.fullmatch(target) or target in _PYTHON_TARGETS:
        return
    raise CorruptArtifactError(
        f"{where}: node calls {target[:120]!r}, which is neither a torch.ops operator nor SymInt "
        f"arithmetic; pt2b does not resolve or call arbitrary Python objects from a file."
    )


def check_program(ep: S.ExportedProgram, where: str) -> None:
    """Walk every value of the decoded program (subgraphs included) and check it."""
    stack = [(ep, "program")]
    while stack:
        obj, path = stack.pop()
        if isinstance(obj, S.SymExpr):
            check_expr(obj.expr_str, f"{where}: {path}")
        elif isinstance(obj, S.Node):
            check_target(obj.target, f"{where}: node {obj.name or '?'}")
        if isinstance(obj, _Union):
            stack.append((obj.value, path))
        elif dataclasses.is_dataclass(obj):
            label = getattr(obj, "name", None) if isinstance(obj, S.Node) else None
            for f in dataclasses.fields(obj):
                stack.append((getattr(obj, f.name), f"{path}.{label or f.name}" if label else path))
        elif isinstance(obj, (list, tuple)):
            stack.extend((x, path) for x in obj)
        elif isinstance(obj, dict):
            stack.extend((v, f"{path}[{k!r}]") for k, v in obj.items())
    for name in ep.range_constraints:
        if not _SYMBOL.fullmatch(name):
            check_expr(name, f"{where}: range constraint key")
