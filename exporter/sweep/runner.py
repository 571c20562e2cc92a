"""The sweep: cases handed to an executor (local pool or Ray), each finished case's record appended
to the records file, lost cases run again, cases already recorded skipped (resume by default)."""

from __future__ import annotations

import collections
import json
import os
import re
from typing import Any, Callable, Iterable, Iterator, Union

from ..errors import SweepError
from . import journal
from .case import Case, Limits
from .local import LocalPool
from .ray_pool import RayPool

Executor = Union[LocalPool, RayPool]

RECORD_KEYS = ("outcome", "result", "error_type", "error", "signal", "partial", "steps", "torch", "backend_version", "pt2b", "git",
               "seconds", "cpu_seconds", "peak_rss_mb", "host", "node", "python", "log_tail", "traceback")


def executor_for(workers: int = 2, ray: str | None = None) -> Executor:
    """The executor a command line asks for: Ray at ``ray`` ("auto" or an address), else a local pool."""
    return RayPool(ray) if ray else LocalPool(workers)


def _call(case: Case) -> dict:
    """What the case runs, as its record keeps it (JSON: tuples read back as lists)."""
    return json.loads(json.dumps({"fn": case.fn, "args": case.args, "kwargs": case.kwargs}))


def log_path(log_dir: str, case_id: str) -> str:
    """The file a case's output goes to in ``log_dir`` (its id, made a safe file name)."""
    return os.path.join(log_dir, re.sub(r"[^A-Za-z0-9_.-]", "_", case_id) + ".log")


def run(cases: Iterable[Case], records: str, *, on_record: Callable[[dict], None] | None = None,
        **options: Any) -> dict[str, dict]:
    """Run every case not yet recorded in ``records`` (``iterate`` says how) and return case id ->
    record, in the order of ``cases``; ``on_record`` sees each new record as it is written."""
    cases = list(cases)
    out = {}
    for rec, new in iterate(cases, records, **options):
        out[rec["id"]] = rec
        if new and on_record is not None:
            on_record(rec)
    return {c.id: out[c.id] for c in cases if c.id in out}


def iterate(cases: Iterable[Case], records: str, *, executor: Executor | None = None, workers: int = 2, ray: str | None = None,
            limits: Limits = Limits(), resume: bool = True, redo: Callable[[dict], bool] | None = None,
            log_dir: str | None = None) -> Iterator[tuple[dict, bool]]:
    """(record, new) of every case: first those already in ``records`` (a JSON-lines file;
    ``resume=False`` starts it over; ``redo(record)`` True: run a recorded case again), then each case
    run as it finishes. ``executor``: a LocalPool or RayPool (default: ``executor_for(workers, ray)``);
    each case's output goes to ``log_dir`` (default: the records file's name + ".logs")."""
    cases = list(cases)
    seen = collections.Counter(c.id for c in cases)
    twice = [i for i, n in seen.items() if n > 1]
    if twice:
        raise SweepError(f"case ids must be unique in a sweep; {', '.join(map(repr, twice[:5]))} repeat.")
    if not resume and os.path.exists(records):
        os.remove(records)
    previous = journal.read(records)
    by_id = {c.id: c for c in cases}
    # a record stands for a case only if it ran the same function on the same arguments
    finished = {i for i in journal.done(previous) if i in by_id and previous[i].get("call") == _call(by_id[i])
                and not (redo and redo(previous[i]))}
    log_dir = log_dir or records + ".logs"
    pending = collections.deque(c for c in cases if c.id not in finished)
    attempts: collections.Counter = collections.Counter()
    for c in cases:
        if c.id in finished:
            yield previous[c.id], False
    if not pending:
        return
    executor = executor if executor is not None else executor_for(workers, ray)
    book = journal.Journal(records)
    in_flight = 0
    try:
        while pending or in_flight:
            while pending and in_flight < executor.capacity:
                case = pending.popleft()
                attempts[case.id] += 1
                executor.submit(case, limits, log_path(log_dir, case.id))
                in_flight += 1
            for case, outcome in executor.wait(1.0):
                in_flight -= 1
                if outcome.get("outcome") == "lost" and attempts[case.id] <= limits.retries:
                    pending.appendleft(case)  # not the case's failure: again, first in line
                    continue
                rec = {"id": case.id, "call": _call(case), "backend": case.backend, **{k: outcome[k] for k in RECORD_KEYS if k in outcome},
                       "executor": executor.name, "attempts": attempts[case.id]}
                book.append(rec)
                yield rec, True
    finally:
        executor.close()
        book.close()
