"""What a lowering computes with that is neither torch's nor pt2b's, as one content digest: the Python
code of the decompositions and custom-op functions a user registered (part of the lowering cache key)."""

from __future__ import annotations

import builtins
import functools
import hashlib
import json
import os
import pathlib
import sys
import sysconfig
import types

import torch

from ..ops import op_name

# torch.library's own registries of the Python functions behind a custom op (read, never written)
from .._torch.library import OPDEFS as _OPDEFS, SIMPLE_REGISTRY as _SIMPLE_REGISTRY

# The code of these is keyed by the versions in the key (torch's, pt2b's, Python's): not walked.
_TORCH_DIR = os.path.dirname(os.path.realpath(torch.__file__)) + os.sep
_PT2B_DIR = str(pathlib.Path(__file__).resolve().parents[1]) + os.sep
_STDLIB_DIRS = tuple({os.path.realpath(sysconfig.get_paths()[k]) + os.sep for k in ("stdlib", "platstdlib")})
_INSTALLED = (os.sep + "site-packages" + os.sep, os.sep + "dist-packages" + os.sep)

# A walk that reaches more objects than this (a decomposition calling into a large library) is not
# keyed: the lowering is not cached rather than cached under a key that may miss a change.
MAX_OBJECTS = 20_000
_MAX_DEPTH = 64
_TORCH_NAMESPACES = {"aten", "prims"}  # ops whose functions are all torch's own
_MAX_TENSOR_BYTES = 1 << 20  # a tensor captured by a decomposition is keyed by its bytes up to this size


class TooFar(Exception):
    """The code reached from a registered function is too large or too deep to key."""


@functools.lru_cache(maxsize=4096)
def _ours(filename: str) -> bool:
    """Whether code from ``filename`` is torch's, pt2b's or Python's own (its version is in the key)."""
    if filename.startswith("<frozen "):
        return True
    path = os.path.realpath(filename) if os.path.isabs(filename) else filename
    if path.startswith((_TORCH_DIR, _PT2B_DIR)):
        return True
    return any(path.startswith(d) and not any(i in path[len(d) - 1:] for i in _INSTALLED) for d in _STDLIB_DIRS)


class _Walk:
    """One sha256 over a callable and everything it computes with, reached by content: bytecode,
    constants, nested code, defaults, closure values, and the functions, modules' functions and plain
    values its code names through its globals. Functions of torch, pt2b and Python itself are named,
    not walked (their versions are in the key), except what they wrap (closures, __wrapped__,
    partial arguments): a user's function registered through torch's decorators is reached."""

    def __init__(self):
        self.h = hashlib.sha256()
        self.seen: dict[int, int] = {}
        self.keep: list = []  # what self.seen names by id stays alive for the walk
        self.user = False  # whether any code outside torch, pt2b and Python was reached

    def token(self, *parts) -> None:
        for p in parts:
            b = p if isinstance(p, bytes) else str(p).encode("utf-8", "surrogatepass")
            self.h.update(len(b).to_bytes(8, "little") + b)

    def _first_visit(self, x) -> bool:
        """False (and a back reference hashed) when ``x`` was walked already: cycles end here."""
        if id(x) in self.seen:
            self.token("ref", self.seen[id(x)])
            return False
        if len(self.seen) >= MAX_OBJECTS:
            raise TooFar(f"more than {MAX_OBJECTS} objects")
        self.seen[id(x)] = len(self.seen)
        self.keep.append(x)
        return True

    def value(self, x, depth: int = 0) -> None:
        if depth > _MAX_DEPTH:
            raise TooFar(f"nested more than {_MAX_DEPTH} deep")
        d = depth + 1
        if x is None or isinstance(x, (bool, int, float, complex, str, bytes)):
            self.token(type(x).__name__, repr(x))
        elif isinstance(x, (tuple, list)):
            self.token(type(x).__name__, len(x))
            for v in x:
                self.value(v, d)
        elif isinstance(x, (set, frozenset)):  # in no fixed order: each element's own digest, sorted
            self.token(type(x).__name__, *sorted(_digest_of(v, d) for v in x))
        elif isinstance(x, dict):
            self.token("dict", len(x))
            for k, v in sorted(x.items(), key=lambda kv: repr(kv[0])):
                self.value(k, d)
                self.value(v, d)
        elif isinstance(x, types.CodeType):
            self.code(x, None, d)
        elif isinstance(x, types.FunctionType):
            self.function(x, d)
        elif isinstance(x, functools.partial):
            if self._first_visit(x):
                self.token("partial")
                self.value(x.func, d)
                self.value(x.args, d)
                self.value(x.keywords, d)
        elif isinstance(x, types.MethodType):  # the function, and the object it is bound to
            self.token("method", _name(type(x.__self__)))
            self.value(x.__func__, d)
            self.state(x.__self__, d)
        elif isinstance(x, types.ModuleType):
            self.token("module", x.__name__)
        elif isinstance(x, torch.Tensor):
            self.tensor(x)
        elif isinstance(x, type):
            self.token("named", _name(x))
            self.klass(x, d)
        elif isinstance(x, (types.BuiltinFunctionType, torch._ops.OpOverload, torch._ops.OpOverloadPacket)):
            self.token("named", _name(x))
        elif callable(x) and isinstance(getattr(type(x), "__call__", None), types.FunctionType):
            self.token("callable", _name(type(x)))  # a callable object: its class's code and its state
            self.value(type(x).__call__, d)
            self.state(x, d)
        else:
            self.token("object", _name(type(x)))
            self.state(x, d)

    def state(self, x, depth: int) -> None:
        """An object of a user's class: its attributes (a setting its code reads) and the functions
        of its user-defined classes (its methods). Torch's and Python's own objects are named by
        type only."""
        if not _users_class(type(x)) or not self._first_visit(x):
            return
        held = getattr(x, "__dict__", None)
        self.value(held if isinstance(held, dict) else None, depth)
        self.klass(type(x), depth)

    def klass(self, cls: type, depth: int) -> None:
        """The functions, plain class attributes and properties of ``cls`` and of each of its bases
        that is a user's class."""
        for c in cls.__mro__:
            if not _users_class(c) or not self._first_visit(c):
                continue
            self.token("class", _name(c))
            for name, attr in sorted(vars(c).items()):
                if isinstance(attr, (staticmethod, classmethod)):
                    attr = attr.__func__
                elif isinstance(attr, property):
                    attr = (attr.fget, attr.fset)
                if isinstance(attr, (types.FunctionType, tuple, int, float, str, bytes, bool)) or attr is None:
                    self.token(name)
                    self.value(attr, depth)

    def tensor(self, t: torch.Tensor) -> None:
        if t.is_meta or t.layout != torch.strided or t.device.type != "cpu":
            self.token("tensor", t.dtype, tuple(t.shape), t.device, t.layout)
            return
        if t.numel() * t.element_size() > _MAX_TENSOR_BYTES:
            raise TooFar("a captured tensor larger than the key reads")
        try:
            data = t.detach().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
        except (RuntimeError, TypeError):  # a layout without plain bytes (quantized): named by its shape
            data = b""
        self.token("tensor", t.dtype, tuple(t.shape), data)

    def function(self, fn: types.FunctionType, depth: int) -> None:
        if not self._first_visit(fn):
            return
        code = fn.__code__
        d = depth + 1
        if _ours(code.co_filename):
            self.token("ours", fn.__module__, fn.__qualname__)
            for cell in fn.__closure__ or ():  # what torch's decorators wrap
                try:
                    inner = cell.cell_contents
                except ValueError:  # an empty cell
                    continue
                if callable(inner) and not isinstance(inner, type):
                    self.value(inner, d)
        else:
            self.user = True
            self.token("function")
            self.code(code, fn.__globals__, d)
            self.value(fn.__defaults__, d)
            self.value(fn.__kwdefaults__, d)
            for cell in fn.__closure__ or ():
                try:
                    self.value(cell.cell_contents, d)
                except ValueError:
                    self.token("empty cell")
        wrapped = fn.__dict__.get("__wrapped__")
        if wrapped is not None:
            self.value(wrapped, d)

    def code(self, code: types.CodeType, globals_: dict | None, depth: int) -> None:
        """The bytecode and constants of ``code`` and of its nested code, then what the names it
        uses hold in ``globals_`` (functions and plain values; a module's attributes it names)."""
        names: list[str] = []
        stack = [code]
        while stack:
            c = stack.pop()
            self.token("code", c.co_argcount, c.co_posonlyargcount, c.co_kwonlyargcount, c.co_flags,
                       c.co_code, *c.co_names, "|", *c.co_freevars, "|", *c.co_cellvars)
            names.extend(c.co_names)
            for k in c.co_consts:
                if isinstance(k, types.CodeType):
                    stack.append(k)
                    self.token("nested")
                else:
                    self.value(k, depth)
        if globals_ is None:
            return
        wanted = set(names)
        for name in sorted(wanted):
            if name not in globals_:
                continue  # a builtin, or an attribute name
            self.token("global", name)
            held = globals_[name]
            self.value(held, depth)
            if isinstance(held, types.ModuleType) and not (held.__name__ in sys.builtin_module_names
                                                           or _ours(getattr(held, "__file__", None) or "<unknown>")):
                for attr in sorted(wanted):  # module.attr: the attributes this code names
                    if attr != name and attr in vars(held):
                        self.token("attr", attr)
                        self.value(vars(held)[attr], depth)

    def hexdigest(self) -> str:
        return self.h.hexdigest()


def _users_class(cls: type) -> bool:
    """Whether ``cls`` is defined outside torch, pt2b and Python (a class made at run time is the user's)."""
    if cls.__module__ == "builtins":  # (also where a class made by exec() without a module says it is)
        return getattr(builtins, cls.__name__, None) is not cls
    module = sys.modules.get(cls.__module__ or "")
    return not _ours(getattr(module, "__file__", None) or "<unknown>")


def _name(x) -> str:
    return f"{getattr(x, '__module__', '') or ''}.{getattr(x, '__qualname__', None) or getattr(x, '__name__', repr(x))}"


def _digest_of(x, depth: int) -> str:
    w = _Walk()
    w.value(x, depth)
    return w.hexdigest()


def _reaches_user_code(x, seen: set) -> bool:
    """Whether ``x`` is, or wraps, a function outside torch, pt2b and Python (the quick test that
    spares hashing torch's own table, entry by entry)."""
    if id(x) in seen or len(seen) > MAX_OBJECTS:
        return len(seen) > MAX_OBJECTS  # (too much: the full walk says so)
    seen.add(id(x))
    if isinstance(x, types.FunctionType):
        if not _ours(x.__code__.co_filename):
            return True
        inner = []
        for cell in x.__closure__ or ():
            try:
                inner.append(cell.cell_contents)
            except ValueError:
                pass
        inner.append(x.__dict__.get("__wrapped__"))
    elif isinstance(x, functools.partial):
        inner = [x.func, *x.args, *x.keywords.values()]
    elif isinstance(x, types.MethodType):
        inner = [x.__func__]
    elif isinstance(x, (list, tuple)):
        inner = list(x)
    elif isinstance(x, dict):
        inner = list(x.values())
    elif callable(x) and not isinstance(x, type):
        return _users_class(type(x))  # a callable object of a user's class (its methods and settings)
    else:
        return False
    return any(_reaches_user_code(i, seen) for i in inner if callable(i) or isinstance(i, (list, tuple, dict)))


# Callables found to be torch's, pt2b's or Python's own through and through (the entries of torch's
# tables, looked at on every lowering), by id, each held so that its id is not reused.
_OWN: dict[int, object] = {}


def callable_digest(fn) -> str | None:
    """The sha256 of what ``fn`` computes with, or None when it is torch's, pt2b's or Python's own
    (keyed by their versions). Raises TooFar when it reaches too much to key."""
    if id(fn) in _OWN:
        return None
    if not _reaches_user_code(fn, set()):
        if isinstance(fn, (types.FunctionType, functools.partial, types.BuiltinFunctionType)) and len(_OWN) < MAX_OBJECTS:
            _OWN[id(fn)] = fn
        return None
    w = _Walk()
    w.value(fn)
    return w.hexdigest() if w.user else None


def _op_functions(qualname: str) -> list:
    """The Python functions torch.library holds for the custom op ``qualname`` ("ns::name"): its
    implementation and per-device kernels, fake kernel and dispatch rules (custom_op), and the fake
    kernel register_fake records for it. Kernels registered from C++, or as a raw Library.impl, are
    not reachable from Python: such an op is known by its name only."""
    found = []
    opdef = _OPDEFS.get(qualname)
    if opdef is not None:
        for field in ("_init_fn", "_abstract_fn", "_backend_fns", "_torch_dispatch_fns", "_vmap_fn"):
            value = getattr(opdef, field, None)
            if value:
                found.append(value)
    # (its get() reads; find() would add an entry to torch's registry)
    entry = _SIMPLE_REGISTRY.get(qualname) if hasattr(_SIMPLE_REGISTRY, "get") else None
    kernel = getattr(getattr(getattr(entry, "fake_impl", None), "kernel", None), "func", None)
    if kernel is not None:
        found.append(kernel)
    return found


def lowering_code_digest(table: dict, op_qualnames) -> str | None:
    """One digest of the user code a lowering computes with: each decomposition of ``table`` (op ->
    function) that is not torch's or pt2b's, and the registered Python functions of each custom op
    of ``op_qualnames`` (the program's ops, "ns::name") and of the table. "" when there is none; None
    when some code reaches too far to key (the lowering is then not cached)."""
    what: dict[str, str] = {}
    try:
        for op, fn in table.items():
            digest = callable_digest(fn)
            if digest is not None:
                what[f"decomposition {op_name(op)}"] = digest
        custom = set(op_qualnames) | {op._schema.name for op in table if isinstance(op, torch._ops.OpOverload)}
        for qualname in sorted(q for q in custom if q.partition("::")[0] not in _TORCH_NAMESPACES):
            functions = _op_functions(qualname)
            digest = callable_digest(functions) if functions else None
            if digest is not None:
                what[f"op {qualname}"] = digest
    except TooFar:
        return None
    if not what:
        return ""
    what["python"] = sys.implementation.cache_tag or sys.version  # bytecode is per Python version
    return hashlib.sha256(json.dumps(what, sort_keys=True).encode()).hexdigest()
