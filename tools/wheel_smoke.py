"""Build pt2b's sdist and wheel, install the wheel into a fresh venv beside torch, and use it from a
directory outside the checkout: what a user of `pip install pt2b` gets (.ci/run runs this).

    python3 -m tools.wheel_smoke [--torch torch==2.13.0] [--dir DIR]

The wheel is built from the sdist (python -m build), so both are checked: a file the package reads
that either leaves out fails here. The smoke test runs the demo, `pt2b --version`, `pt2b inspect`,
exports, loads, lowers (core and max) and runs a model on runtime_ref against eager, checking that
every module it imported came from the venv, not the checkout, and writes the opset explorer page
from its shipped corpus routes (no transformers in that venv) in under 30 s.
"""

from __future__ import annotations

import argparse
import pathlib
import subprocess
import sys
import tempfile
import time

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
        run([sys.executable, "-m", "venv", str(venv)])
        py, cli = venv / "bin" / "python", venv / "bin" / "pt2b"
        run([py, "-m", "pip", "install", "-q", str(wheels[0]), ns.torch])
        run([cli, "--version"], cwd=user)
        run([cli, "demo", "-o", "demo.pt2b"], cwd=user)
        run([cli, "inspect", "demo.pt2b"], cwd=user)
        run([py, "-c", SMOKE, str(REPO)], cwd=user)
        start = time.perf_counter()  # the explorer from its shipped corpus routes: no transformers here
        run([cli, "opset", "page", "-o", "page.html"], cwd=user)
        took = time.perf_counter() - start
        assert (user / "page.html").stat().st_size > 100_000 and took < 30, f"pt2b opset page: {took:.1f} s"
        print(f"smoke: pt2b opset page from the shipped corpus routes in {took:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
