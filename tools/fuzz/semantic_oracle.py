"""The semantic mode's oracle: every entry point a user may call first on an untrusted file, each run
on the mutant in a worker (time limit: the campaign's per-mutant ``timeout``; memory: RLIMIT_AS),
with the worker's current directory a fresh, watched temporary folder.

Phases, in order (each runs whatever the earlier ones raised; those needing a program skip when
there is none):
  load               exporter.load(path, verify=v)
  check              prog.check()
  call               every method of the seed on its example inputs (the first call)
  verify             what `pt2b verify` runs: every method's reader.check, then verify_weights
  inspect            what `pt2b inspect` prints (exporter.cli.inspect.summarize)
  load_for_backend   load_for_backend(path, preset="core", verify=v, cache=False)
  runtime, run       runtime_ref.runtimes(lowered), then every method on the example inputs
After each phase: the canary file (``PT2B_FUZZ_CANARY``, what the shell payloads touch) or any new
file in the watched folders (the cwd, the mutant's folder), the worker's canary builtin called, or an
os.system/subprocess audit event, is a side effect; new files are removed before the next phase.

Rule (``allowed``; outcome classes as oracle.py names them):
  ok / ok_equal, artifact_error:<ArtifactError subclass>            allowed, in any phase
  mismatch, lowering_error:<Class>, run_error:<Type>                allowed iff the program was changed
                                                                    and the phase executes it (call,
                                                                    load_for_backend, runtime, run)
  timeout, memory                                                   never (whatever the phase: a
                                                                    semantic mutant asks for no work
                                                                    a valid program of its size would)
  crash, other:<Type> (any other exception, SystemExit included),   never
  other:CodeExecution (canary file, canary call, audit event),
  side_effect:NewFile
A mutant's outcome is the first disallowed phase outcome, else the first ArtifactError, else "ok";
``phases`` maps every phase run to its own outcome.
"""

from __future__ import annotations

import os
import shutil
import time
import traceback

from .oracle import _CANARY_HITS, CodeExecution, _classify, _clone_tree
from .semantic_values import CANARY_FILE

PHASES = ("load", "check", "call", "verify", "inspect", "load_for_backend", "runtime", "run")
EXEC_PHASES = ("call", "load_for_backend", "runtime", "run")
PRESET = "core"


def allowed(outcome: str, changed: bool | None, phase: str | None = None) -> bool:
    """Is ``outcome`` (of ``phase``) acceptable for a semantic mutant? (the rule in the module docstring)"""
    if outcome in ("ok", "ok_equal") or outcome.startswith("artifact_error:"):
        return True
    if changed is True and (outcome == "mismatch" or outcome.startswith(("lowering_error:", "run_error:"))):
        return phase in EXEC_PHASES
    return False


class SemanticReference:
    """A seed's example inputs and methods, and torch warmed up on it (load, call, lowering), so that a
    mutant's time is its own."""

    def __init__(self, name: str, path: str):
        from exporter import load
        from exporter.api import load_for_backend

        from .seeds import seed_case

        case, self.methods = seed_case(name)
        self.args, self.kwargs = case.args, case.kwargs or {}
        prog = load(path)
        for m in self.methods:
            prog.methods[m](*_clone_tree(self.args), **_clone_tree(self.kwargs))
        load_for_backend(path, PRESET, cache=False)


def _reset_torch() -> None:
    """Undo global state a mutant may have flipped (grad mode through torch._C._set_grad_enabled...)."""
    import torch

    torch.set_grad_enabled(True)
    torch.set_default_dtype(torch.float32)


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


def _verify(path) -> int:
    """`pt2b verify` (exporter/cli/verify.py) without its printing."""
    from exporter.serialize import reader

    art = reader.open_artifact(path)
    for name in art.method_names:
        reader.check(reader.method(art, name))
    return reader.verify_weights(art)


def execute(path: str, mutant, ref: SemanticReference, watch=(), on_phase=lambda phase, changed: None) -> dict:
    """Run every phase on the mutant at ``path``; the result dict (outcome, phase, detail, traceback,
    changed, phases, phase_seconds, side_effects)."""
    from exporter import load
    from exporter.api import load_for_backend
    from exporter.cli.inspect import summarize
    from runtime_ref import runtimes

    changed = mutant.kind != "identity"
    res = {"outcome": "ok", "changed": changed, "phase": None, "detail": "", "traceback": "", "phases": {},
           "phase_seconds": {}, "side_effects": []}
    events = []  # (outcome, phase, detail, traceback)
    watch = [d for d in watch if d]
    before = _snapshot(watch)
    state = {}

    def step(phase, fn):
        on_phase(phase, changed)
        _CANARY_HITS.clear()
        t0 = time.perf_counter()
        outcome, value = "ok", None
        try:
            value = fn()
        except (Exception, SystemExit, CodeExecution) as e:
            outcome = "other:CodeExecution" if isinstance(e, CodeExecution) else _classify(e, phase, changed)
            events.append((outcome, phase, f"{type(e).__name__}: {str(e)[:500]}",
                           "".join(traceback.format_exception(type(e), e, e.__traceback__))[-6000:]))
        finally:
            _reset_torch()
        res["phase_seconds"][phase] = round(time.perf_counter() - t0, 3)
        hits = list(_CANARY_HITS)
        files = _new_files(before) if watch else []
        if hits or files:
            code = hits or any(os.path.basename(f) == CANARY_FILE for f in files)
            what = "; ".join(hits + [f"new file {os.path.basename(f)}" for f in files])
            res["side_effects"].append(f"{phase}: {what}")
            events.insert(0, ("other:CodeExecution" if code else "side_effect:NewFile", phase,
                              f"side effect during {phase}: {what}", ""))
            outcome = events[0][0]
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
        state["checked"] = step("check", prog.check)
        step("call", lambda: call(prog))
    del prog
    step("verify", lambda: _verify(path))
    step("inspect", lambda: summarize(path))
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
