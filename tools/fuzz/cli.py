"""The fuzzer's command line (``python -m tools.fuzz --help``): a campaign, or the replay of one mutant."""

from __future__ import annotations

import argparse
import json
import sys

from . import __doc__ as OVERVIEW
from .campaign import BATCH, SEMANTIC_MODELS, print_report, replay, run_campaign
from .seeds import DEFAULT_MODELS


SEMANTIC_TIMEOUT = 8.0  # seconds per semantic mutant: every phase of a small seed takes well under 1 s


def main(argv=None) -> int:
    """Run a campaign and print its report (exit status 1 if it found anything), or --replay one mutant."""
    ap = argparse.ArgumentParser(prog="python -m tools.fuzz", description=OVERVIEW.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mutants", type=int, default=1000)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--start", type=int, default=0, help="first mutant index")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--semantic", action="store_true",
                    help="semantic mode: edits of the program's meaning (tools/fuzz/semantic.py), every entry point "
                         "run with side effects watched (semantic_oracle.py); with --replay: a semantic mutant")
    ap.add_argument("--models", help=f"comma-separated zoo cases (default {','.join(DEFAULT_MODELS)}; "
                                     f"semantic: {','.join(SEMANTIC_MODELS)})")
    ap.add_argument("--seeds-dir", help="where seed artifacts are (re)used; default: a temporary folder")
    ap.add_argument("--timeout", type=float, help=f"seconds per mutant (default 20; semantic: {SEMANTIC_TIMEOUT:g})")
    ap.add_argument("--mem-gib", type=float, default=6.0, help="RLIMIT_AS of each worker")
    ap.add_argument("--time-budget", type=float, help="stop dispatching after this many seconds")
    ap.add_argument("--json", help="write totals and findings here")
    ap.add_argument("--log", help="the batches' stdout/stderr go here (default: each batch's log, next to --records)")
    ap.add_argument("--batch", type=int, help=f"mutants per batch process (default: up to {BATCH})")
    ap.add_argument("--records", help="the sweep's records file: a campaign run again with it resumes "
                                      "(default: a temporary one)")
    ap.add_argument("--fresh", action="store_true", help="with --records: start over")
    ap.add_argument("--ray", metavar="auto|ADDRESS", help="run the batches as Ray tasks on that cluster "
                                                          "(--seeds-dir on a folder every node sees)")
    ap.add_argument("--replay", metavar="SEED:INDEX", help="save that mutant (see --out) and describe it")
    ap.add_argument("--out", help="with --replay: file to write (default fuzz_SEED_INDEX.pt2b)")
    ap.add_argument("--run", action="store_true", help="with --replay: also run it in a worker, print the traceback")
    a = ap.parse_args(argv)
    models = tuple(m for m in a.models.split(",") if m) if a.models else (
        SEMANTIC_MODELS if a.semantic else DEFAULT_MODELS)
    timeout = a.timeout if a.timeout is not None else (SEMANTIC_TIMEOUT if a.semantic else 20.0)
    if a.replay:
        return replay(a.replay, models, a.out, a.run, a.seeds_dir, timeout, a.mem_gib, semantic=a.semantic)

    def progress(camp, elapsed):
        bad = len(camp.findings)
        print(f"[{elapsed:6.0f} s] {camp.done} mutants, {camp.done / elapsed:.1f}/s, {bad} findings",
              file=sys.stderr, flush=True)

    camp = run_campaign(a.seed, a.mutants, workers=a.workers, models=models, seeds_dir=a.seeds_dir,
                        timeout=timeout, mem_gib=a.mem_gib, time_budget=a.time_budget, start=a.start,
                        progress=progress, log=a.log, semantic=a.semantic, batch=a.batch, records=a.records,
                        resume=not a.fresh, ray=a.ray)
    print_report(camp)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(camp.summary(), f, indent=1, default=str)
    return 1 if camp.findings else 0
