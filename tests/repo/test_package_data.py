"""pt2b's own data files live in the package (exporter/package_data.py): the checkout's
exporter/_data is schemas/ itself, the wheel ships the files the package reads, and a missing or
corrupt one is an InstallationError naming it (issue 42). tools/wheel_smoke.py (run by .ci/run) builds
the sdist and wheel and uses the installed wheel from outside the checkout."""

from __future__ import annotations

import fnmatch
import os
import pathlib
import subprocess
import sys

import pytest

from exporter import package_data
from exporter.errors import InstallationError

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_the_package_data_is_schemas_itself():
    """One source of truth: exporter/_data is a link to schemas/, so the two cannot differ."""
    link = ROOT / "exporter" / "_data"
    assert link.is_symlink() and os.readlink(link) == "../schemas"
    assert package_data.path("pt2b.fbs").read_bytes() == (ROOT / "schemas" / "pt2b.fbs").read_bytes()


def test_the_wheel_ships_every_file_the_package_reads():
    """pyproject's package-data globs cover the schema, every frozen preset and audit and every op
    registry: a new kind of data file must be added there (the wheel smoke test would fail too)."""
    tomllib = pytest.importorskip("tomllib")  # (Python 3.11+)
    globs = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]["exporter"]
    read = ["pt2b.fbs"] + [f"opsets/{p.name}" for p in (ROOT / "schemas" / "opsets").iterdir()] + \
           [f"ops/{p.name}" for p in (ROOT / "schemas" / "ops").iterdir()]
    missed = [f for f in read if not any(fnmatch.fnmatch(f"_data/{f}", g) for g in globs)]
    assert not missed


def test_a_missing_or_corrupt_file_of_pt2bs_own_is_an_installation_error(tmp_path, monkeypatch):
    (tmp_path / "opsets").mkdir()
    (tmp_path / "opsets" / "core@2.13.json").write_text("{not json")
    monkeypatch.setattr(package_data, "DATA", tmp_path)
    with pytest.raises(InstallationError, match=r"pt2b\.fbs cannot be read .*installation is broken; reinstall"):
        package_data.read_text("pt2b.fbs")
    with pytest.raises(InstallationError, match=r"core@2\.13\.json is corrupt \(not JSON"):
        package_data.read_json("opsets", "core@2.13.json")


def test_writing_without_the_schema_blames_the_installation_not_the_users_path(tmp_path):
    """The wheel once failed with `ExportError: cannot write '.../x.pt2b': No such file or directory`:
    the missing file was pt2b's schema, not the user's destination."""
    code = (
        "import pathlib, sys, torch\n"
        "from exporter import package_data\n"
        "package_data.DATA = pathlib.Path(sys.argv[1])\n"
        "from exporter.errors import InstallationError\n"
        "try:\n"  # (the API reads the schema when it is first used: the format version is read from it)
        "    from exporter import export_model\n"
        "    export_model(torch.nn.Linear(3, 3), (torch.randn(2, 3),), sys.argv[2])\n"
        "except InstallationError as e:\n"
        "    print('InstallationError:', e)\n")
    empty = tmp_path / "empty"
    empty.mkdir()
    out = subprocess.run([sys.executable, "-c", code, str(empty), str(tmp_path / "x.pt2b")], capture_output=True,
                         text=True, timeout=300, cwd=ROOT)
    assert out.stdout.startswith("InstallationError: pt2b's own data file"), out.stdout + out.stderr
    assert str(empty / "pt2b.fbs") in out.stdout and "x.pt2b" not in out.stdout
    assert not (tmp_path / "x.pt2b").exists()


def test_the_transformers_corpora_without_transformers_say_what_to_install(monkeypatch):
    """The corpus machinery that needs transformers is the optional extra pt2b[corpus]."""
    import importlib.util

    from tools.corpus import programs
    from exporter.errors import ExportError

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "transformers" else real(name, *a))
    for corpus in ("transformers", "transformers-all"):
        with pytest.raises(ExportError, match=r"transformers library, which is not installed: pip install 'pt2b\[corpus\]'"):
            list(programs.programs((corpus,)))
