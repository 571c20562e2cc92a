"""`pt2b opset coverage`: how much of a corpus of artifacts a backend's op set covers.

Each artifact is lowered for real (the same plan load_for_backend makes, the opset check reporting
instead of raising), so the answer is what load_for_backend would do: a model is covered when its
lowered graph holds only accepted ops (every method's, for a multi-method artifact). The greedy list
says which ops to implement next to cover the most models soonest.
"""

from __future__ import annotations

import dataclasses
import os
import pathlib

@dataclasses.dataclass
class ModelCoverage:
    path: str
    ops: dict[str, int]        # the lowered program's ops -> call sites
    missing: dict[str, int]    # ops outside the accepted set -> call sites
    error: str = ""            # a lowering that failed outright (the model is not covered)

    @property
    def covered(self) -> bool:
        return not self.missing and not self.error


def artifacts(corpus) -> list[str]:
    """.pt2b files named in ``corpus`` (files, or folders searched recursively), sorted."""
    out = []
    for entry in corpus:
        p = pathlib.Path(entry)
        out += [str(f) for f in sorted(p.rglob("*.pt2b"))] if p.is_dir() else [str(p)]
    return out


def measure_one(path: str, preset: str = "core", supported_ops=None, keep=None) -> dict:
    """One artifact lowered with the plan ``preset``/``supported_ops``/``keep`` make (a sweep case):
    its lowered ops and those outside the accepted set, over every method, or why lowering failed."""
    from collections import Counter

    from ..errors import Pt2bError
    from ..lowering.pipeline import lower_exported
    from ..request import plan_request
    from ..serialize.read.reader import read_programs

    # what falls outside is reported instead of raising on the first model
    plan = plan_request(preset, supported_ops=supported_ops, keep=keep).reporting()
    ops, missing = Counter(), Counter()
    try:
        for ep in read_programs(path).values():
            lowered = lower_exported(ep, plan)
            ops.update(lowered.ops())
            missing.update(lowered.outside_opset)
    except Pt2bError as e:
        return {"ops": {}, "missing": {}, "error": f"{type(e).__name__}: {str(e).splitlines()[0]}"}
    return {"ops": dict(ops), "missing": dict(missing), "error": ""}


def _row(path: str, rec: dict) -> ModelCoverage:
    if rec["outcome"] == "ok":
        return ModelCoverage(path, **rec["result"])
    # (the lowering raised, crashed, ran out of time or memory: the model is not covered)
    why = f"{rec.get('error_type') or rec['outcome']}: {(rec.get('error') or '').splitlines()[0] if rec.get('error') else ''}"
    return ModelCoverage(path, {}, {}, why.strip(": "))


def measure(paths, preset: str = "core", *, supported_ops=None, keep=None, track=None, workers: int = 1,
            ray: str | None = None, records: str | None = None, timeout: float = 3600.0,
            memory_gb: float = 0.0) -> list[ModelCoverage]:
    """Lower each artifact of ``paths`` with the plan ``preset``/``supported_ops``/``keep`` make, each
    in its own process (exporter.sweep: ``workers`` at a time here, or on the Ray cluster ``ray``;
    ``timeout`` seconds and ``memory_gb`` each); ``records``: the sweep's records file, resumed from
    (default: a temporary one); ``track`` (exporter.cli.progress.tracker) reports each one."""
    import tempfile

    from .. import sweep

    paths = [os.path.abspath(os.fspath(p)) for p in paths]
    args = (preset, list(supported_ops) if supported_ops is not None else None, list(keep) if keep else None)
    cases = [sweep.Case(p, measure_one, (p, *args)) for p in paths]
    limits = sweep.Limits(timeout=timeout, memory_gb=memory_gb)
    with tempfile.TemporaryDirectory(prefix="pt2b-coverage-") as tmp:
        got = sweep.iterate(cases, records or os.path.join(tmp, "records.jsonl"), workers=workers, ray=ray,
                            limits=limits, log_dir=None if records else os.path.join(tmp, "logs"))
        if track is not None:
            got = track(got, total=len(cases), label=lambda r: pathlib.Path(r[0]["id"]).name)
        rows = {rec["id"]: _row(rec["id"], rec) for rec, _ in got}
    return [rows[p] for p in paths]


def greedy_next(needs: list, limit: int = 10) -> list[tuple[str, int]]:
    """A greedy set cover: ops to accept next, each listed once, each chosen to complete the most models
    (ties: wanted by the most models, then an op other than a prims op, then the first name), with the
    number of models covered after it. ``needs``: per model, what it lacks beyond the accepted set
    (empty: covered), each item an op name or a set of ops any one of which meets it (a prims op and the
    ATen op whose decomposition emits it, selection.py). The explorer page's script does the same."""
    models = [{frozenset([n]) if isinstance(n, str) else frozenset(n) for n in m} for m in needs]
    done = sum(1 for m in models if not m)
    pending = [m for m in models if m]
    chosen: set = set()
    out = []
    while pending and len(out) < limit:
        completes: dict[str, int] = {}
        wanted: dict[str, int] = {}
        for m in pending:
            unmet = [c for c in m if not c & chosen]
            for op in frozenset().union(*unmet):
                wanted[op] = wanted.get(op, 0) + 1
            for op in frozenset.intersection(*unmet):  # one of these alone meets every need left
                completes[op] = completes.get(op, 0) + 1
        best = max(sorted(wanted), key=lambda op: (completes.get(op, 0), wanted[op], not op.startswith("prims::")))
        chosen.add(best)
        done += sum(1 for m in pending if all(c & chosen for c in m))
        pending = [m for m in pending if not all(c & chosen for c in m)]
        out.append((best, done))
    return out


def report(rows: list[ModelCoverage], label: str) -> str:
    covered = sum(1 for r in rows if r.covered)
    lines = [f"{label}: {covered} of {len(rows)} models fully covered"]
    for r in rows:
        state = "covered" if r.covered else (f"lowering failed: {r.error}" if r.error else
                                             "missing " + ", ".join(f"{k} x{v}" for k, v in r.missing.items()))
        lines.append(f"  {pathlib.Path(r.path).name}: {state}")
    totals: dict[str, int] = {}
    for r in rows:
        for op in r.ops:
            totals[op] = totals.get(op, 0) + 1
    lines.append(f"ops in the lowered corpus ({len(totals)}; models using each):")
    lines += [f"  {n:4d}  {op}" for op, n in sorted(totals.items(), key=lambda kv: (-kv[1], kv[0]))]
    nxt = greedy_next([set(r.missing) for r in rows if not r.error])
    if nxt:
        lines.append("implement next (models covered after each):")
        lines += [f"  {op} -> {n} of {len(rows)}" for op, n in nxt]
    return "\n".join(lines)

