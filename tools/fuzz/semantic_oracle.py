"""The semantic mode's oracle: every entry point a user may call first on an untrusted file, each run
on the mutant in a worker (time limit: the campaign's per-mutant ``timeout``; memory: RLIMIT_AS),
with the worker's current directory a fresh, watched temporary folder.

Phases, in order (each runs whatever the earlier ones raised; those needing a program skip when
there is none); the checking phases first, so that their memory is measured before anything runs:
  load               exporter.load(path, verify=v)
  check              prog.check()
  verify             `pt2b -q verify PATH` (exporter.cli.main, in the worker)
  inspect            `pt2b -q inspect PATH`
  call               every method of the seed on its example inputs (the first call)
  load_for_backend   load_for_backend(path, preset="core", verify=v, cache=False)
  runtime, run       runtime_ref.runtimes(lowered), then every method on the example inputs
The CLI phases' outcome is read from what `pt2b` prints: ``pt2b: artifact error (Class): ...`` is
artifact_error:<Class>, exit 0 is ok; an exception out of the CLI is classified as any phase's.
After each phase the oracle's own observers (observe.py) look at the worker:
  side effects       the canary file (``PT2B_FUZZ_CANARY``, what the shell payloads touch) or any new
                     file in the watched folders (the cwd, the mutant's folder), the worker's canary
                     builtin called, an os.system/subprocess audit event; new files are then removed
  state_change       any of torch's process-global settings (observe.STATE: grad mode, autocast per
                     device, default dtype, deterministic algorithms, matmul precision, mode stacks,
                     thread counts...) differs from the worker's snapshot; it is then set back (what
                     cannot be set back retires the worker)
  terminal_escape    fds 1 and 2 (captured around every phase) received a byte a terminal acts on: ESC,
                     BEL, a C1 control, any other C0 control but \\n \\t \\r; the message of a phase's
                     exception is checked the same way
  memory_bound       the resident high-water mark over load, check, verify and inspect rose more than
                     observe.rss_bound (RSS_PER_DISK_BYTE x the file's bytes on disk + RSS_SLACK)
                     above the resident size before load (read after each of them)
A worker killed by a signal is ``signal:<NAME>`` (campaign.py; SIGKILL, the kernel's out-of-memory
killer, is ``memory``).

Rule (``allowed``; outcome classes as oracle.py names them):
  ok / ok_equal, artifact_error:<ArtifactError subclass>            allowed, in any phase
  mismatch, lowering_error:<Class>, run_error:<Type>                allowed iff the program was changed
                                                                    and the phase executes it (call,
                                                                    load_for_backend, runtime, run)
  timeout, memory, memory_bound                                     never (whatever the phase: a
                                                                    semantic mutant asks for no work
                                                                    a valid program of its size would)
  crash, signal:<NAME>, other:<Type> (any other exception,          never
  SystemExit included), other:CodeExecution (canary file, canary
  call, audit event), side_effect:NewFile, state_change,
  terminal_escape
A mutant's outcome is the first disallowed phase outcome, else the first ArtifactError, else "ok";
``phases`` maps every phase run to its own outcome.
"""

from __future__ import annotations

import os
import re
import shutil
import time
import traceback

from . import observe
from .oracle import _CANARY_HITS, CodeExecution, _classify, _clone_tree
from .semantic_values import CANARY_FILE

PHASES = ("load", "check", "verify", "inspect", "call", "load_for_backend", "runtime", "run")
EXEC_PHASES = ("call", "load_for_backend", "runtime", "run")
BOUNDED_PHASES = ("load", "check", "verify", "inspect")  # resident memory bounded by the file's size
PRESET = "core"
_CLI_ERROR = re.compile(r"^pt2b: (artifact error|error) \(([A-Za-z_][A-Za-z0-9_]*)\): ", re.M)


def allowed(outcome: str, changed: bool | None, phase: str | None = None) -> bool:
    """Is ``outcome`` (of ``phase``) acceptable for a semantic mutant? (the rule in the module docstring)"""
    if outcome in ("ok", "ok_equal") or outcome.startswith("artifact_error:"):
        return True
    if changed is True and (outcome == "mismatch" or outcome.startswith(("lowering_error:", "run_error:"))):
        return phase in EXEC_PHASES
    return False


class SemanticReference:
    """A seed's example inputs and methods, and torch warmed up on it (every phase once), so that a
    mutant's time and memory are its own."""

    def __init__(self, name: str, path: str):
        from exporter import load
        from exporter.api import load_for_backend

        from .seeds import seed_case

        case, self.methods = seed_case(name)
        self.args, self.kwargs = case.args, case.kwargs or {}
        prog = load(path)
        prog.check()
        for m in self.methods:
            prog.methods[m](*_clone_tree(self.args), **_clone_tree(self.kwargs))
        with observe.Capture():
            for command in ("verify", "inspect"):
                cli(command, path)
        load_for_backend(path, PRESET, cache=False)


class CliError(Exception):
    """What `pt2b` reported as an error line (its exit status 2): the exception class it names."""

    def __init__(self, name: str, message: str, artifact: bool):
        super().__init__(message)
        self.name, self.artifact = name, artifact


def cli(command: str, path: str) -> int:
    """`pt2b -q COMMAND PATH` in this process (its output goes to fds 1 and 2); raises CliError for
    its error line, or whatever escapes the CLI."""
    import io
    import sys

    from exporter.cli import main

    err, real = io.StringIO(), sys.stderr
    sys.stderr = _Tee(err, real)
    try:
        rc = main(["-q", command, path])
    finally:
        sys.stderr = real
    m = _CLI_ERROR.search(err.getvalue())
    if rc != 0 and m:
        raise CliError(m.group(2), err.getvalue()[m.end():].strip()[:500], m.group(1) == "artifact error")
    if rc != 0:
        raise CliError(f"Exit{rc}", err.getvalue()[-500:], False)
    return rc


class _Tee:
    """A text stream writing to two (the CLI's stderr: read back, and passed on to fd 2)."""

    def __init__(self, *streams):
        self.streams = streams

    def write(self, s):
        for st in self.streams:
            st.write(s)
        return len(s)

    def flush(self):
        for st in self.streams:
            st.flush()

    def isatty(self):
        return False

    def __getattr__(self, name):  # encoding, fileno...: the real stream's
        return getattr(self.streams[-1], name)


def _outcome(e: BaseException, phase: str, changed) -> str:
    if isinstance(e, CodeExecution):
        return "other:CodeExecution"
    if isinstance(e, CliError):
        return f"artifact_error:{e.name}" if e.artifact else f"other:{e.name}"
    return _classify(e, phase, changed)


def _snapshot(dirs) -> dict:
    return {d: set(os.listdir(d)) for d in dirs}


def _new_files(before: dict) -> list[str]:
    """Paths that appeared in the watched folders since ``before`` (removed here)."""
    out = []
    for d, names in before.items():
        for n in sorted(set(os.listdir(d)) - names):
            p = os.path.join(d, n)
            out.append(p)
            if os.path.isdir(p) and not os.path.islink(p):
                shutil.rmtree(p, ignore_errors=True)
            else:
                try:
                    os.unlink(p)
                except OSError:
                    pass
    return out


def execute(path: str, mutant, ref: SemanticReference, watch=(), on_phase=lambda phase, changed: None,
            state: dict | None = None, plant=None) -> dict:
    """Run every phase on the mutant at ``path``; the result dict (outcome, phase, detail, traceback,
    changed, phases, phase_seconds, side_effects, rss_growth, disk_bytes, retire). ``state``: the
    worker's observe.snapshot() every phase must leave as it was (default: taken here). ``plant``:
    (phase, function) run instead of that phase's own work (the oracle's tests plant faults so)."""
    from exporter import load
    from exporter.api import load_for_backend
    from exporter.errors import Pt2bError
    from runtime_ref import runtimes

    changed = mutant.kind != "identity"
    res = {"outcome": "ok", "changed": changed, "phase": None, "detail": "", "traceback": "", "phases": {},
           "phase_seconds": {}, "side_effects": [], "rss_growth": 0, "disk_bytes": observe.disk_bytes(path),
           "retire": False}
    events = []  # (outcome, phase, detail, traceback)
    watch = [d for d in watch if d]
    before = _snapshot(watch)
    state = state if state is not None else observe.snapshot()
    bound = observe.rss_bound(res["disk_bytes"])
    peak = observe.Peak()

    def step(phase, fn):
        on_phase(phase, changed)
        if plant is not None and plant[0] == phase:
            fn = plant[1]
        _CANARY_HITS.clear()
        t0 = time.perf_counter()
        outcome, value, found = "ok", None, []
        with observe.Capture() as out:
            try:
                value = fn()
            except (Exception, SystemExit, CodeExecution) as e:
                outcome = _outcome(e, phase, changed)
                message = f"{type(e).__name__}: {str(e)[:500]}"
                events.append((outcome, phase, message,
                               "".join(traceback.format_exception(type(e), e, e.__traceback__))[-6000:]))
                escape = observe.terminal_controls(str(e).encode("utf-8", "surrogateescape"))
                if escape and isinstance(e, Pt2bError):  # pt2b's own message (the CLI's line is in its output)
                    found.append(("terminal_escape", f"the message of {type(e).__name__} from {phase} holds a "
                                                     f"{escape}"))
        res["phase_seconds"][phase] = round(time.perf_counter() - t0, 3)
        escape = observe.terminal_controls(out.data)
        if escape:
            found.append(("terminal_escape", f"{phase} wrote a {escape}"))
        diff = observe.changes(state, observe.snapshot())
        if diff:
            stuck = observe.restore(state)
            res["retire"] = res["retire"] or bool(stuck)
            found.append(("state_change", f"{phase} left torch's process state changed: {'; '.join(diff)}"
                          + (f" (could not be set back: {', '.join(stuck)})" if stuck else "")))
        if phase in BOUNDED_PHASES:
            growth = peak.growth()
            over = growth > bound >= res["rss_growth"]  # (reported once: the peak stays)
            res["rss_growth"] = max(res["rss_growth"], growth)
            if over:
                found.append(("memory_bound", f"resident memory rose {growth >> 20} MiB by the end of {phase}, "
                                              f"over the bound of {bound >> 20} MiB for {res['disk_bytes']} "
                                              "bytes on disk"))
        hits = list(_CANARY_HITS)
        files = _new_files(before) if watch else []
        if hits or files:
            code = hits or any(os.path.basename(f) == CANARY_FILE for f in files)
            what = "; ".join(hits + [f"new file {os.path.basename(f)}" for f in files])
            res["side_effects"].append(f"{phase}: {what}")
            found.insert(0, ("other:CodeExecution" if code else "side_effect:NewFile", f"side effect during {phase}: {what}"))
            events.insert(0, (found[0][0], phase, found[0][1], ""))  # a side effect heads the findings
        events.extend((o, phase, detail, "") for o, detail in found[1 if hits or files else 0:])
        if found:
            outcome = found[0][0]
        res["phases"][phase] = outcome
        return value if outcome == "ok" else None

    def call(prog, runtime=False):
        fns = runtimes(prog) if runtime else prog.methods
        missing = [m for m in ref.methods if m not in fns]
        if missing:
            prog[missing[0]]  # raises MethodNotFoundError
        return [fns[m](*_clone_tree(ref.args), **_clone_tree(ref.kwargs)) for m in ref.methods]

    prog = step("load", lambda: load(path, verify=mutant.verify))
    if prog is not None:
        step("check", prog.check)
    step("verify", lambda: cli("verify", path))
    step("inspect", lambda: cli("inspect", path))
    if prog is not None:
        step("call", lambda: call(prog))
    del prog
    lowered = step("load_for_backend", lambda: load_for_backend(path, PRESET, verify=mutant.verify, cache=False))
    if lowered is not None:
        rts = step("runtime", lambda: runtimes(lowered))
        if rts is not None:
            step("run", lambda: call(lowered, runtime=True))
    if not events:
        return res
    bad = [ev for ev in events if not allowed(ev[0], changed, ev[1])]
    refused = [ev for ev in events if ev[0].startswith("artifact_error:")]
    outcome, phase, detail, tb = (bad or refused or events)[0]
    res.update(outcome=outcome, phase=phase, detail=detail, traceback=tb)
    return res
