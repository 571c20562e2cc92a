"""The campaign driver (the parent): a pool of worker processes with a time limit per mutant, a
worker that died or hung killed and restarted (a death by a signal is the outcome ``signal:<NAME>``;
SIGKILL, the kernel's out-of-memory killer, ``memory``), totals per outcome class and kind, findings
grouped by signature; the report, and the replay of one mutant."""

from __future__ import annotations

import collections
import dataclasses
import os
import re
import shutil
import signal
import sys
import tempfile
import time

from .mutators import Mutator
from .oracle import allowed
from .seeds import DEFAULT_MODELS, export_seeds

SEMANTIC_MODELS = ("mlp", "cond", "dynamic_shapes")  # the semantic mode's default seeds
from .worker import worker_main


class _Worker:
    def __init__(self, ctx, cfg):
        self.parent, child = ctx.Pipe()
        self.proc = ctx.Process(target=worker_main, args=(child, cfg), daemon=True)
        self.proc.start()
        child.close()
        self.ready = False
        self.started = time.monotonic()
        self.job = None  # [index, meta, phase, deadline, changed]

    def kill(self):
        if self.proc.is_alive():
            self.proc.kill()
        self.proc.join(5)
        self.parent.close()


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
                 threads: int = 1, semantic: bool = False, plant: dict | None = None) -> Campaign:
    """Run mutants ``start .. start+mutants-1`` (or the given ``indices``: ints, or (seed, index)
    pairs) of ``seed`` on ``workers`` worker processes. ``time_budget`` (seconds) stops dispatching new mutants once spent.
    ``semantic``: the semantic mode (tools/fuzz/semantic.py, semantic_oracle.py); there the pair
    (semantic.ATTACK_SEED, i) is the i-th concrete attack of semantic_build.ATTACKS. ``plant``: faults
    planted in the semantic oracle's phases, {(seed, index): (phase, "module:function")} (worker.py)."""
    import multiprocessing as mp
    from multiprocessing.connection import wait

    own_dir = None
    if seeds_dir is None:
        own_dir = seeds_dir = tempfile.mkdtemp(prefix="pt2b-fuzz-seeds-")
    seed_paths = export_seeds(models, seeds_dir)
    work = tempfile.mkdtemp(prefix="pt2b-fuzz-run-")  # workers' mutant files; removed even if one was killed
    cfg = {"seeds": seed_paths, "mem_bytes": int(mem_gib * 2**30) if mem_gib else 0, "log": log, "threads": threads,
           "tmp": work, "semantic": semantic,
           "plant": {f"{k[0]}:{k[1]}": list(v) for k, v in (plant or {}).items()}}
    todo = [x if isinstance(x, tuple) else (seed, x)
            for x in (indices if indices is not None else range(start, start + mutants))]
    todo.reverse()
    camp = Campaign(seed, tuple(models), semantic=semantic)
    ctx = mp.get_context("spawn")
    pool = [_Worker(ctx, cfg) for _ in range(max(1, min(workers, len(todo) or 1)))]
    t0 = time.monotonic()
    last_progress = t0
    spawn_limit = 600.0

    def restart(i):
        pool[i].kill()
        if not todo:  # nothing left for a new one
            pool[i].job = None
            return
        pool[i] = _Worker(ctx, cfg)
        camp.restarts += 1

    def give(w):
        if not todo or (time_budget is not None and time.monotonic() - t0 > time_budget):
            w.job = None
            return
        job_seed, index = todo.pop()
        w.job = [index, {"seed": job_seed, "index": index}, "generate", time.monotonic() + timeout, None]
        w.parent.send(("run", job_seed, index))

    try:
        while True:
            busy = [w for w in pool if w.job is not None or not w.ready]
            if not busy:
                break
            now = time.monotonic()
            deadlines = [w.job[3] if w.job else w.started + spawn_limit for w in busy]
            ready = wait([w.parent for w in busy] + [w.proc.sentinel for w in busy],
                         timeout=max(0.0, min(deadlines) - now))
            for i, w in enumerate(pool):
                if w not in busy:
                    continue
                dead = retired = False
                try:
                    while w.parent in ready and w.parent.poll():
                        kind, payload = w.parent.recv()
                        if kind == "ready":
                            w.ready = True
                            give(w)
                        elif kind == "start":
                            w.job[1] = payload
                        elif kind == "phase":
                            w.job[2], w.job[4] = payload
                        elif kind == "done":
                            camp.record(payload, keep_results)
                            retired = bool(payload.get("retire"))  # its torch state could not be set back
                            if retired:
                                break
                            give(w)
                except (EOFError, OSError):
                    dead = True
                if retired:
                    w.job = None
                    restart(i)
                    continue
                if dead or (not w.proc.is_alive()):
                    w.proc.join(1)
                    code = w.proc.exitcode
                    if w.job is not None:
                        index, meta, phase, _, changed = w.job
                        outcome, how = _death(code)
                        res = dict(meta, index=index, outcome=outcome, changed=changed, phase=phase,
                                   detail=f"worker {how} during {phase}", traceback="")
                        camp.record(res, keep_results)
                        restart(i)
                    elif not w.ready:
                        raise RuntimeError(f"fuzz worker failed to start (exit code {code}); set log= to see why")
                    else:
                        restart(i)
                    continue
                if w.job is not None and time.monotonic() > w.job[3]:
                    index, meta, phase, _, changed = w.job
                    res = dict(meta, index=index, outcome="timeout", changed=changed, phase=phase,
                               detail=f"no result within {timeout:g} s (phase {phase})", traceback="")
                    camp.record(res, keep_results)
                    restart(i)
                elif not w.ready and time.monotonic() > w.started + spawn_limit:
                    raise RuntimeError("fuzz worker did not start in time")
            if progress and time.monotonic() - last_progress > 30:
                last_progress = time.monotonic()
                progress(camp, time.monotonic() - t0)
    finally:
        for w in pool:
            try:
                w.parent.send(None)
            except (OSError, BrokenPipeError):
                pass
        for w in pool:
            w.proc.join(2)
            w.kill()
        camp.seconds = time.monotonic() - t0
        shutil.rmtree(work, ignore_errors=True)
        if own_dir:
            shutil.rmtree(own_dir, ignore_errors=True)
    return camp


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
