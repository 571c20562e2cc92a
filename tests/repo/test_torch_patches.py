"""Every patch pt2b makes to a torch object is in exporter/_torch/patches.py's list (issue 41): an AST scan
of exporter/ and runtime_ref/ finds no write to a torch object outside the door and every patch site it
finds declared there, and a process that exports, loads, lowers and runs eager mode replaces exactly the
torch objects the list declares process-wide."""

import ast
import json
import pathlib
import subprocess
import sys

import pytest

from exporter._torch import patches

ROOT = pathlib.Path(__file__).resolve().parents[2]
PACKAGES = ("exporter", "runtime_ref")
DOOR = "exporter/_torch/"
MUTATORS = {"update", "setdefault", "pop", "popitem", "clear", "add", "append", "extend", "insert", "remove",
            "discard", "__setitem__", "__delitem__"}


def _root(node):
    """The name an attribute / subscript / getattr chain starts from (None for anything else)."""
    while True:
        if isinstance(node, (ast.Attribute, ast.Subscript)):
            node = node.value
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "getattr" and node.args:
            node = node.args[0]
        elif isinstance(node, ast.Name):
            return node.id
        else:
            return None


def _returns_a_function(fn) -> bool:
    nested = {n.name for n in ast.walk(fn) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n is not fn}
    return any(isinstance(n, ast.Return) and (isinstance(n.value, ast.Lambda) or (
        isinstance(n.value, ast.Name) and n.value.id in nested)) for n in ast.walk(fn))


class _Scan(ast.NodeVisitor):
    """Patch sites of one module, each (kind, "path::function", detail):

    - ``torch``: an assignment, ``del``, setattr/delattr or mutating call (update, append, ...) on a torch
      object: a name imported from torch (or from the door), or an alias of one made by attribute access;
    - ``instance``: a function (lambda, MethodType, a nested def, or what a function of this module that
      returns one returns) set as an attribute of an object other than self: a method rebound on an instance;
    - ``registration``: a ``py_impl`` call (a rule registered on a torch operator);
    - ``process`` / ``per-trace``: a call of patches.wrap_once / patches.swapped, with its symbol."""

    def __init__(self, path: str, tree: ast.Module):
        self.path, self.sites, self.names = path, [], []
        self.torchy = [set()]
        self.local_defs = [set()]
        self.constants = {t.id: n.value.value for n in tree.body if isinstance(n, ast.Assign)
                          and isinstance(n.value, ast.Constant) and isinstance(n.value.value, str)
                          for t in n.targets if isinstance(t, ast.Name)}
        self.makers = {n.name for n in tree.body if isinstance(n, ast.FunctionDef) and _returns_a_function(n)}

    def _is_torch(self, name) -> bool:
        return name is not None and any(name in s for s in self.torchy)

    def _where(self) -> str:
        return f"{self.path}::{'.'.join(self.names) or '<module>'}"

    def visit_Import(self, node):
        for a in node.names:
            if a.name.split(".")[0] == "torch":
                self.torchy[-1].add(a.asname or "torch")

    def visit_ImportFrom(self, node):
        module = node.module or ""
        if (node.level == 0 and module.split(".")[0] == "torch") or (node.level == 0 and module.startswith("exporter._torch")) \
                or (node.level and module.startswith("_torch")):
            for a in node.names:
                self.torchy[-1].add(a.asname or a.name)

    def _function(self, node):
        for d in node.decorator_list:  # (evaluated where the function is defined)
            self.visit(d)
        self.names.append(node.name)
        self.torchy.append(set())
        self.local_defs.append({n.name for n in ast.walk(node) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
                                and n is not node})
        for child in [*node.args.defaults, *node.args.kw_defaults, *node.body]:
            if child is not None:
                self.visit(child)
        self.local_defs.pop()
        self.torchy.pop()
        self.names.pop()

    visit_FunctionDef = visit_AsyncFunctionDef = _function

    def visit_ClassDef(self, node):
        self.names.append(node.name)
        self.generic_visit(node)
        self.names.pop()

    def _function_like(self, value) -> bool:
        if isinstance(value, ast.Lambda):
            return True
        if isinstance(value, ast.Name):
            return value.id in self.local_defs[-1]
        if isinstance(value, ast.Call):
            f = value.func
            return (isinstance(f, ast.Attribute) and f.attr == "MethodType") or (isinstance(f, ast.Name) and (
                f.id == "MethodType" or f.id in self.makers))
        return False

    def _target(self, target, value):
        if isinstance(target, (ast.Tuple, ast.List)):
            for t in target.elts:
                self._target(t, None)
        elif isinstance(target, ast.Name):
            if value is not None and self._is_torch(_root(value)) and (
                    not isinstance(value, ast.Call) or isinstance(value.func, ast.Name) and value.func.id == "getattr"):
                self.torchy[-1].add(target.id)  # an alias of a torch object
        elif isinstance(target, (ast.Attribute, ast.Subscript)):
            root = _root(target)
            if self._is_torch(root):
                self.sites.append(("torch", self._where(), ast.unparse(target)))
            elif isinstance(target, ast.Attribute) and root not in ("self", "cls") and value is not None \
                    and self._function_like(value):
                self.sites.append(("instance", self._where(), target.attr))

    def visit_Assign(self, node):
        for t in node.targets:
            self._target(t, node.value)
        self.generic_visit(node)

    def visit_AnnAssign(self, node):
        if node.value is not None:
            self._target(node.target, node.value)
        self.generic_visit(node)

    def visit_AugAssign(self, node):
        self._target(node.target, None)
        self.generic_visit(node)

    def visit_Delete(self, node):
        for t in node.targets:
            if isinstance(t, (ast.Attribute, ast.Subscript)) and self._is_torch(_root(t)):
                self.sites.append(("torch", self._where(), f"del {ast.unparse(t)}"))
        self.generic_visit(node)

    def visit_Call(self, node):
        f = node.func
        if isinstance(f, ast.Name) and f.id in ("setattr", "delattr") and node.args:
            if self._is_torch(_root(node.args[0])):
                self.sites.append(("torch", self._where(), ast.unparse(node)))
            elif len(node.args) == 3 and _root(node.args[0]) not in ("self", "cls") and self._function_like(node.args[2]):
                self.sites.append(("instance", self._where(), ast.unparse(node.args[1]).strip("'\"")))
        elif isinstance(f, ast.Attribute) and f.attr in MUTATORS and isinstance(f.value, (ast.Attribute, ast.Subscript)) \
                and self._is_torch(_root(f.value)):
            self.sites.append(("torch", self._where(), ast.unparse(f)))
        elif isinstance(f, ast.Attribute) and f.attr == "py_impl":
            self.sites.append(("registration", self._where(), ast.unparse(f.value)))
        elif isinstance(f, ast.Attribute) and f.attr in ("wrap_once", "swapped") and node.args:
            arg = node.args[0]
            symbol = arg.value if isinstance(arg, ast.Constant) else self.constants.get(getattr(arg, "id", None))
            self.sites.append(("process" if f.attr == "wrap_once" else "per-trace", self._where(), symbol))
        self.generic_visit(node)


def scan() -> list[tuple[str, str, str]]:
    out = []
    for pkg in PACKAGES:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            if "generated" in path.parts:
                continue
            rel = path.relative_to(ROOT).as_posix()
            tree = ast.parse(path.read_text(), rel)
            s = _Scan(rel, tree)
            s.visit(tree)
            out += s.sites
    return out


def test_the_scan_finds_what_it_should(tmp_path):
    """The scan itself, on a module written to patch torch in each way it looks for."""
    code = ("import types\nimport torch\nfrom torch.fx.experimental import symbolic_shapes as ss\n"
            "from ..._torch.tracing import cond_op\n"
            "def f(d, obj):\n    m = ss._free_unbacked_symbols_with_path\n    ss._free_unbacked_symbols_with_path = len\n"
            "    setattr(torch.fx, 'x', 1)\n    torch.utils._pytree.SUPPORTED_NODES.pop(int)\n"
            "    d.deserialize_tensor_meta = types.MethodType(len, d)\n    obj.x = 1\n    self_like = d\n"
            "    @cond_op.py_impl(int)\n    def g():\n        pass\n"
            "def h():\n    patches.wrap_once(_S, len)\n_S = 'a:b'\n")
    tree = ast.parse(code)
    s = _Scan("m.py", tree)
    s.visit(tree)
    kinds = sorted((k, d) for k, _, d in s.sites)
    assert kinds == [("instance", "deserialize_tensor_meta"), ("process", "a:b"), ("registration", "cond_op"),
                     ("torch", "setattr(torch.fx, 'x', 1)"), ("torch", "ss._free_unbacked_symbols_with_path"),
                     ("torch", "torch.utils._pytree.SUPPORTED_NODES.pop")], kinds


def test_nothing_outside_the_door_writes_to_a_torch_object():
    wrong = sorted(f"{where}: {detail}" for kind, where, detail in scan()
                   if kind == "torch" and not where.startswith(DOOR))
    assert not wrong, wrong


def test_every_patch_site_found_is_declared_and_every_declared_patch_is_found():
    declared = {(p.scope, p.site, a) for p in patches.PATCHES if p.scope == "per-instance" for a in p.attributes}
    declared |= {(p.scope, p.site, p.symbol) for p in patches.PATCHES if p.scope in ("process", "per-trace")}
    declared |= {("registration", p.site, p.symbol.rpartition(":")[2]) for p in patches.PATCHES
                 if p.scope == "registration" and "_higher_order_ops" in p.symbol}
    found = {("per-instance" if kind == "instance" else kind, where, detail) for kind, where, detail in scan()
             if kind != "torch"}
    undeclared = sorted(map(str, found - declared))
    assert not undeclared, f"patch sites missing from exporter/_torch/patches.py: {undeclared}"
    unfound = sorted(map(str, {d for d in declared if d[0] != "per-instance"} - found))
    assert not unfound, f"declared patches the code no longer makes: {unfound}"


def test_the_inventory_is_complete_and_names_real_torch_objects():
    """Each entry: a known scope, a reason, the supported releases verified, a site that exists, and a
    symbol this torch has."""
    assert {p.scope for p in patches.PATCHES} == set(patches.SCOPES)
    for p in patches.PATCHES:
        assert p.scope in patches.SCOPES and p.reason and p.tested_on == patches.RELEASES, p
        path, _, function = p.site.partition("::")
        tree = ast.parse((ROOT / path).read_text())
        defined = {n.name for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
        assert function.split(".")[-1] in defined, p.site
        assert patches.resolve(p.symbol) is not None, p.symbol


def test_undeclared_patches_are_refused():
    with pytest.raises(ValueError, match="not declared"):
        patches.wrap_once("torch.export:export", lambda f: f)
    with pytest.raises(ValueError, match="not declared"):
        with patches.swapped("torch.export.exported_program:_create_graph_module_for_export", lambda f: f):
            pass


# torch objects that no pt2b code may leave replaced: every function and class of these modules and the
# functions of their classes, plus the per-trace and per-instance entries' class attributes
_WATCHED_MODULES = (
    "torch.export.exported_program", "torch.fx._lazy_graph_module", "torch.fx.experimental.symbolic_shapes",
    "torch._export.serde.serialize", "torch._decomp.decompositions_for_rng", "torch._subclasses.fake_tensor",
    "torch._subclasses.functional_tensor", "torch.fx.graph_module", "torch._functorch.aot_autograd",
    "torch.utils._pytree", "torch._export.utils", "torch.export",
)

_SCRIPT = r"""
import importlib, inspect, json, sys
import torch
from exporter._torch.patches import PATCHES, resolve

def objects():
    out = {}
    for name in json.loads(sys.argv[1]):
        module = importlib.import_module(name)
        for key, value in list(vars(module).items()):
            if inspect.isfunction(value) or inspect.isclass(value):
                out[f"{name}:{key}"] = value
            if inspect.isclass(value) and value.__module__ == name:
                for attr, member in list(vars(value).items()):
                    if inspect.isfunction(member):
                        out[f"{name}:{key}.{attr}"] = member
    for p in PATCHES:
        found = resolve(p.symbol)
        if found is not None:
            out[p.symbol] = found[2]
    return out

before = objects()
from exporter import eager_decompositions, export_model, load, load_for_backend
model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.LayerNorm(8)).eval()
x = torch.randn(2, 4)
path = sys.argv[2]
export_model(model, (x,), path)
prog = load(path)
prog(x)
lowered = load_for_backend(path, "core", cache=False)
lowered(x)
with eager_decompositions("core"), torch.no_grad():
    model(x)
after = objects()
print(json.dumps(sorted(k for k in before if after.get(k) is not before[k])))
"""


def test_what_a_process_replaces_is_the_declared_process_wide_list(tmp_path):
    """In a fresh process: export, load, run, lower (core), run lowered and eager mode; the torch objects
    replaced afterwards are exactly the inventory's process-wide entries, each a wrapper pt2b made."""
    out = subprocess.run([sys.executable, "-c", _SCRIPT, json.dumps(_WATCHED_MODULES), str(tmp_path / "m.pt2b")],
                         capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-4000:]
    changed = json.loads(out.stdout.strip().splitlines()[-1])
    process = sorted(p.symbol for p in patches.PATCHES if p.scope == "process")
    assert len(process) == 4 and changed == process, changed


def test_the_audit_imports_torchs_test_internals_only_when_it_runs(monkeypatch):
    """exporter/explorer/audit.py reaches torch.testing._internal through the door, when the audit runs;
    a torch that cannot import it is a pt2b error saying so."""
    code = "import sys, exporter.explorer.audit\nprint('torch.testing._internal.common_methods_invocations' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=True,
                          cwd=ROOT).stdout.strip() == "False"
    from exporter._torch import testing
    from exporter.errors import LoweringError

    monkeypatch.setitem(sys.modules, "torch.testing._internal.common_methods_invocations", None)
    with pytest.raises(LoweringError, match="OpInfo samples"):
        testing.op_db()


def test_release_probes_live_in_the_door():
    """Outside exporter/_torch/, no module tries a torch import and catches its ImportError (what a
    release or build may lack is asked of exporter/_torch/compat.py)."""

    def imports_torch(node) -> bool:
        for n in ast.walk(node):
            if isinstance(n, ast.Import) and any(a.name.split(".")[0] == "torch" for a in n.names):
                return True
            if isinstance(n, ast.ImportFrom) and n.level == 0 and (n.module or "").split(".")[0] == "torch":
                return True
            if isinstance(n, ast.Call) and getattr(n.func, "attr", None) == "import_module" and n.args \
                    and isinstance(n.args[0], ast.Constant) and str(n.args[0].value).startswith("torch"):
                return True
        return False

    def catches_import_error(handler) -> bool:
        names = {n.id for n in ast.walk(handler.type) if isinstance(n, ast.Name)} if handler.type is not None \
            else {"ImportError"}
        return bool(names & {"ImportError", "ModuleNotFoundError", "Exception", "BaseException"})

    wrong = []
    for pkg in PACKAGES:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            if rel.startswith(DOOR) or "generated" in path.parts:
                continue
            for node in ast.walk(ast.parse(path.read_text(), rel)):
                if isinstance(node, ast.Try) and any(imports_torch(b) for b in node.body) \
                        and any(catches_import_error(h) for h in node.handlers):
                    wrong.append(f"{rel}:{node.lineno}")
    assert not wrong, wrong
