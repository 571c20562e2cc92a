"""The worker process (started by campaign.run_campaign): torch imported once, RLIMIT_AS set, the
seeds' references built once, then one mutant at a time, generated here from (seed, index), written
to a file and run by oracle.execute; phases and results go back to the parent over a pipe."""

from __future__ import annotations

import os
import tempfile
import time
import traceback

from .mutators import Mutator
from .oracle import Reference, execute, install_canary


def worker_main(conn, cfg: dict) -> None:
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

    torch.set_num_threads(cfg.get("threads", 1))
    logging.disable(logging.WARNING)
    seeds = {n: open(p, "rb").read() for n, p in cfg["seeds"].items()}
    mutator = Mutator(seeds)
    install_canary()
    refs = {n: Reference(n, p) for n, p in cfg["seeds"].items()}
    tmp = tempfile.mkdtemp(prefix="worker-", dir=cfg.get("tmp"))
    conn.send(("ready", os.getpid()))
    try:
        while True:
            msg = conn.recv()
            if msg is None:
                break
            _, seed, index = msg
            t0 = time.perf_counter()
            try:
                m = mutator.mutant(seed, index)
            except Exception as e:
                conn.send(("done", {"seed": seed, "index": index, "outcome": "fuzzer_error", "kind": "?", "model": "?", "desc": "",
                                    "verify": None, "preset": None, "changed": None, "phase": "generate",
                                    "detail": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()[-6000:]}))
                continue
            meta = {"seed": seed, "index": index, "kind": m.kind, "model": m.model, "desc": m.desc, "verify": m.verify,
                    "preset": m.preset}
            conn.send(("start", meta))
            path = os.path.join(tmp, f"m{index}.pt2b")
            with open(path, "wb") as f:
                f.write(m.data)
            try:
                res = execute(path, m, refs[m.model], lambda p, c: conn.send(("phase", (p, c))))
            finally:
                os.unlink(path)
            res.update(meta)
            res["seconds"] = time.perf_counter() - t0
            conn.send(("done", res))
    finally:
        for f in os.listdir(tmp):
            os.unlink(os.path.join(tmp, f))
        os.rmdir(tmp)
