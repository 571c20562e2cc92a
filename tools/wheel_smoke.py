"""Build pt2b's sdist and wheel, install the wheel into a fresh venv beside torch, and use it from a
directory outside the checkout: what a user of `pip install pt2b` gets (.ci/run runs this).

    python3 -m tools.wheel_smoke [--torch torch==2.13.0] [--dir DIR]

The wheel is built from the sdist (python -m build), so both are checked: a file the package reads
that either leaves out fails here. The smoke test runs the demo, `pt2b --version`, `pt2b inspect`,
exports, loads, lowers (core and max) and runs a model on runtime_ref against eager, checking that
every module it imported came from the venv, not the checkout, and writes the opset explorer page
from its shipped corpus routes (no transformers in that venv). The wheel's file list holds no corpus
builder (corpus_builders): they are developer tools, in tools/corpus/.
"""

from __future__ import annotations

import argparse
import ast
import pathlib
import re
import subprocess
import sys
import tempfile
import zipfile

REPO = pathlib.Path(__file__).resolve().parents[1]

SMOKE = r'''
import pathlib, sys
import torch
import exporter, runtime_ref
from exporter import export_model, load, load_for_backend
from runtime_ref import Runtime

venv = pathlib.Path(sys.prefix).resolve()
for mod in (exporter, runtime_ref):
    where = pathlib.Path(mod.__file__).resolve()
    assert venv in where.parents, f"{mod.__name__} imported from {where}, not from the venv {venv}"
checkout = pathlib.Path(sys.argv[1]).resolve()
for name, m in list(sys.modules.items()):
    f = getattr(m, "__file__", None)
    if f and checkout in pathlib.Path(f).resolve().parents:
        raise AssertionError(f"{name} was imported from the checkout: {f}")

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.LayerNorm(16)).eval()
x = torch.randn(4, 8)
export_model(model, (x,), "m.pt2b")
assert torch.equal(load("m.pt2b")(x), model(x))
for preset in ("core", "max"):
    lowered = load_for_backend("m.pt2b", preset)
    torch.testing.assert_close(Runtime(lowered)(x), model(x))
print("smoke: export, load, lower (core, max) and runtime_ref from the installed wheel: ok")
'''


def _imports(tree: ast.Module, top_level_only: bool) -> list[str]:
    """The modules an import statement of ``tree`` names: all of them, or those run at import time
    (module level, also inside a top-level if/try/with) when ``top_level_only``."""
    if top_level_only:
        nodes, stack = [], list(tree.body)
        while stack:
            node = stack.pop()
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                continue
            nodes.append(node)
            stack.extend(ast.iter_child_nodes(node))
    else:
        nodes = list(ast.walk(tree))
    return [a.name for n in nodes if isinstance(n, ast.Import) for a in n.names] + \
           [n.module for n in nodes if isinstance(n, ast.ImportFrom) and n.module and not n.level]


USER_MODEL = "exporter/hf.py"  # builds the one model a user names (`pt2b export --hf`), never a corpus


def corpus_builders(files: dict[str, str | None]) -> list[str]:
    """The files of a package listing (path in the wheel -> a .py file's text, None for other files) that
    are corpus builders or reach for them: anything of tools/, a *zoo* or corpus-sample file, a module
    importing transformers beyond its exporters' tables (its model classes only the corpora build), or a module importing tools at
    import time (the product reaches the builders only when asked: exporter/explorer/corpus.py)."""
    found = []
    for name, text in sorted(files.items()):
        parts = pathlib.PurePosixPath(name).parts
        why = None
        if parts and parts[0] == "tools":
            why = "a developer tool"
        elif re.search(r"zoo|transformers_sample", parts[-1] if parts else ""):
            why = "a model zoo"
        elif text is not None and name.endswith(".py"):
            tree = ast.parse(text, name)
            # (its exporters' conversion tables are a backend's, read by exporter/backends/library_tables.py)
            if name != USER_MODEL and any(m.split(".")[0] == "transformers" and not m.startswith("transformers.exporters")
                                          for m in _imports(tree, top_level_only=False)):
                why = "imports transformers"
            elif any(m.split(".")[0] == "tools" for m in _imports(tree, top_level_only=True)):
                why = "imports tools at import time"
        if why:
            found.append(f"{name} ({why})")
    return found


def wheel_files(wheel: pathlib.Path) -> dict[str, str | None]:
    """A wheel's files: path -> text of each .py file, None for the others."""
    with zipfile.ZipFile(wheel) as z:
        names = [n for n in z.namelist() if not n.endswith("/")]
        return {n: z.read(n).decode() if n.endswith(".py") else None for n in names}


def run(cmd, cwd=None):
    print("+", " ".join(map(str, cmd)), flush=True)
    subprocess.run(cmd, cwd=cwd, check=True)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python3 -m tools.wheel_smoke", description=__doc__.splitlines()[0])
    ap.add_argument("--torch", default="torch==2.13.0", help="the torch requirement installed beside the wheel")
    ap.add_argument("--dir", help="work here (default: a temporary folder, removed after)")
    ns = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        work = pathlib.Path(ns.dir or tmp)
        work.mkdir(parents=True, exist_ok=True)
        dist, venv, user = work / "dist", work / "venv", work / "user"
        user.mkdir(exist_ok=True)
        run([sys.executable, "-m", "venv", str(work / "build-venv")])
        builder = work / "build-venv" / "bin" / "python"
        run([builder, "-m", "pip", "install", "-q", "build"])
        run([builder, "-m", "build", "-q", "--outdir", str(dist), str(REPO)])
        wheels, sdists = sorted(dist.glob("*.whl")), sorted(dist.glob("*.tar.gz"))
        assert len(wheels) == 1 and len(sdists) == 1, f"expected one wheel and one sdist in {dist}"
        shipped = wheel_files(wheels[0])
        assert not corpus_builders(shipped), f"the wheel ships corpus builders: {corpus_builders(shipped)}"
        routes = [n for n in shipped if n.startswith("exporter/_data/explorer/routes@")]
        assert "exporter/cli/demo_model.py" in shipped and routes, "the wheel lacks the demo or the routes"
        print(f"smoke: the wheel's {len(shipped)} files hold no corpus builder")
        run([sys.executable, "-m", "venv", str(venv)])
        py, cli = venv / "bin" / "python", venv / "bin" / "pt2b"
        run([py, "-m", "pip", "install", "-q", str(wheels[0]), ns.torch])
        run([cli, "--version"], cwd=user)
        run([cli, "demo", "-o", "demo.pt2b"], cwd=user)
        run([cli, "inspect", "demo.pt2b"], cwd=user)
        run([py, "-c", SMOKE, str(REPO)], cwd=user)
        # the explorer page from the routes the wheel ships: this venv has neither tools/ nor transformers,
        # so a page drawn at all was drawn from them
        run([cli, "opset", "page", "-o", "page.html"], cwd=user)
        assert (user / "page.html").stat().st_size > 100_000, "pt2b opset page wrote too little"
        print("smoke: pt2b opset page from the shipped corpus routes: ok")
        named = subprocess.run([cli, "opset", "page", "--corpus", "zoo", "-o", "zoo.html"], cwd=user,
                               capture_output=True, text=True)  # a named corpus needs the builders
        said = named.stdout + named.stderr
        assert named.returncode == 2 and "(LoweringError)" in said and "tools/corpus/" in said, said
        print("smoke: a named corpus without the corpus builders is a LoweringError saying what to do: ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
