"""The fuzz campaign on the sweep runner: mutants run in batches, each batch a process of its own; a
mutant that hangs or crashes its batch is that mutant's finding, the mutants before it keep their
results, the rest of the batch runs as a new batch, and a campaign run again resumes from its records."""

from __future__ import annotations

import time

from exporter import sweep
from tools.fuzz.campaign import run_campaign

from tests.support import planted_faults

JOBS = [(0, i) for i in range(6)]


def hang():
    while True:
        time.sleep(1)


def test_a_mutant_that_hangs_or_crashes_its_batch_is_its_own_finding(tmp_path):
    plant = {(0, 2): ("verify", f"{__name__}:hang"), (0, 4): ("inspect", f"{planted_faults.__name__}:segfault")}
    records = str(tmp_path / "fuzz.jsonl")
    kw = dict(indices=JOBS, workers=1, models=("mlp",), timeout=3.0, mem_gib=6, keep_results=True, semantic=True,
              plant=plant, batch=len(JOBS), records=records)
    camp = run_campaign(0, 0, **kw)
    by_job = {(r["seed"], r["index"]): r for r in camp.results}
    assert sorted(by_job) == JOBS and camp.done == len(JOBS)
    hung, crashed = by_job[(0, 2)], by_job[(0, 4)]
    assert (hung["outcome"], hung["phase"], hung["detail"]) == ("timeout", "verify", "no result within 3 s (phase verify)")
    assert (crashed["outcome"], crashed["phase"]) == ("signal:SIGSEGV", "inspect")
    assert crashed["detail"] == "worker killed by SIGSEGV during inspect"
    assert hung["kind"] and crashed["kind"]  # what the mutant was, known before it ran
    others = [by_job[j] for j in JOBS if j not in plant]
    assert all(r["allowed"] and r.get("phases") for r in others), [r["outcome"] for r in others]
    assert {f["index"] for f in camp.findings} == {2, 4} and camp.restarts == 2
    recs = sweep.read(records)  # the batch, and the rest after each mutant that ended one
    assert {i: (r["outcome"], len(r.get("steps", []))) for i, r in recs.items()} == {
        "0:0+6": ("timeout", 2), "0:3+3": ("crash", 1), "0:5+1": ("ok", 0)}
    assert recs["0:0+6"]["partial"]["current"]["index"] == 2 and recs["0:3+3"]["signal"] == "SIGSEGV"
    again = run_campaign(0, 0, **kw)  # resumed: every batch read back from the records, none run
    assert len(open(records).read().splitlines()) == 3
    assert sorted((r["seed"], r["index"], r["outcome"]) for r in again.results) == \
        sorted((r["seed"], r["index"], r["outcome"]) for r in camp.results)
    assert again.restarts == 2
