"""The semantic mode's worker process (started by campaign.run_campaign(semantic=True)): as worker.py
(torch imported once, RLIMIT_AS set, one mutant at a time, phases and results over the pipe), with
semantic mutants (semantic.SemanticMutator; seed ATTACK_SEED names a concrete attack by index) run by
semantic_oracle.execute, and the process's current directory a fresh temporary folder the oracle
watches for side effects (the mutant's own folder is watched too)."""

from __future__ import annotations

import os
import shutil
import tempfile
import time
import traceback


def semantic_worker_main(conn, cfg: dict) -> None:
    """Child process: build references, then answer ("run", seed, index) messages."""
    import resource

    log = cfg.get("log")
    fd = os.open(log if log else os.devnull, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    if cfg.get("mem_bytes"):
        resource.setrlimit(resource.RLIMIT_AS, (cfg["mem_bytes"], cfg["mem_bytes"]))
    import logging
    import warnings

    warnings.simplefilter("ignore")
    import torch

    from .oracle import install_canary
    from .semantic import ATTACK_SEED, SemanticMutator
    from .semantic_build import ATTACKS
    from .semantic_oracle import SemanticReference, execute

    torch.set_num_threads(cfg.get("threads", 1))
    logging.disable(logging.WARNING)
    seeds = {n: open(p, "rb").read() for n, p in cfg["seeds"].items()}
    mutator = SemanticMutator(seeds)
    tmp = tempfile.mkdtemp(prefix="worker-", dir=cfg.get("tmp"))
    cwd = tempfile.mkdtemp(prefix="cwd-", dir=cfg.get("tmp"))
    os.chdir(cwd)
    refs = {n: SemanticReference(n, p) for n, p in cfg["seeds"].items()}
    install_canary()
    conn.send(("ready", os.getpid()))
    try:
        while True:
            msg = conn.recv()
            if msg is None:
                break
            _, seed, index = msg
            t0 = time.perf_counter()
            try:
                m = mutator.attack(list(ATTACKS)[index]) if seed == ATTACK_SEED else mutator.mutant(seed, index)
            except Exception as e:
                conn.send(("done", {"seed": seed, "index": index, "outcome": "fuzzer_error", "kind": "?", "model": "?",
                                    "desc": "", "verify": None, "preset": None, "changed": None, "phase": "generate",
                                    "detail": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()[-6000:]}))
                continue
            meta = {"seed": seed, "index": index, "kind": m.kind, "model": m.model, "desc": m.desc, "verify": m.verify,
                    "preset": m.preset, "size": len(m.data)}
            conn.send(("start", meta))
            path = os.path.join(tmp, f"m{index}.pt2b")
            with open(path, "wb") as f:
                f.write(m.data)
            try:
                res = execute(path, m, refs[m.model], watch=(cwd, tmp),
                              on_phase=lambda p, c: conn.send(("phase", (p, c))))
            finally:
                os.unlink(path)
            res.update(meta)
            res["seconds"] = time.perf_counter() - t0
            conn.send(("done", res))
    finally:
        os.chdir(cfg.get("tmp") or "/")
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.rmtree(cwd, ignore_errors=True)
