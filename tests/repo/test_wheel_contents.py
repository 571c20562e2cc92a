"""The wheel ships the product, not its test corpora: no corpus builder among the packages pyproject.toml
ships (tools/wheel_smoke.py checks the built wheel the same way), and without tools/ the opset page is
drawn from the shipped routes and a named corpus is a LoweringError saying what to do. (The demo, which
has its own model, runs from outside the checkout in tests/cli/test_cli_talk.py.)"""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

import pytest

from tools.wheel_smoke import corpus_builders

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _shipped_files() -> dict[str, str | None]:
    """The files of the packages pyproject.toml's package list ships (what the wheel holds of them)."""
    tomllib = pytest.importorskip("tomllib")  # (Python 3.11+)
    from setuptools import find_packages

    setup = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    include = setup["packages"]["find"]["include"]
    out = {}
    for pkg in find_packages(str(ROOT), include=include):
        for f in (ROOT / pkg.replace(".", "/")).iterdir():
            if f.is_file() and f.suffix != ".pyc":
                out[f.relative_to(ROOT).as_posix()] = f.read_text() if f.suffix == ".py" else None
    return out


def test_the_shipped_packages_hold_no_corpus_builder():
    shipped = _shipped_files()
    assert "exporter/explorer/corpus.py" in shipped and "exporter/cli/demo_model.py" in shipped
    assert not any(name.startswith("tools/") for name in shipped)
    assert not corpus_builders(shipped)


def test_the_corpus_builder_check_finds_planted_builders():
    """The check itself: each kind of builder is found; importing tools inside a function is allowed."""
    planted = {
        "tools/corpus/programs.py": "",
        "exporter/corpus/zoo.py": "import torch\n",
        "exporter/corpus/transformers_sample.txt": None,
        "exporter/models.py": "def build():\n    from transformers import BertModel\n",
        "exporter/reach.py": "try:\n    import tools.corpus.zoo\nexcept ImportError:\n    pass\n",
        "exporter/fine.py": "def builders():\n    from tools.corpus import programs\n    return programs\n",
        "exporter/tables.py": "def table():\n    import transformers.exporters.exporter_onnx\n",
    }
    found = corpus_builders(planted)
    assert [f.split(" ")[0] for f in found] == sorted(set(planted) - {"exporter/fine.py", "exporter/tables.py"})
    assert "exporter/reach.py (imports tools at import time)" in found


BLOCKED = r'''
import pathlib, sys

class NoTools:  # what a plain install has: no tools package anywhere, nor a checkout beside the package
    def find_spec(self, name, path=None, target=None):
        if name == "tools" or name.startswith("tools."):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)

sys.meta_path.insert(0, NoTools())
from exporter import cli
from exporter.explorer import corpus

assert cli.main(["opset", "page", "-o", "page.html"]) == 0
print("page bytes", pathlib.Path("page.html").stat().st_size)
assert cli.main(["opset", "page", "--corpus", "zoo", "-o", "zoo.html"]) == 2
corpus.shipped_routes = lambda release=None: None  # a torch release pt2b ships no routes for
assert cli.main(["opset", "page", "-o", "other.html"]) == 2
print("tools loaded:", sorted(m for m in sys.modules if m == "tools" or m.startswith("tools.")))
'''


def test_without_tools_the_page_is_drawn_from_the_shipped_routes(tmp_path):
    env = {**os.environ, "PT2B_CACHE": "off", "PYTHONPATH": str(ROOT)}  # this checkout's exporter
    out = subprocess.run([sys.executable, "-c", BLOCKED], capture_output=True, text=True, timeout=600,
                         cwd=tmp_path, env=env)
    assert out.returncode == 0, out.stdout + out.stderr
    assert int(out.stdout.split("page bytes ")[1].split()[0]) > 100_000
    assert "tools loaded: []" in out.stdout
    errors = [ln for ln in out.stderr.splitlines() if ln.startswith("pt2b: error")]
    assert len(errors) == 2, out.stderr
    assert errors[0].startswith("pt2b: error (LoweringError): cannot build the corpus zoo: the named corpora")
    assert "the default corpus's routes for torch" in errors[1]
    for e in errors:
        assert "tools/corpus/" in e and "pass .pt2b artifacts (files or folders) with --corpus" in e.lower()
    assert not (tmp_path / "zoo.html").exists() and not (tmp_path / "other.html").exists()
