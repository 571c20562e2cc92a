"""The release matrix: pt2b on every torch release pyproject.toml accepts, one venv per release.

For each release: create (or reuse) a venv under --dir, install that torch, install pt2b into it
(``pip install -e '.[test]'``, which must keep that torch), import pt2b, run the compat subset
(tests/compat.txt: goldens, zoo round trips, every preset on the goldens, runtime_ref, the upgrade
tool, the format), and with --full the whole default suite on 2.13 too. Prints one table, release x
(install, import, compat passed/failed/skipped, seconds), then the failures. Exit status 1 if any
release is not green.

  python3 -m tools.release_matrix                          # all releases, venvs in ~/.cache/pt2b-matrix
  python3 -m tools.release_matrix --releases 2.14.1 --full # one release; --full runs the suite on 2.13

A venv is reused when its torch is the release asked for and pt2b is installed from this checkout
(--reinstall installs pt2b again, e.g. after pyproject.toml changed). torch comes from the machine's
pip configuration; a release that configuration does not offer is installed once more with
PIP_CONFIG_FILE pointing at an empty file (the registry alone). Needs about 5.5 GB of disk per
CUDA-build release.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import pathlib
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET

ROOT = pathlib.Path(__file__).resolve().parents[1]
RELEASES = ("2.11.0", "2.12.1", "2.13.0", "2.14.1", "2.15.0")
FULL_ON = "2.13"  # the release the whole suite runs on with --full (README's default install)


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

    @property
    def green(self) -> bool:
        return not self.problems


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
        if rc != 0:  # not offered by the machine's pip configuration (e.g. above its version cap)
            with tempfile.NamedTemporaryFile("w", suffix=".conf") as empty:
                rc = _run([python, "-m", "pip", "install", "-q", f"torch=={release}"], log,
                          env=dict(_env(), PIP_CONFIG_FILE=empty.name))
        if rc != 0:
            row.install = "torch failed"
            row.problems.append(f"pip install torch=={release}: {_tail(log)}")
            return None
    torch_before = _torch_version(python)
    if reinstall or not _pt2b_from_here(python):
        if _run([python, "-m", "pip", "install", "-q", "-e", f"{ROOT}[test]"], log) != 0:
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


def pytest_run(python: pathlib.Path, args: list[str], log: pathlib.Path, workers: int, timeout: float
               ) -> tuple[str, list[str]]:
    """Run pytest; ("passed/failed/skipped (seconds)", problems)."""
    with tempfile.TemporaryDirectory() as tmp:
        report = pathlib.Path(tmp) / "junit.xml"
        t0 = time.perf_counter()
        rc = _run([python, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", str(workers),
                   f"--junitxml={report}", *args], log, timeout=timeout)
        seconds = time.perf_counter() - t0
        if not report.exists():
            return f"no report (exit {rc})", [f"pytest {' '.join(args)} exit {rc}: {_tail(log, 3)}"]
        passed, failed, skipped, failing = _junit_counts(report)
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
            row.compat, problems = pytest_run(python, ["-m", "compat and not slow", *compat_files()], log, args.workers,
                                              args.timeout)
            row.problems += problems
            if args.full and release.startswith(FULL_ON + "."):
                row.full, problems = pytest_run(python, [], log, args.workers, args.timeout)
                row.problems += problems
    row.seconds = time.perf_counter() - t0
    return row


def table(rows: list[Row], full: bool) -> str:
    head = ["torch", "install (torch kept)", "import", "compat passed/failed/skipped"]
    head += ["full suite (2.13)"] if full else []
    head += ["seconds", "green"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        cells = [r.release, r.install, r.imported, r.compat] + ([r.full] if full else [])
        cells += [f"{r.seconds:.0f}", "yes" if r.green else "no"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tools.release_matrix", description=__doc__.split("\n\n")[0])
    ap.add_argument("--releases", default=",".join(RELEASES), help=f"comma-separated torch versions ({','.join(RELEASES)})")
    ap.add_argument("--dir", type=pathlib.Path, default=pathlib.Path("~/.cache/pt2b-matrix").expanduser(),
                    help="where the venvs (torch-<version>/) and their logs (torch-<version>.log) live")
    ap.add_argument("--full", action="store_true", help=f"also run the whole default suite on {FULL_ON}")
    ap.add_argument("--reinstall", action="store_true", help="install pt2b again in reused venvs")
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
    print(table(rows, args.full))
    for r in rows:
        for p in r.problems:
            print(f"torch {r.release}: {p}")
    print(f"logs: {args.dir}/torch-<version>.log")
    return 0 if all(r.green for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
