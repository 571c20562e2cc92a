"""The campaign driver: mutants in batches on the sweep runner (exporter.sweep), each batch a process
with a time limit per mutant; a batch that crashed or hung is recorded against the mutant it was on
(a death by a signal is the outcome ``signal:<NAME>``; SIGKILL, the kernel's out-of-memory killer,
``memory``) and the rest of its range runs as a new batch; totals per outcome class and kind,
findings grouped by signature; the report, and the replay of one mutant."""

from __future__ import annotations

import collections
import dataclasses
import os
import re
import shutil
import signal
import socket
import sys
import tempfile
import threading
import time

from .mutators import Mutator
from .oracle import allowed
from .seeds import DEFAULT_MODELS, export_seeds

SEMANTIC_MODELS = ("mlp", "cond", "dynamic_shapes")  # the semantic mode's default seeds
BATCH = 64  # mutants per batch at most: a batch builds torch's state and the references once
SETUP_SECONDS = 120.0  # a batch's time to build them, before its first mutant's own limit applies


@dataclasses.dataclass
class Campaign:
    seed: int
    models: tuple
    totals: collections.Counter = dataclasses.field(default_factory=collections.Counter)
    by_kind: dict = dataclasses.field(default_factory=lambda: collections.defaultdict(collections.Counter))
    findings: list = dataclasses.field(default_factory=list)  # result dicts of disallowed outcomes
    results: list = dataclasses.field(default_factory=list)  # every result (keep_results=True)
    done: int = 0
    seconds: float = 0.0
    restarts: int = 0
    semantic: bool = False  # the semantic mode: its mutator, oracle and rule (semantic_oracle.allowed)

    def rule(self, outcome: str, changed, phase) -> bool:
        if self.semantic:
            from .semantic_oracle import allowed as semantic_allowed

            return semantic_allowed(outcome, changed, phase)
        return allowed(outcome, changed, phase)

    def record(self, res: dict, keep: bool) -> None:
        res["allowed"] = self.rule(res["outcome"], res.get("changed"), res.get("phase"))
        key = _total_key(res)
        self.totals[key] += 1
        self.by_kind[res.get("kind", "?")]["allowed" if res["allowed"] else "FINDING"] += 1
        self.done += 1
        if not res["allowed"]:
            default = SEMANTIC_MODELS if self.semantic else DEFAULT_MODELS
            models = "" if tuple(self.models) == default else f" --models {','.join(self.models)}"
            mode = " --semantic" if self.semantic else ""
            sep = "=" if res["seed"] < 0 else " "  # (argparse reads " -1:0" as an option)
            res["replay"] = f"python -m tools.fuzz --replay{sep}{res['seed']}:{res['index']}{mode}{models} --run"
            self.findings.append(res)
        if keep:
            self.results.append(res)

    def distinct_findings(self) -> dict[str, list]:
        groups = collections.defaultdict(list)
        for r in sorted(self.findings, key=lambda r: (r["seed"], r["index"])):
            groups[finding_signature(r)].append(r)
        return dict(groups)

    def summary(self) -> dict:
        return {
            "mode": "semantic" if self.semantic else "bytes",
            "seed": self.seed, "models": list(self.models), "mutants": self.done, "seconds": round(self.seconds, 1),
            "mutants_per_second": round(self.done / self.seconds, 2) if self.seconds else None,
            "worker_restarts": self.restarts,
            "totals": dict(sorted(self.totals.items(), key=lambda kv: -kv[1])),
            "by_kind": {k: dict(v) for k, v in sorted(self.by_kind.items())},
            "distinct_findings": [
                {"signature": sig, "count": len(rs), "example": {k: v for k, v in rs[0].items() if k != "allowed"},
                 "indices": [r["index"] for r in rs[:50]]}
                for sig, rs in self.distinct_findings().items()
            ],
        }


def _death(code) -> tuple[str, str]:
    """(outcome, words) of a worker that died with exit code ``code`` (negative: the signal)."""
    if code is not None and code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"SIG{-code}"
        if -code == signal.SIGKILL:
            return "memory", "killed by SIGKILL (the kernel's out-of-memory killer)"
        return f"signal:{name}", f"killed by {name}"
    return "crash", f"died with exit code {code}"


def _total_key(res: dict) -> str:
    o = res["outcome"]
    if o in ("mismatch", "memory") or o.startswith(("lowering_error:", "run_error:", "other:")):
        o += " [changed program]" if res.get("changed") else (" [same program]" if res.get("changed") is False else "")
    return o


def finding_signature(res: dict) -> str:
    """Outcome + phase + the exception message with numbers, quotes and paths blurred."""
    detail = (res.get("detail") or "").splitlines()[0] if res.get("detail") else ""
    detail = re.sub(r"/[^\s:,'\"]+", "<path>", detail)
    detail = re.sub(r"'[^']*'|\"[^\"]*\"", "<s>", detail)
    detail = re.sub(r"(?<![A-Za-z_])\d+", "N", detail)[:160]
    return f"{res['outcome']} @ {res.get('phase')} | {detail}"


def run_campaign(seed: int, mutants: int, *, workers: int = 2, models=DEFAULT_MODELS, seeds_dir: str | None = None,
                 timeout: float = 20.0, mem_gib: float = 6.0, time_budget: float | None = None, start: int = 0,
                 indices=None, keep_results: bool = False, progress=None, log: str | None = None,
                 threads: int = 1, semantic: bool = False, plant: dict | None = None, batch: int | None = None,
                 records: str | None = None, resume: bool = True, ray: str | None = None) -> Campaign:
    """Run mutants ``start .. start+mutants-1`` (or the given ``indices``: ints, or (seed, index)
    pairs, each once) of ``seed`` on the sweep runner: batches of ``batch`` mutants (default: up to
    BATCH, an eighth of the campaign at most), each in a process of its own (``workers`` at a time on
    this machine, or Ray tasks with ``ray``: "auto" or an address; the seed artifacts must then be at
    the same path on every node), ``timeout`` seconds per
    mutant, ``mem_gib`` the address space of each batch's process. A batch that crashes or hangs is
    recorded against the mutant it was on; the rest of its range runs as a new batch. ``records``: the
    sweep's records file (kept, so a campaign run again resumes; ``resume=False`` starts over); by
    default a temporary one. ``time_budget`` (seconds) stops starting new mutants once spent (a batch it
    stopped runs again when the campaign is resumed). ``semantic``: the semantic mode
    (tools/fuzz/semantic.py, semantic_oracle.py); there the pair (semantic.ATTACK_SEED, i) is the i-th
    concrete attack of semantic_build.ATTACKS. ``plant``: faults planted in the semantic oracle's phases,
    {(seed, index): (phase, "module:function")} (worker.py)."""
    from exporter import sweep

    work = tempfile.mkdtemp(prefix="pt2b-fuzz-run-")  # removed at the end, with what a killed batch left there
    if seeds_dir is None:
        seeds_dir = records + ".seeds" if records else os.path.join(work, "seeds")
    seed_paths = export_seeds(models, seeds_dir)
    stop = records + ".stop" if records else os.path.join(work, "stop")
    if os.path.exists(stop):  # (an earlier run's budget: this run has its own)
        os.unlink(stop)
    cfg = {"seeds": seed_paths, "log": log, "threads": threads, "timeout": timeout, "semantic": semantic,
           "stop": stop, "plant": {f"{k[0]}:{k[1]}": list(v) for k, v in (plant or {}).items()}}
    todo = list(dict.fromkeys(tuple(x) if isinstance(x, (tuple, list)) else (seed, x)
                              for x in (indices if indices is not None else range(start, start + mutants))))
    # by default a small campaign is still cut into several batches, to share out
    size = max(1, batch or min(BATCH, -(-len(todo) // 8)))
    cases = [_batch(cfg, todo[i:i + size]) for i in range(0, len(todo), size)]
    limits = sweep.Limits(timeout=SETUP_SECONDS + size * timeout, memory_gb=mem_gib)
    camp = Campaign(seed, tuple(models), semantic=semantic)
    timer = threading.Timer(time_budget, lambda: open(stop, "w").close()) if time_budget is not None else None
    t0 = last_progress = time.monotonic()
    path = records or os.path.join(work, "records.jsonl")
    try:
        if timer:
            timer.daemon = True
            timer.start()
        first = True
        while cases:
            jobs = {c.id: c.args[1] for c in cases}
            rest = []
            for rec, _ in sweep.iterate(cases, path, workers=workers, ray=ray, limits=limits,
                                        resume=resume or not first, redo=_stopped):
                more = _take(camp, rec, jobs[rec["id"]], timeout, keep_results)
                if more and not os.path.exists(stop):
                    rest.append(_batch(cfg, more))
                if progress and time.monotonic() - last_progress > 30:
                    last_progress = time.monotonic()
                    progress(camp, last_progress - t0)
            cases, first = rest, False
    finally:
        if timer:
            timer.cancel()
        camp.seconds = time.monotonic() - t0
        shutil.rmtree(work, ignore_errors=True)
        if os.path.exists(stop):
            os.unlink(stop)
    return camp


def _batch(cfg: dict, jobs) -> "sweep.Case":
    from exporter import sweep

    jobs = [list(j) for j in jobs]
    return sweep.Case(f"{jobs[0][0]}:{jobs[0][1]}+{len(jobs)}", "tools.fuzz.worker:run_batch", (cfg, jobs))


def _stopped(rec: dict) -> bool:
    """A batch the time budget stopped: run again when the campaign is."""
    return rec["outcome"] == "ok" and bool(rec["result"].get("stopped"))


def _take(camp: Campaign, rec: dict, jobs: list, timeout: float, keep: bool) -> list:
    """Count a batch's record in ``camp``; the jobs after the one that ended it early, to run anew."""
    if rec["outcome"] == "ok":
        for res in rec["result"]["results"]:
            camp.record(res, keep)
        if not rec["result"].get("retired"):
            return []
        camp.restarts += 1
        return jobs[len(rec["result"]["results"]):]
    partial = rec.get("partial")
    if rec["outcome"] == "lost" or partial is None:
        raise RuntimeError(f"fuzz batch {rec['id']} {'was lost' if rec['outcome'] == 'lost' else 'failed to start'}: "
                           f"{rec.get('error_type', '')} {rec.get('error')}\n{rec.get('log_tail', '')}\n"
                           f"run the campaign again (with --records it resumes), or see the batch's log")
    done = rec.get("steps") or []
    for res in done:
        camp.record(res, keep)
    current = partial["current"]
    phase = current.pop("phase")
    changed = current.pop("changed")
    outcome, how = _ending(rec, timeout, phase)
    camp.record(dict(current, outcome=outcome, changed=changed, phase=phase, detail=how, traceback=rec.get("traceback", "")),
                keep)
    camp.restarts += 1
    if rec.get("host") == socket.gethostname():
        shutil.rmtree(partial.get("tmp") or "", ignore_errors=True)  # (the killed batch's mutant files)
    return jobs[len(done) + 1:]


def _ending(rec: dict, timeout: float, phase: str) -> tuple[str, str]:
    """(outcome, detail) of the mutant a batch was on when its process ended without a result."""
    if rec["outcome"] == "timeout":
        return "timeout", f"no result within {timeout:g} s (phase {phase})"
    if rec["outcome"] == "crash":
        name = rec.get("signal")
        number = getattr(signal, name, None) if name else None
        code = -int(number) if number is not None else int((re.findall(r"exit code (-?\d+)", rec.get("error", "")) or [1])[0])
        outcome, how = _death(code)
        return outcome, f"worker {how} during {phase}"
    if rec["outcome"] == "memory":
        return "memory", f"worker out of memory during {phase}: {rec.get('error')}"
    return "fuzzer_error", f"the batch raised during {phase}: {rec.get('error_type')}: {rec.get('error')}"


def print_report(camp: Campaign, out=sys.stdout) -> None:
    """Totals by outcome class and by mutation kind, then each distinct finding with its replay."""
    s = camp.summary()
    p = lambda *a: print(*a, file=out)  # noqa: E731
    mode = "semantic mode, " if camp.semantic else ""
    p(f"{mode}seed {camp.seed}: {camp.done} mutants of {', '.join(camp.models)} in {camp.seconds:.0f} s "
      f"({s['mutants_per_second']} mutants/s), {camp.restarts} worker restarts")
    p("totals by outcome class:")
    for k, n in s["totals"].items():
        flag = "" if camp.rule(k.split(" [")[0], True if "[changed" in k else (False if "[same" in k else None),
                               "run") or k.startswith(("ok_equal", "artifact_error")) else "   <-- NOT ALLOWED"
        p(f"  {n:8d}  {k}{flag}")
    p("by mutation kind (allowed / findings):")
    for k, c in s["by_kind"].items():
        p(f"  {k:20s} {c.get('allowed', 0):8d} / {c.get('FINDING', 0)}")
    groups = camp.distinct_findings()
    p(f"findings: {len(camp.findings)} ({len(groups)} distinct)")
    for sig, rs in groups.items():
        r = rs[0]
        p(f"- [{len(rs)}x] {sig}")
        p(f"    first: seed {r['seed']} mutant {r['index']} ({r.get('model')}, {r.get('kind')}: {r.get('desc')}; "
          f"verify={r.get('verify')}, preset={r.get('preset')})")
        p(f"    replay: {r['replay']}")


def replay(spec: str, models, out_path: str | None, run: bool, seeds_dir: str | None, timeout: float,
           mem_gib: float, semantic: bool = False) -> int:
    """Write mutant ``spec`` ("SEED:INDEX") to ``out_path`` and describe it; with ``run``, also run it
    in a worker and print its outcome and traceback. 1 if that outcome is not allowed, else 0.
    ``semantic``: a mutant of the semantic mode (seed -1: the INDEX-th concrete attack)."""
    seed, _, index = spec.partition(":")
    seed, index = int(seed), int(index)
    own = seeds_dir is None
    seeds_dir = seeds_dir or tempfile.mkdtemp(prefix="pt2b-fuzz-seeds-")
    paths = export_seeds(models, seeds_dir)
    seeds = {n: open(p, "rb").read() for n, p in paths.items()}
    if semantic:
        from .semantic import ATTACK_SEED, SemanticMutator
        from .semantic_build import ATTACKS

        mutator = SemanticMutator(seeds)
        m = mutator.attack(list(ATTACKS)[index]) if seed == ATTACK_SEED else mutator.mutant(seed, index)
    else:
        m = Mutator(seeds).mutant(seed, index)
    out_path = out_path or f"fuzz_{seed}_{index}.pt2b"
    with open(out_path, "wb") as f:
        f.write(m.data)
    print(f"seed {seed} mutant {index}: {m.model}, {m.kind}: {m.desc}")
    print(f"  verify={m.verify} preset={m.preset}; {len(m.data)} bytes written to {out_path}")
    print(f"  reproduce by hand: load({out_path!r}, verify={m.verify}) then "
          f"Runtime(load_for_backend({out_path!r}, {m.preset!r}, verify={m.verify}))(*make_case({m.model!r}).args)")
    rc = 0
    if run:
        camp = run_campaign(seed, 0, indices=[(seed, index)], workers=1, models=models, seeds_dir=seeds_dir,
                            timeout=timeout, mem_gib=mem_gib, keep_results=True, semantic=semantic)
        r = camp.results[0]
        print(f"  outcome: {r['outcome']} (phase {r.get('phase')}, changed={r.get('changed')}) -> "
              f"{'allowed' if r['allowed'] else 'NOT ALLOWED'}")
        if r.get("detail"):
            print(f"  detail: {r['detail']}")
        if r.get("phases"):
            print(f"  phases: {r['phases']}")
        if r.get("side_effects"):
            print(f"  side effects: {r['side_effects']}")
        if r.get("traceback"):
            print(r["traceback"])
        rc = 0 if r["allowed"] else 1
    if own:
        for f in os.listdir(seeds_dir):
            os.unlink(os.path.join(seeds_dir, f))
        os.rmdir(seeds_dir)
    return rc
