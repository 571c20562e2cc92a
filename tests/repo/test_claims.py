"""docs/claims.md names, for each README claim, the test that guards it: every test it names exists,
and the README links to it."""

import ast
import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[2]
CLAIMS = ROOT / "docs" / "claims.md"


def named_tests() -> list[tuple[str, str]]:
    """(test file, test name) for every `tests/x.py::name` and following `::name` of the same cell."""
    out = []
    for line in CLAIMS.read_text().splitlines():
        if not line.startswith("|"):
            continue
        for cell in line.split("|"):
            current = None
            for m in re.finditer(r"`(tests/[\w/]+\.py)?::(\w+)`", cell):
                current = m.group(1) or current
                assert current, f"docs/claims.md: `::{m.group(2)}` names no file: {cell.strip()}"
                out.append((current, m.group(2)))
    return out


def test_every_named_test_exists():
    named = named_tests()
    assert len(named) >= 20
    missing = []
    for path, name in named:
        tree = ast.parse((ROOT / path).read_text())
        if name not in {n.name for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)}:
            missing.append(f"{path}::{name}")
    assert not missing, f"docs/claims.md names tests that do not exist: {missing}"


def test_readme_links_the_claims():
    assert "(docs/claims.md)" in (ROOT / "README.md").read_text()
