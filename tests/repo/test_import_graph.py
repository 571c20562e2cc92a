"""The import graph of exporter/ and runtime_ref/ has no cycle, and the layers call down: every
import counts (also one inside a function, which only hides a cycle until the call)."""

import ast
import graphlib
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
PACKAGES = ("exporter", "runtime_ref")


def _modules() -> dict[str, tuple[pathlib.Path, bool]]:
    """module name -> (file, is a package's __init__), generated code left out."""
    out = {}
    for pkg in PACKAGES:
        for path in (ROOT / pkg).rglob("*.py"):
            if "generated" in path.parts:
                continue
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            is_pkg = parts[-1] == "__init__"
            out[".".join(parts[:-1] if is_pkg else parts)] = (path, is_pkg)
    return out


def _targets(name: str, is_pkg: bool, node: ast.AST, modules) -> list[str]:
    """The modules of ours that an import statement of module ``name`` loads."""
    if isinstance(node, ast.Import):
        found = [a.name for a in node.names]
    else:
        if node.level:
            base = name.split(".")
            base = base if is_pkg else base[:-1]
            base = base[:len(base) - (node.level - 1)]
            prefix = ".".join(base + ([node.module] if node.module else []))
        else:
            prefix = node.module or ""
        found = [f"{prefix}.{a.name}" if f"{prefix}.{a.name}" in modules else prefix for a in node.names]
    out = []
    for target in found:
        if "generated" in target.split("."):
            continue  # flatc's code for schemas/pt2b.fbs (left out above): it imports nothing of ours
        while target not in modules and "." in target:
            target = target.rsplit(".", 1)[0]
        if target in modules and target != name:
            out.append(target)
    return out


def import_graph() -> dict[str, set[str]]:
    modules = _modules()
    graph = {}
    for name, (path, is_pkg) in modules.items():
        deps = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                deps.update(_targets(name, is_pkg, node, modules))
        graph[name] = deps
    return graph


def test_the_import_graph_has_no_cycle():
    graph = import_graph()
    assert len(graph) > 60 and "exporter.errors" in graph["exporter"] and "exporter.api" in graph["exporter.cli.export"]
    try:
        tuple(graphlib.TopologicalSorter(graph).static_order())
    except graphlib.CycleError as e:
        pytest.fail(f"import cycle: {' -> '.join(e.args[1])}")


def test_a_cycle_is_found():
    """The check itself: a module pair importing each other is a CycleError."""
    with pytest.raises(graphlib.CycleError):
        tuple(graphlib.TopologicalSorter({"a": {"b"}, "b": {"a"}}).static_order())


def _within(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


@pytest.mark.parametrize("lower, upper", [
    ("exporter.functionalize", "exporter.lowering"),
    ("exporter.serialize", "exporter.api"),
    # the reader and writer call versioning, never the reverse; versioning reads the format's layout
    # (exporter/layout: the schema as data, below both; test_the_format_layout_is_below_versioning)
    ("exporter.versioning", "exporter.serialize"),
    ("exporter.layout", "exporter.versioning"),
    ("exporter.layout", "exporter.serialize"),
    ("exporter.serialize", "exporter.lowering"),
    ("exporter.lowering", "exporter.api"),
    # a lowering request flows one way: the user's words (request.py) above the plan, a backend's
    # own op list handed down as data, the read stage (loading.py) and the program below the lowering
    ("exporter.lowering", "exporter.request"),
    ("exporter.lowering", "exporter.backends"),
    ("exporter.program", "exporter.lowering"),
    ("exporter.loading", "exporter.lowering"),
    ("exporter.backends", "exporter.api"),
    ("exporter.shared", "exporter.lowering"),
    ("exporter.shared", "exporter.serialize"),
    ("exporter.mutation", "exporter.functionalize"),
    ("exporter.exporting", "exporter.api"),
    ("exporter.lowering.engines", "exporter.lowering.lower"),
    ("runtime_ref", "exporter.api"),
    ("exporter.versioning", "exporter.api"),
    # the command line and the opset explorer are upper layers: nothing below them imports them
    ("exporter.lowering", "exporter.explorer"),
    ("exporter.lowering", "exporter.cli"),
    ("exporter.serialize", "exporter.cli"),
    ("exporter.versioning", "exporter.cli"),
    ("exporter.explorer", "exporter.cli"),
    ("runtime_ref", "exporter.cli"),
])
def test_layers_call_down(lower, upper):
    graph = import_graph()
    wrong = sorted(f"{m} -> {d}" for m, deps in graph.items() if _within(m, lower)
                   for d in deps if _within(d, upper))
    assert not wrong, wrong


def test_the_format_layout_is_below_versioning():
    """layout (the container, the schema read as data, the segment records) imports nothing of
    ours but errors, package data and the generated code: versioning may read it and stay below the
    reader and writer."""
    graph = import_graph()
    allowed = ("exporter.errors", "exporter.package_data", "exporter.layout", "exporter.layout.generated")
    wrong = sorted(f"{m} -> {d}" for m, deps in graph.items() if _within(m, "exporter.layout")
                   for d in deps if not any(_within(d, a) for a in allowed))
    assert not wrong, wrong
    assert "exporter.layout.fbs" in graph["exporter.versioning.formats"]


def test_the_lowering_engines_have_one_way_in():
    """Outside exporter/lowering/engines/, the engines are reached through the package itself
    (its __init__), not through one engine's module."""
    graph = import_graph()
    wrong = sorted(f"{m} -> {d}" for m, deps in graph.items() if not _within(m, "exporter.lowering.engines")
                   for d in deps if d.startswith("exporter.lowering.engines."))
    assert not wrong, wrong


def _imported_names():
    """(importing module, imported module, name) of every ``from <module of ours> import name`` that
    takes a name (not a submodule) from a module of ours."""
    modules = _modules()
    for name, (path, is_pkg) in modules.items():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not isinstance(node, ast.ImportFrom):
                continue
            for alias in node.names:
                one = ast.ImportFrom(module=node.module, names=[alias], level=node.level)
                for target in _targets(name, is_pkg, one, modules):
                    if not target.endswith("." + alias.name):  # (a submodule is not a name of its package)
                        yield name, target, alias.name


def test_no_module_imports_a_private_name_of_another():
    """A module of ours takes from another only its public names (no ``from m import _x``)."""
    wrong = sorted(f"{m} imports {t}.{n}" for m, t, n in _imported_names()
                   if n.startswith("_") and not n.startswith("__"))
    assert not wrong, wrong


@pytest.mark.parametrize("face", ["exporter.functionalize", "exporter.lowering.engines"])
def test_functionalization_and_the_engines_are_used_through_their_public_api(face):
    """What other modules take from functionalization and from the lowering engines' way in is in
    that module's __all__."""
    modules = _modules()
    tree = ast.parse(modules[face][0].read_text())
    (public,) = [ast.literal_eval(n.value) for n in tree.body if isinstance(n, ast.Assign)
                 and any(isinstance(t, ast.Name) and t.id == "__all__" for t in n.targets)]
    wrong = sorted(f"{m} imports {t}.{n}" for m, t, n in _imported_names() if t == face and n not in public)
    assert not wrong, wrong


def test_import_exporter_loads_the_api_on_first_use():
    """`import exporter` (and `pt2b --version`) cost little more than `import torch`: the API,
    torch.export's serializer (which imports torch._dynamo) and the lowering load when first used."""
    import subprocess
    import sys

    code = ("import sys, exporter\n"
            "print(sorted(m for m in ('torch', 'exporter.api', 'torch._dynamo') if m in sys.modules))\n"
            "exporter.load\n"
            "print('exporter.api' in sys.modules, 'torch._dynamo' in sys.modules)\n"
            "from exporter.cli.inspect import summarize\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=True).stdout
    assert out.split("\n")[:2] == ["[]", "True True"], out
    code = "import sys, exporter.cli.inspect, runtime_ref\nprint('torch._dynamo' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                          check=True).stdout.strip() == "False"


def test_import_runtime_ref_imports_no_sympy():
    """`import runtime_ref` leaves sympy (slow to import) to programs with symbolic dims."""
    import subprocess
    import sys

    code = "import sys, runtime_ref\nprint('sympy' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                          check=True).stdout.strip() == "False"


def _private_torch_imports_in(tree: ast.AST):
    """What each import statement in ``tree`` takes from a private torch module or name: one whose dotted
    path has a part starting with "_" (``from torch._x import y`` counts torch._x, and torch._x.y too where
    y is a module; ``from torch.m import _f`` counts torch.m._f)."""
    import importlib.util

    def is_module(name):
        try:
            return importlib.util.find_spec(name) is not None
        except (ImportError, ValueError):
            return False

    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found = [node.module] + [f"{node.module}.{a.name}" for a in node.names
                                     if a.name.startswith("_") or is_module(f"{node.module}.{a.name}")]
        else:
            continue
        for target in found:
            parts = target.split(".")
            if parts[0] == "torch" and any(p.startswith("_") and not p.startswith("__") for p in parts):
                yield target


def _private_torch_imports():
    """(module of ours, what it imports) for every import of a private torch module or name."""
    for name, (path, _) in _modules().items():
        for target in _private_torch_imports_in(ast.parse(path.read_text(), str(path))):
            yield name, target


def test_only_the_door_imports_torch_internals():
    """exporter/_torch/ is the one door to torch's private modules and names: no other module of
    exporter/ or runtime_ref/ imports one (an attribute such as ``torch._ops.OpOverload`` is not an
    import); what a module needs is named there (docs/architecture.md#where-each-concept-lives)."""
    found = list(_private_torch_imports())
    assert any(_within(m, "exporter._torch") for m, _ in found)  # (the scan sees the door)
    wrong = sorted(f"{m} imports {t}" for m, t in found if not _within(m, "exporter._torch"))
    assert not wrong, wrong


def test_the_door_scan_finds_each_kind_of_private_import():
    """The scan itself, on planted imports: a private module, a module under one, a private name of a
    public module, inside a function too; public imports and attribute uses pass."""
    planted = ("import torch._guards\n"
               "from torch._library.custom_ops import OPDEFS\n"
               "from torch.amp.autocast_mode import _enter_autocast\n"
               "def f():\n    from torch.utils import _pytree\n")
    assert set(_private_torch_imports_in(ast.parse(planted))) == {
        "torch._guards", "torch._library.custom_ops", "torch.amp.autocast_mode._enter_autocast",
        "torch.utils._pytree"}
    clean = "import torch\nfrom torch.export import export\nx = torch._ops.OpOverload\nfrom ._torch import serde\n"
    assert not list(_private_torch_imports_in(ast.parse(clean)))


def test_each_private_torch_module_has_one_importer():
    """A private torch module (or a private name of a torch module) is imported by one module of ours:
    what more than one module needs comes through the door (exporter/_torch/)."""
    importers: dict[str, set[str]] = {}
    for m, t in _private_torch_imports():
        importers.setdefault(t, set()).add(m)
    assert "torch._export.serde.serialize" in importers  # (the scan sees the door)
    wrong = sorted(f"{t}: {sorted(ms)}" for t, ms in importers.items() if len(ms) > 1)
    assert not wrong, wrong


def test_the_command_line_imports_no_tqdm_until_a_bar_is_drawn():
    """`pt2b verify` starts hashing before torch is imported (cli/verify.py); tqdm, imported by
    the command modules, delayed that start: it is imported when a bar is first drawn."""
    import subprocess
    import sys

    code = "import sys, exporter.cli, exporter.cli.verify, exporter.cli.progress\nprint('tqdm' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                          check=True).stdout.strip() == "False"


# runtime_ref stands on exporter's public names, the shared core and torch's door, never on exporter's layout
SHARED_CORE = ("exporter.shared", "exporter._torch")


def _public_names() -> dict[str, set[str]]:
    """Public package -> its ``__all__`` (exporter's packages, as docs/api.md lists them)."""
    from tools.api_reference import public_packages

    return {p.__name__: set(p.__all__) for p in public_packages() if _within(p.__name__, "exporter")}


def exporter_imports_outside_the_edge(source: str, public: dict[str, set[str]]) -> list[str]:
    """Each import of exporter in ``source`` (a runtime_ref module) that takes something other than a
    public name (a name in a public package's ``__all__``, or that package) or a module inside the
    shared core."""
    wrong = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            taken = [(a.name, None) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            taken = [(node.module, a.name) for a in node.names]
        else:
            continue
        for module, name in taken:
            if module.split(".")[0] != "exporter" or any(_within(module, c) for c in SHARED_CORE):
                continue
            if module in public and (name is None or name in public[module]):
                continue
            wrong.append(f"line {node.lineno}: {module}" + (f" import {name}" if name else ""))
    return wrong


def test_runtime_ref_imports_exporter_only_through_its_public_names_and_the_shared_core():
    public = _public_names()
    assert {"exporter", "exporter.errors", "exporter.backends"} <= set(public)
    wrong = [f"{m}: {w}" for m, (path, _) in _modules().items() if _within(m, "runtime_ref")
             for w in exporter_imports_outside_the_edge(path.read_text(), public)]
    assert not wrong, wrong
    graph = import_graph()
    assert "exporter.shared" in graph["runtime_ref.runtime"]  # (the scan sees runtime_ref's imports)


def test_an_import_of_exporter_internals_is_caught():
    public = {"exporter": {"errors", "load", "LoweredProgram"}, "exporter.errors": {"OpsetError"}}
    source = ("import torch\nfrom exporter import load, LoweredProgram\nfrom exporter.errors import OpsetError\n"
              "from exporter.shared import op_name\nfrom exporter._torch.pytree import pytree\n"
              "from exporter.ops import op_name\nfrom exporter import names\nimport exporter.lowering.lowered\n"
              "from exporter.errors import NotPublicError\n"
              "def f():\n    from exporter.graph_walk import walk_graphs\n")
    assert exporter_imports_outside_the_edge(source, public) == [
        "line 6: exporter.ops import op_name", "line 7: exporter import names", "line 8: exporter.lowering.lowered",
        "line 9: exporter.errors import NotPublicError", "line 11: exporter.graph_walk import walk_graphs"]
