"""A batch of mutants (a case of the campaign's sweep, exporter.sweep, in a process of its own): torch's
state and the seeds' references built once, then one mutant at a time, generated here from (seed,
index), written to a file and run by the mode's oracle. Before each mutant and after each of its
phases the batch reports how far it got (exporter.sweep.report: the mutant it is on and its phase;
with each new mutant, the last one's result as a step) and bounds that mutant's time, so a batch that
crashes or hangs is recorded with the mutant that did it; the campaign runs the rest as a new batch.

Byte mode: mutators.Mutator, oracle.execute. Semantic mode (``cfg["semantic"]``):
semantic.SemanticMutator (seed ATTACK_SEED names a concrete attack by index), semantic_oracle.execute,
and the process's current directory a fresh temporary folder the oracle watches for side effects
(the mutant's own folder is watched too). In both modes torch's process-global state (observe.snapshot,
taken once the references are built) must be the same after every mutant: a change is the outcome
``state_change``, set back; a batch whose state cannot be set back ends after that mutant (``retired``).
``cfg["plant"]`` ({"SEED:INDEX": [phase, "module:function"]}, semantic mode): that function runs instead
of the phase's work for that mutant (the oracle's own tests plant faults so)."""

from __future__ import annotations

import importlib
import json
import os
import shutil
import tempfile
import time
import traceback


def _byte_mode(seeds: dict, paths: dict, tmp: str, state: dict, plant: dict):
    """(mutant of (seed, index), run(path, mutant, on_phase), extra result fields) of the byte mode."""
    from .mutators import Mutator
    from .oracle import Reference, execute

    mutator = Mutator(seeds)
    refs = {n: Reference(n, p) for n, p in paths.items()}
    return mutator.mutant, lambda path, m, on_phase: execute(path, m, refs[m.model], on_phase), lambda m: {}


def _semantic_mode(seeds: dict, paths: dict, tmp: str, state: dict, plant: dict):
    """As _byte_mode, for the semantic mode: the current directory becomes a fresh watched folder."""
    from .semantic import ATTACK_SEED, SemanticMutator
    from .semantic_build import ATTACKS
    from .semantic_oracle import SemanticReference, execute

    mutator = SemanticMutator(seeds)
    cwd = tempfile.mkdtemp(prefix="cwd-", dir=os.path.dirname(tmp))
    os.chdir(cwd)
    refs = {n: SemanticReference(n, p) for n, p in paths.items()}

    def mutant(seed, index):
        return mutator.attack(list(ATTACKS)[index]) if seed == ATTACK_SEED else mutator.mutant(seed, index)

    def run(path, m, on_phase):
        planted = plant.get(f"{m.seed}:{m.index}")
        if planted:
            module, _, name = planted[1].partition(":")
            planted = (planted[0], getattr(importlib.import_module(module), name))
        return execute(path, m, refs[m.model], watch=(cwd, tmp), on_phase=on_phase, state=state, plant=planted)

    return mutant, run, lambda m: {"size": len(m.data)}


def run_batch(cfg: dict, jobs: list) -> dict:
    """Run the mutants ``jobs`` ([seed, index] pairs) in this process: {"results": one dict per mutant
    run, "retired": the batch ended early (its torch state could not be set back), "stopped": the
    campaign's time budget ran out (the file ``cfg["stop"]`` exists)}."""
    from exporter.sweep import report

    stop = cfg.get("stop")
    if stop and os.path.exists(stop):
        return {"results": [], "stopped": True}
    import resource

    if cfg.get("log"):
        fd = os.open(cfg["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    import logging
    import warnings

    warnings.simplefilter("ignore")
    import torch

    from .oracle import install_canary

    torch.set_num_threads(cfg.get("threads", 1))
    logging.disable(logging.WARNING)
    seeds = {n: open(p, "rb").read() for n, p in cfg["seeds"].items()}
    top = tempfile.mkdtemp(prefix="pt2b-fuzz-batch-")
    tmp = tempfile.mkdtemp(prefix="mutants-", dir=top)
    from . import observe

    state = {}
    mutant, run, extra = (_semantic_mode if cfg.get("semantic") else _byte_mode)(
        seeds, cfg["seeds"], tmp, state, cfg.get("plant") or {})
    install_canary()
    state.update(observe.snapshot())
    results: list = []
    out = {"results": results}

    def progress(current: dict, **how) -> None:
        report({"current": current, "tmp": top}, **how)

    try:
        for seed, index in jobs:
            if stop and os.path.exists(stop):
                out["stopped"] = True
                break
            current = {"seed": seed, "index": index, "phase": "generate", "changed": None}
            # the mutant before this one, finished; this one's time limit starts
            progress(current, seconds=cfg["timeout"], step=results[-1] if results else None)
            t0 = time.perf_counter()
            try:
                m = mutant(seed, index)
            except Exception as e:
                results.append({"seed": seed, "index": index, "outcome": "fuzzer_error", "kind": "?", "model": "?",
                                "desc": "", "verify": None, "preset": None, "changed": None, "phase": "generate",
                                "detail": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()[-6000:]})
                continue
            meta = {"seed": seed, "index": index, "kind": m.kind, "model": m.model, "desc": m.desc, "verify": m.verify,
                    "preset": m.preset, **extra(m)}
            current = dict(meta, phase="generate", changed=None)

            def on_phase(phase, changed):
                current.update(phase=phase, changed=changed)
                progress(current)

            progress(current)
            path = os.path.join(tmp, f"m{index}.pt2b")
            with open(path, "wb") as f:
                f.write(m.data)
            try:
                res = run(path, m, on_phase)
            finally:
                os.unlink(path)
            diff = observe.changes(state, observe.snapshot())
            if diff:  # (the semantic oracle checks and sets back after every phase: here the byte mode's)
                stuck = observe.restore(state)
                res.update(outcome="state_change", retire=bool(stuck), traceback="",
                           detail=f"the mutant left torch's process state changed: {'; '.join(diff)} "
                                  f"(its outcome was {res['outcome']} in {res.get('phase')})")
            res.update(meta)
            res["seconds"] = time.perf_counter() - t0
            results.append(json.loads(json.dumps(res, default=repr)))  # (what the oracle kept, as the record's JSON)
            if res.get("retire"):
                out["retired"] = True
                break
    finally:
        os.chdir(os.path.dirname(top))
        shutil.rmtree(top, ignore_errors=True)
    return out
