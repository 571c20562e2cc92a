"""Per-input checks against a placeholder's recorded value, and the symbolic-dim bookkeeping they
share: symbol ranges from ep.range_constraints, binding dims to symbols, derived dims like 2*s0."""

from __future__ import annotations

import math

import torch

from exporter.shared import dims
from exporter.errors import RuntimeInputError

from .bindings import TensorSpec

__all__ = ["SymbolTable", "make_leaf_check"]

_DERIVED = "__derived__"


def _bound(value, default):
    import sympy  # imported only for programs with symbolic dims: `import runtime_ref` stays without it

    from exporter._torch.symbolic import int_oo

    if value is None or value in (int_oo, -int_oo, sympy.oo, -sympy.oo):
        return default
    return int(value)


class SymbolTable:
    """Ranges of the program's shape symbols; binds dims to symbols per call and checks agreement."""

    def __init__(self, range_constraints: dict, names: dict | None = None):
        self.ranges = {sym: (_bound(vr.lower, 0), _bound(vr.upper, math.inf))
                       for sym, vr in range_constraints.items()}
        self.names = names or {}  # symbol -> the user's Dim name (exporter/dims.py)

    def label(self, sym) -> str:
        """'batch (s17)' where the dim has the user's name, else 's17'."""
        return dims.label(sym, self.names)

    def range_text(self, sym) -> str:
        lo, hi = self.ranges.get(sym, (0, math.inf))
        return f"[{lo}, {'inf' if hi == math.inf else hi}]"

    def bind(self, env: dict, sym, value: int, where: str) -> None:
        """Record sym = value (from `where`), checking its range and any earlier binding."""
        seen = env.get(sym)
        if seen is not None:
            if seen[0] != value:
                raise RuntimeInputError(
                    f"{where} is {value}, but {seen[1]} is {seen[0]}: both are the dynamic dim {self.label(sym)} "
                    f"and must be equal")
            return
        lo, hi = self.ranges.get(sym, (0, math.inf))
        if not lo <= value <= hi:
            raise RuntimeInputError(
                f"{where} is {value}, outside the range {self.range_text(sym)} of its dynamic dim {self.label(sym)}")
        env[sym] = (value, where)

    def defer(self, env: dict, expr, value: int, where: str) -> None:
        """A dim recorded as an expression of symbols (e.g. 2*s0): checked once all dims are bound."""
        env.setdefault(_DERIVED, []).append((expr, value, where))

    def check_derived(self, env: dict) -> None:
        pending = env.pop(_DERIVED, [])
        progress = True
        while pending and progress:
            progress = False
            for item in list(pending):
                if self._settle(env, *item):
                    pending.remove(item)
                    progress = True
        # what is left has several unknown symbols or a non-linear form: not checked

    def _settle(self, env: dict, expr, value: int, where: str) -> bool:
        import sympy

        known = {s: sympy.Integer(env[s][0]) for s in expr.free_symbols if s in env}
        rest = expr.xreplace(known)
        free = rest.free_symbols
        if not free:
            if rest.is_Integer and int(rest) != value:
                given = ", ".join(f"{s} = {env[s][0]} from {env[s][1]}" for s in known)
                raise RuntimeInputError(f"{where} is {value}, but it must equal {expr} = {rest} ({given})")
            return True
        if len(free) == 1:
            return self._solve(env, next(iter(free)), rest, expr, value, where)
        return False

    def _solve(self, env, sym, rest, expr, value, where) -> bool:
        """Bind sym from value = a*sym + b; refuse when no integer sym gives value."""
        import sympy

        try:
            poly = sympy.Poly(rest, sym)
        except (sympy.PolynomialError, sympy.GeneratorsNeeded, TypeError):
            return False
        if poly.degree() != 1:
            return False
        a, b = (int(c) for c in poly.all_coeffs())
        if a == 0 or (value - b) % a:
            raise RuntimeInputError(f"{where} is {value}, which no value of {self.label(sym)} can give for the dim {expr}")
        solved = (value - b) // a
        lo, hi = self.ranges.get(sym, (0, math.inf))
        if not lo <= solved <= hi:
            raise RuntimeInputError(f"{where} is {value}, so {self.label(sym)} = {solved} (the dim is {expr}), outside "
                                    f"the range {self.range_text(sym)} of {self.label(sym)}")
        env[sym] = (solved, f"{where} (= {expr})")
        return True


# ---- per-input checks ----

def _fmt_shape(dims) -> str:
    return "[" + ", ".join(str(d) for d in dims) + "]"


def _got(x) -> str:
    if isinstance(x, torch.Tensor):
        return f"a {str(x.dtype).replace('torch.', '')} tensor of shape {list(x.shape)} on {x.device}"
    return f"{type(x).__name__} {x!r}" if isinstance(x, (int, float, bool, str)) else type(x).__name__


def _dim_of(size):
    """(kind, payload): 0 = static int, 1 = a plain symbol, 2 = an expression of symbols. A size is
    an int, a SymInt (a program's fake tensor), or a sympy symbol (a TensorSpec read from the table)."""
    if isinstance(size, int):
        return 0, size
    expr = size.node.expr if isinstance(size, torch.SymInt) else size
    if expr.is_Integer:
        return 0, int(expr)
    return (1, expr) if expr.is_Symbol else (2, expr)


class _TensorCheck:
    def __init__(self, name: str, val: torch.Tensor, device: torch.device, symbols: SymbolTable):
        self.name, self.dtype, self.device, self.symbols = name, val.dtype, device, symbols
        self.recorded = list(val.shape)
        self.dims = [(i, *_dim_of(s)) for i, s in enumerate(val.shape)]
        self.symbolic = any(kind for _, kind, _ in self.dims)
        self.static = None if self.symbolic else torch.Size([p for _, _, p in self.dims])

    def expected(self) -> str:
        return f"a {str(self.dtype).replace('torch.', '')} tensor of shape {_fmt_shape(self.recorded)}"

    def fail(self, what: str, x) -> None:
        raise RuntimeInputError(f'input "{self.name}" {what}; expected {self.expected()}, got {_got(x)}')

    def __call__(self, x, env) -> None:
        if not isinstance(x, torch.Tensor):
            self.fail("is not a tensor", x)
        if x.device != self.device:
            self.fail(f"is on {x.device} but this Runtime runs on {self.device} (it never moves inputs: "
                      f"move it with .to({str(self.device)!r}))", x)
        if x.dtype != self.dtype:
            self.fail(f"has the wrong dtype {x.dtype}", x)
        if self.static is not None and x.shape == self.static:
            return
        self._check_dims(x, env)

    def _check_dims(self, x, env) -> None:
        shape = x.shape
        if len(shape) != len(self.dims):
            self.fail(f"has the wrong rank {len(shape)} (expected rank {len(self.dims)})", x)
        for i, kind, payload in self.dims:
            where = f'dim {i} of input "{self.name}"'
            if kind == 0 and shape[i] != payload:
                self.fail(f"has dim {i} = {shape[i]} but that dim is static and must be {payload}", x)
            elif kind == 1:
                self.symbols.bind(env, payload, shape[i], where)
            elif kind == 2:
                self.symbols.defer(env, payload, shape[i], where)


class _SymIntCheck:
    symbolic = True

    def __init__(self, name: str, val, symbols: SymbolTable):
        self.name, self.kind, self.payload, self.symbols = name, *_dim_of(val), symbols

    def __call__(self, x, env) -> None:
        if not isinstance(x, int) or isinstance(x, bool):
            raise RuntimeInputError(f'input "{self.name}" must be an int ({self.payload}), got {_got(x)}')
        where = f'input "{self.name}"'
        if self.kind == 0 and x != self.payload:
            raise RuntimeInputError(f"{where} is {x} but must be {self.payload}")
        if self.kind == 1:
            self.symbols.bind(env, self.payload, x, where)
        elif self.kind == 2:
            self.symbols.defer(env, self.payload, x, where)


class _TypeCheck:
    symbolic = False

    def __init__(self, name: str, kind, label: str):
        self.name, self.kind, self.label = name, kind, label

    def __call__(self, x, env) -> None:
        if not isinstance(x, self.kind):
            raise RuntimeInputError(f'input "{self.name}" must be a {self.label}, got {_got(x)}')


class _ConstCheck:
    """A non-tensor input the program was specialized on: the call must pass the same value."""

    symbolic = False

    def __init__(self, name: str, val):
        self.name, self.val = name, val

    def __call__(self, x, env) -> None:
        same = x is self.val or (type(x) is type(self.val) and x == self.val)
        if not same and not (isinstance(x, float) and math.isnan(x) and isinstance(self.val, float) and math.isnan(self.val)):
            raise RuntimeInputError(
                f'input "{self.name}" must be {self.val!r}: the program was exported with that value baked in '
                f"(non-tensor inputs are specialized); got {_got(x) if x is not None else 'None'}")


class _NoCheck:
    symbolic = False

    def __call__(self, x, env) -> None:
        return None


def make_leaf_check(name: str, meta: dict, device: torch.device, symbols: SymbolTable):
    """The check for one flat user input, from its placeholder's meta (no 'val' recorded: no check)."""
    if "val" not in meta:
        return _NoCheck()
    val = meta["val"]
    if isinstance(val, (torch.Tensor, TensorSpec)):
        return _TensorCheck(name, val, device, symbols)
    if isinstance(val, torch.SymInt):
        return _SymIntCheck(name, val, symbols)
    if isinstance(val, torch.SymFloat):
        return _TypeCheck(name, (float, int), "float")
    if isinstance(val, torch.SymBool):
        return _TypeCheck(name, bool, "bool")
    if val is None or isinstance(val, (int, float, bool, str)):
        return _ConstCheck(name, val)
    return _TypeCheck(name, type(val), type(val).__name__)
