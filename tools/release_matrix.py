"""The release matrix: pt2b on every torch release pyproject.toml accepts, one venv per release.

For each release: create (or reuse) a venv under --dir, install that torch, install pt2b into it
(``pip install -e '.[test]'``, which must keep that torch), import pt2b, run the compat subset
(tests/compat.txt: goldens, zoo round trips, every preset on the goldens, runtime_ref, the upgrade
tool, the format), and with --full the whole default suite on 2.13 too. Prints one table, release x
(install, import, compat passed/failed/skipped, seconds), then the writer x reader table of the
release goldens (tests/releases/test_release_goldens.py, one of the compat files: the artifacts each release
wrote into tests/golden/torch-<release>/, read, lowered and run by each release), then the failures.
Exit status 1 if any release is not green.

  python3 -m tools.release_matrix                          # all releases, venvs in ~/.cache/pt2b-matrix
  python3 -m tools.release_matrix --releases 2.14.1 --full # one release; --full runs the suite on 2.13
  python3 -m tools.release_matrix --goldens-only           # only the release goldens on each: the table, quickly

A venv is reused when its torch is the release asked for and pt2b is installed from this checkout
(--reinstall installs pt2b again, e.g. after pyproject.toml changed). torch comes from the machine's
pip configuration; a release that configuration does not offer is installed once more with
PIP_CONFIG_FILE=/dev/null (no pip configuration file: the registry alone). Needs about 5.5 GB of disk per
CUDA-build release.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import pathlib
import re
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET

ROOT = pathlib.Path(__file__).resolve().parents[1]
RELEASES = ("2.11.0", "2.12.1", "2.13.0", "2.14.1", "2.15.0")
FULL_ON = "2.13"  # the release the whole suite runs on with --full (README's default install)
GOLDENS = "tests/releases/test_release_goldens.py"  # its test ids are <writer release>/<case>


def compat_files() -> list[str]:
    """tests/compat.txt's test files, as paths from the repository root."""
    text = (ROOT / "tests" / "compat.txt").read_text()
    return [f"tests/{ln.strip()}" for ln in text.splitlines() if ln.strip() and not ln.startswith("#")]


@dataclasses.dataclass
class Row:
    release: str
    install: str = "-"
    imported: str = "-"
    compat: str = "-"
    full: str = "-"
    seconds: float = 0.0
    problems: list[str] = dataclasses.field(default_factory=list)
    # the release goldens this release read: writer release -> Cell
    goldens: dict[str, "Cell"] = dataclasses.field(default_factory=dict)

    @property
    def green(self) -> bool:
        return not self.problems


@dataclasses.dataclass
class Cell:
    """One writer's goldens as one reader ran them."""
    passed: int = 0
    total: int = 0
    first_failure: str = ""

    def __str__(self) -> str:
        if self.passed == self.total:
            return f"{self.passed}/{self.total}"
        return f"{self.passed}/{self.total}: {self.first_failure}"


def _env() -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME")}
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    return env


def _run(cmd: list, log: pathlib.Path, env: dict | None = None, timeout: float | None = None) -> int:
    with open(log, "a") as f:
        f.write(f"\n$ {' '.join(map(str, cmd))}\n")
        f.flush()
        try:
            return subprocess.run(cmd, cwd=ROOT, stdout=f, stderr=subprocess.STDOUT, env=env or _env(),
                                  timeout=timeout).returncode
        except subprocess.TimeoutExpired:
            f.write(f"\n(timed out after {timeout:.0f} s)\n")
            return 124


def _tail(log: pathlib.Path, n: int = 1) -> str:
    lines = [ln.strip() for ln in log.read_text(errors="replace").splitlines() if ln.strip()]
    return " | ".join(lines[-n:])[:300]


def _probe(python: pathlib.Path, code: str) -> str | None:
    r = subprocess.run([python, "-c", code], cwd=tempfile.gettempdir(), capture_output=True, text=True, env=_env())
    return r.stdout.strip() if r.returncode == 0 else None


def _torch_version(python: pathlib.Path) -> str | None:
    return _probe(python, "import importlib.metadata as m; print(m.version('torch'))")


def _pt2b_from_here(python: pathlib.Path) -> bool:
    where = _probe(python, "import importlib.util as u; s = u.find_spec('exporter'); print(s.origin if s else '')")
    return bool(where) and pathlib.Path(where).resolve().is_relative_to(ROOT)


def _base(version: str | None) -> str:
    return (version or "").split("+")[0]


def install(release: str, venv: pathlib.Path, reinstall: bool, row: Row) -> pathlib.Path | None:
    """The venv's python with torch ``release`` and pt2b installed, or None (row says why)."""
    log = venv.parent / f"{venv.name}.log"
    python = venv / "bin" / "python"
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", venv], check=True)
    if _base(_torch_version(python)) != release:
        rc = _run([python, "-m", "pip", "install", "-q", f"torch=={release}"], log)
        if rc != 0:  # not offered by the machine's pip configuration (e.g. above its version cap):
            # PIP_CONFIG_FILE=os.devnull loads no configuration file at all (an empty file would be
            # read after the site-wide one, whose constraints still apply)
            rc = _run([python, "-m", "pip", "install", "-q", f"torch=={release}"], log,
                      env=dict(_env(), PIP_CONFIG_FILE=os.devnull))
        if rc != 0:
            row.install = "torch failed"
            row.problems.append(f"pip install torch=={release}: {_tail(log)}")
            return None
    torch_before = _torch_version(python)
    if reinstall or not _pt2b_from_here(python):
        # without the machine's pip configuration: a version cap there (torch<=2.14.1) would make pip
        # replace a newer release instead of keeping it, which is what this step checks
        if _run([python, "-m", "pip", "install", "-q", "-e", f"{ROOT}[test]"], log,
                env=dict(_env(), PIP_CONFIG_FILE=os.devnull)) != 0:
            row.install = "pt2b failed"
            row.problems.append(f"pip install -e '.[test]': {_tail(log)}")
            return None
    torch_after = _torch_version(python)
    if torch_after != torch_before:
        row.install = f"torch replaced by {torch_after}"
        row.problems.append(f"installing pt2b replaced torch {torch_before} with {torch_after}")
        return None
    row.install = f"ok ({torch_after})"
    return python


def _junit_counts(path: pathlib.Path) -> tuple[int, int, int, list[str]]:
    """(passed, failed, skipped, failing test ids) of a pytest junit XML report."""
    root = ET.parse(path).getroot()
    passed = failed = skipped = 0
    failing = []
    for case in root.iter("testcase"):
        if case.find("skipped") is not None:
            skipped += 1
        elif case.find("failure") is not None or case.find("error") is not None:
            failed += 1
            failing.append(f"{case.get('classname')}::{case.get('name')}")
        else:
            passed += 1
    return passed, failed, skipped, failing


def _short(message: str, n: int = 130) -> str:
    """A failure message's first line, short enough for a table cell (no pipes, no module path on
    pt2b's error classes)."""
    line = next((ln.strip() for ln in (message or "").splitlines() if ln.strip()), "failed")
    line = line.replace("exporter.errors.", "").replace("|", "/")
    return line if len(line) <= n else line[:n - 3] + "..."


def golden_cells(path: pathlib.Path) -> dict[str, Cell]:
    """Writer release -> Cell, from the test ids ``...[<writer>/<case>]`` of tests/releases/test_release_goldens.py
    in a pytest junit XML report; the cell's reason is that of its first failing case by name (the
    report's order is the order xdist workers finished in)."""
    cells: dict[str, Cell] = {}
    failures: dict[str, list[tuple[str, str]]] = {}
    for case in ET.parse(path).getroot().iter("testcase"):
        m = re.search(r"\[(\d+\.\d+\.\d+)/([^\]]+)\]$", case.get("name", ""))
        if not (case.get("classname", "").endswith("test_release_goldens") and m):
            continue
        writer, name = m.groups()
        cell = cells.setdefault(writer, Cell())
        cell.total += 1
        bad = next((case.find(t) for t in ("failure", "error", "skipped") if case.find(t) is not None), None)
        if bad is None:
            cell.passed += 1
        else:
            what = "skipped: " if bad.tag == "skipped" else ""
            failures.setdefault(writer, []).append((name, what + (bad.get("message") or bad.text or bad.tag)))
    for writer, found in failures.items():
        name, message = min(found)
        cells[writer].first_failure = f"{name}: {_short(message)}"
    return cells


def pytest_run(python: pathlib.Path, args: list[str], log: pathlib.Path, workers: int, timeout: float,
               goldens: dict[str, Cell] | None = None) -> tuple[str, list[str]]:
    """Run pytest; ("passed/failed/skipped (seconds)", problems). ``goldens``, when given, receives
    the report's release-golden cells (golden_cells)."""
    with tempfile.TemporaryDirectory() as tmp:
        report = pathlib.Path(tmp) / "junit.xml"
        t0 = time.perf_counter()
        rc = _run([python, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", str(workers),
                   f"--junitxml={report}", *args], log, timeout=timeout)
        seconds = time.perf_counter() - t0
        if not report.exists():
            return f"no report (exit {rc})", [f"pytest {' '.join(args)} exit {rc}: {_tail(log, 3)}"]
        passed, failed, skipped, failing = _junit_counts(report)
        if goldens is not None:
            goldens.update(golden_cells(report))
    problems = [f"failed: {t}" for t in failing]
    if rc not in (0, 1) or (rc == 1 and not failing):
        problems.append(f"pytest exit {rc}: {_tail(log, 3)}")
    return f"{passed}/{failed}/{skipped} ({seconds:.0f} s)", problems


def run_release(release: str, where: pathlib.Path, args) -> Row:
    row = Row(release)
    t0 = time.perf_counter()
    venv = where / f"torch-{release}"
    log = venv.parent / f"{venv.name}.log"
    python = install(release, venv, args.reinstall, row)
    if python is not None:
        rc = _run([python, "-c", "import torch, exporter, runtime_ref; print('pt2b imports on torch', torch.__version__)"],
                  log)
        row.imported = "ok" if rc == 0 else "failed"
        if rc != 0:
            row.problems.append(f"import: {_tail(log)}")
        else:
            files = [GOLDENS] if args.goldens_only else compat_files()
            row.compat, problems = pytest_run(python, ["-m", "compat and not slow", *files], log, args.workers,
                                              args.timeout, goldens=row.goldens)
            row.problems += problems
            if args.full and release.startswith(FULL_ON + ".") and not args.goldens_only:
                row.full, problems = pytest_run(python, [], log, args.workers, args.timeout)
                row.problems += problems
    row.seconds = time.perf_counter() - t0
    return row


def table(rows: list[Row], full: bool, goldens_only: bool = False) -> str:
    tests = "release goldens" if goldens_only else "compat"
    head = ["torch", "install (torch kept)", "import", f"{tests} passed/failed/skipped"]
    head += ["full suite (2.13)"] if full else []
    head += ["seconds", "green"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        cells = [r.release, r.install, r.imported, r.compat] + ([r.full] if full else [])
        cells += [f"{r.seconds:.0f}", "yes" if r.green else "no"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _release_key(release: str) -> tuple:
    return tuple(int(x) if x.isdigit() else x for x in release.split("."))


def goldens_table(rows: list[Row]) -> str:
    """Writer x reader: rows the release that wrote the goldens, columns the release that read them;
    a cell is passed/total, with the first failure's case and message when not all passed ("-": the
    reader did not run them)."""
    writers = sorted({w for r in rows for w in r.goldens}, key=_release_key)
    if not writers:
        return "(no release goldens were run)"
    head = ["writer (row) / reader (column)", *(r.release for r in rows)]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for w in writers:
        lines.append("| " + " | ".join([w, *(str(r.goldens[w]) if w in r.goldens else "-" for r in rows)]) + " |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tools.release_matrix", description=__doc__.split("\n\n")[0])
    ap.add_argument("--releases", default=",".join(RELEASES), help=f"comma-separated torch versions ({','.join(RELEASES)})")
    ap.add_argument("--dir", type=pathlib.Path, default=pathlib.Path("~/.cache/pt2b-matrix").expanduser(),
                    help="where the venvs (torch-<version>/) and their logs (torch-<version>.log) live")
    ap.add_argument("--full", action="store_true", help=f"also run the whole default suite on {FULL_ON}")
    ap.add_argument("--reinstall", action="store_true", help="install pt2b again in reused venvs")
    ap.add_argument("--goldens-only", action="store_true",
                    help=f"run only {GOLDENS} on each release (the writer x reader table), not the whole compat set")
    ap.add_argument("-n", "--workers", type=int, default=2, help="pytest-xdist workers (default 2)")
    ap.add_argument("--timeout", type=float, default=3600, help="seconds one pytest run may take")
    args = ap.parse_args(argv)
    args.dir.mkdir(parents=True, exist_ok=True)
    rows = []
    for release in [r.strip() for r in args.releases.split(",") if r.strip()]:
        print(f"torch {release} ...", file=sys.stderr, flush=True)
        rows.append(run_release(release, args.dir, args))
        print(f"torch {release}: {'green' if rows[-1].green else 'NOT green'} in {rows[-1].seconds:.0f} s",
              file=sys.stderr, flush=True)
    print(table(rows, args.full, args.goldens_only))
    print()
    print("release goldens, writer x reader (passed/total; the first failure when not all passed):")
    print()
    print(goldens_table(rows))
    print()
    for r in rows:
        for p in r.problems:
            print(f"torch {r.release}: {p}")
    print(f"logs: {args.dir}/torch-<version>.log")
    return 0 if all(r.green for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
