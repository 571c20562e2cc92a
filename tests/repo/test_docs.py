"""The documentation stays short, self-contained and true of the code.

1. No file of the repository refers to a path outside it. The files checked are those git tracks
   plus the untracked files it does not ignore (``git ls-files --cached --others --exclude-standard``,
   i.e. what the next commit can contain); binary files (with a NUL byte) are skipped, and so is this
   file, which has to spell the patterns out. A file fails when it contains:
   - a known reference to material that lives beside the repository but not in it: the strings in
     OUTSIDE_MARKERS, or ``DESIGN.md`` while the repository has no file of that name;
   - an absolute path into someone's machine or workspace: ``/work/``, ``/root/``, ``/home/``,
     ``/Users/`` at the start of a path (system paths code legitimately uses, such as ``/tmp``,
     ``/proc/self/status`` or ``/dev/null``, and per-user locations written with ``~`` or ``$HOME``,
     such as the lowering cache's ``~/.cache/pt2b``, are not references to files of the project);
   - a relative path that climbs out of the repository: a run of ``../`` that, resolved from the
     file's own folder, ends above the repository root.
   .ci/run is checked like every other file: it needs no path outside the repository.
2. Every relative link in README.md and the markdown pages under docs/ (its subfolders too: the journal,
   the generated result pages) points at a file or folder of the repository (and,
   for a ``#fragment`` into a markdown file, at one of its headings); every repository path they name
   in text or backticks (``exporter/...``, ``tests/...``, ...) exists.
3. README.md is at most README_CHARACTERS long, has no line over 200 characters and no commit hash, and
   gives exactly the two commands .ci/run runs.
4. The ``pt2b`` command lines of README.md and the pages under docs/ use subcommands and options the CLI has
   (concrete fenced lines must parse); their Python blocks compile, import names that exist, and
   call pt2b's functions with keyword arguments those functions take.
"""

from __future__ import annotations

import argparse
import ast
import importlib
import inspect
import pathlib
import re
import shlex
import subprocess

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
THIS = pathlib.Path(__file__).resolve()
README = ROOT / "README.md"
DOCS = sorted((ROOT / "docs").rglob("*.md"))
PAGES = [README, *DOCS]

# (spelled in parts, so that this list is not itself a tracked mention of a path outside the repository)
OUTSIDE_MARKERS = tuple(".." + m if m.startswith("/shared") else m for m in
                        ("/shared", "/work/shared", "shared/DESIGN", "shared/facts", "historical-op-schemas.md"))
MACHINE_PATH = re.compile(r"(?<![\w.~$}-])/(?:work|root|home|Users)/")
CLIMB = re.compile(r"(?<![\w.])((?:\.\./)+)")
TOP_LEVEL = ("bench", "docs", "exporter", "runtime_ref", "schemas", "tests", "tools", ".ci")
REPO_PATH = re.compile(r"(?<![\w/.-])(?:" + "|".join(re.escape(t) for t in TOP_LEVEL) + r")/[^\s`)\]|,;:'\"]*")
PLACEHOLDER = set("<>*{}")
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
REF_LINK = re.compile(r"^\s*\[[^\]]+\]:\s*(\S+)", re.M)
FENCE = re.compile(r"^```[^\n]*\n.*?^```[ \t]*$", re.M | re.S)


def repository_files() -> list[pathlib.Path]:
    try:
        out = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                             cwd=ROOT, capture_output=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError) as e:
        pytest.skip(f"not a git checkout ({e})")
    paths = {ROOT / p for p in out.decode().split("\0") if p}
    return sorted(p for p in paths if p.is_file())


def _text(path: pathlib.Path) -> str | None:
    data = path.read_bytes()
    return None if b"\0" in data else data.decode("utf-8", errors="replace")


def outside_references(path: pathlib.Path, text: str, has_design: bool) -> list[str]:
    found = []
    for n, line in enumerate(text.splitlines(), 1):
        where = f"{path.relative_to(ROOT)}:{n}"
        found += [f"{where}: {m!r}" for m in OUTSIDE_MARKERS if m in line]
        if not has_design and "DESIGN.md" in line:
            found.append(f"{where}: 'DESIGN.md' (no such file in the repository)")
        found += [f"{where}: absolute path {m.group(0)!r}" for m in MACHINE_PATH.finditer(line)]
        for m in CLIMB.finditer(line):
            target = (path.parent / m.group(1)).resolve()
            if target != ROOT and ROOT not in target.parents:
                found.append(f"{where}: {line[m.start():m.end() + 30]!r} climbs out of the repository")
    return found


def test_no_file_refers_to_a_path_outside_the_repository():
    files = repository_files()
    has_design = any(p.name == "DESIGN.md" for p in files)
    found = []
    for path in files:
        if path == THIS:
            continue
        text = _text(path)
        if text is not None:
            found += outside_references(path, text, has_design)
    assert not found, "paths outside the repository:\n" + "\n".join(found)


def test_the_rule_catches_what_it_should_and_nothing_else(tmp_path):
    doc = ROOT / "docs" / "example.md"   # never written: only its location matters
    bad = ["see ../" + "shared/DESIGN.md", "/work/" + "main/x.py", "cp /root" + "/a .", "../../x",
           "[a](../../outside.md)", "DESIGN" + ".md section 6"]
    good = ["/tmp/real_models.json", "/proc/self/status", "~/.cache/pt2b", "$HOME/x", "../schemas/FORMAT.md",
            "https://example.com/home/x", "cd \"$(dirname \"$0\")/..\""]
    for line in bad:
        assert outside_references(doc, line, has_design=False), line
    for line in good:
        assert not outside_references(doc, line, has_design=False), line


# ---- links and paths in README.md and docs/ ----
def _prose(text: str) -> str:
    """Markdown without fenced code blocks."""
    return FENCE.sub("", text)


def _slug(heading: str) -> str:
    s = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return s.replace(" ", "-")


def anchors(path: pathlib.Path) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    for m in re.finditer(r"^#{1,6}\s+(.*?)\s*#*\s*$", _prose(path.read_text()), re.M):
        base = _slug(m.group(1))
        n = seen.get(base, 0)
        seen[base] = n + 1
        out.add(base if n == 0 else f"{base}-{n}")
    return out


def test_docs_exist():
    names = {p.name for p in DOCS}
    assert {"architecture.md", "format.md", "lowering.md", "explorer.md", "untrusted.md", "benchmarks.md",
            "real-models.md", "op-schema-history.md"} <= names


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(page):
    prose = re.sub(r"`[^`\n]*`", "", _prose(page.read_text()))
    bad = []
    for target in LINK.findall(prose) + REF_LINK.findall(prose):
        if re.match(r"^[a-zA-Z][\w+.-]*:", target):   # https:, mailto:, ...
            continue
        file_part, _, fragment = target.partition("#")
        dest = (page.parent / file_part).resolve() if file_part else page
        if not dest.exists() or (dest != ROOT and ROOT not in dest.parents):
            bad.append(f"{target}: no such file in the repository")
        elif fragment and dest.suffix == ".md" and fragment not in anchors(dest):
            bad.append(f"{target}: no heading #{fragment} in {dest.relative_to(ROOT)}")
    assert not bad, f"{page.relative_to(ROOT)}:\n" + "\n".join(bad)


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_named_repository_paths_exist(page):
    missing = []
    for m in REPO_PATH.finditer(_prose(page.read_text())):
        token = m.group(0)
        if PLACEHOLDER & set(token):
            continue
        token = token.split("#")[0].rstrip(".")
        if not (ROOT / token).exists():
            missing.append(token)
    assert not missing, f"{page.relative_to(ROOT)} names paths that do not exist: {sorted(set(missing))}"


# ---- README ----
README_CHARACTERS = 9_000  # the front door: what pt2b is, set-up, three recipes, links (detail lives in docs/)


def test_readme_is_short():
    """Counted in characters, not lines (a line count rewards packing detail into long lines), and no
    line over 200 characters."""
    text = README.read_text()
    assert len(text) <= README_CHARACTERS, f"README.md has {len(text)} characters; move detail into docs/"
    long = [i + 1 for i, ln in enumerate(text.splitlines()) if len(ln) > 200]
    assert not long, f"README.md lines over 200 characters: {long}"


def test_readme_holds_no_commit_hash():
    """Commit hashes and per-run spreads belong in docs/journal/, not the front door."""
    found = re.findall(r"\b(?=[0-9a-f]*[a-f])(?=[0-9a-f]*[0-9])[0-9a-f]{7,40}\b", README.read_text())
    assert not found, f"README.md names commits: {found}"


def test_readme_gives_the_commands_ci_runs():
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    readme = README.read_text().splitlines()
    install = ci[next(i for i, ln in enumerate(ci) if "README command 1" in ln) + 1].strip()
    tests = ci[next(i for i, ln in enumerate(ci) if "README command 2" in ln) + 1].strip()
    prefix = install.split(" -o ")[0]   # .ci/run writes the demo into a temporary folder
    assert any(ln.strip().startswith(prefix + " -o ") for ln in readme), prefix
    assert tests in [ln.strip() for ln in readme], tests


# ---- command lines and Python blocks ----
def _fenced(text: str, lang: str) -> list[str]:
    return [m.group(1) for m in re.finditer(r"^```" + lang + r"[ \t]*\n(.*?)^```", text, re.M | re.S)]


def _cli_lines() -> list[tuple[str, str, bool]]:
    """(page, command line, concrete) for every pt2b command in fenced blocks and inline code."""
    out = []
    for page in PAGES:
        text = page.read_text()
        name = str(page.relative_to(ROOT))
        for block in _fenced(text, "bash"):
            for line in block.splitlines():
                line = line.split(" #")[0].strip()
                if line.startswith(("pt2b ", ".venv/bin/pt2b ")):
                    out.append((name, line, not any(c in line for c in "[]|") and "..." not in line))
        for span in re.findall(r"`([^`\n]+)`", _prose(text)):
            if span.startswith("pt2b "):
                out.append((name, span.replace("\\|", "|"), False))
    return out


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for a in parser._actions:
        if isinstance(a, argparse._SubParsersAction):
            return dict(a.choices)
    return {}


def _options(parser: argparse.ArgumentParser) -> set[str]:
    return {s for a in parser._actions for s in a.option_strings}


def test_cli_lines_use_real_commands_and_options():
    from exporter.cli import build_parser

    root = build_parser()
    lines = _cli_lines()
    assert len(lines) > 20
    bad = []
    for page, line, concrete in lines:
        tokens = shlex.split(line)[1:]
        if concrete:
            try:
                root.parse_args(tokens)
            except SystemExit:
                bad.append(f"{page}: {line!r} does not parse")
                continue
        parser, allowed, rest = root, _options(root), list(tokens)
        while rest and _subparsers(parser):
            word = rest[0]
            if word.startswith("-"):   # an option before the subcommand: --help, --import MODULE
                if word not in allowed:
                    bad.append(f"{page}: {line!r}: no option {word!r}")
                rest = rest[2:] if word == "--import" else rest[1:]
                continue
            if word not in _subparsers(parser):
                if not (word.isupper() or word == "..."):
                    bad.append(f"{page}: {line!r}: no subcommand {word!r}")
                break
            parser = _subparsers(parser)[word]
            allowed |= _options(parser)
            rest = rest[1:]
        for tok in rest:
            if tok.startswith("-") and tok not in ("-", "--") and tok.split("=")[0] not in allowed:
                bad.append(f"{page}: {line!r}: no option {tok!r}")
    assert not bad, "\n".join(bad)


def test_python_blocks_use_real_api():
    bad = []
    for page in PAGES:
        for block in _fenced(page.read_text(), "python"):
            tree = ast.parse(block)   # a SyntaxError fails the test
            funcs = {}
            for node in ast.walk(tree):
                if isinstance(node, ast.ImportFrom) and node.module in ("exporter", "runtime_ref"):
                    mod = importlib.import_module(node.module)
                    for alias in node.names:
                        if alias.name not in mod.__all__:
                            bad.append(f"{page.name}: {node.module} does not export {alias.name}")
                        else:
                            funcs[alias.asname or alias.name] = getattr(mod, alias.name)
            for node in ast.walk(tree):
                if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in funcs:
                    params = inspect.signature(funcs[node.func.id]).parameters
                    if any(p.kind is p.VAR_KEYWORD for p in params.values()):
                        continue
                    for kw in node.keywords:
                        if kw.arg is not None and kw.arg not in params:
                            bad.append(f"{page.name}: {node.func.id}() takes no keyword {kw.arg!r}")
    assert not bad, "\n".join(bad)
