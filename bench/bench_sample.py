"""The held-apart sample (bench/sample_models.py) measured against torch's anchors, each model in its own
process with a timeout: the default core lowering, its validation and the save, per model and worst case.

Usage: python bench/bench_sample.py [--n 30] [--seed 0] [--decoders 2] [--big] [--repeat 3]
                                    [--timeout 900] [--out sample.json [--resume | --report]]
                                    [--no-profile] [--models A,B]
Per model, in one process, pt2b and its anchor measured in turns (bench_pt2b.interleaved):
- lowering: load_for_backend(path, "core", cache=False), the default (validated) and validate=False,
  against torch.export.load + run_decompositions() (torch's core ATen);
- validation: the seconds of the lowering's validate stage (exporter/lowering/pipeline.py's
  ``validated``, timed around it) against the whole validate=False lowering;
- save: export_model(ep, path) against torch.export.save(ep, path).
With profiling (the default) one more default lowering runs its validate stage under cProfile, and
where that time goes is summed by what it does (source runs, lowered runs, op-by-op checks, diagnosis).
Candidates that cannot be built or captured are dropped with the reason and the next of the same library
drawn; --n counts the fp32 models measured, --decoders the bf16 transformers decoders, --big adds the
0.6B bf16 decoder. --models measures the named candidates instead of a draw.
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import json
import os
import pstats
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

# (what the validate stage does, the functions whose time is that) in exporter/lowering/validate.py and
# repair.py; a name not found counts nothing, and the stage's time left over is reported as "other"
PARTS = (
    ("source program on the stored inputs (recording the decomposed ops' calls)", [("validate.py", "record")]),
    ("source program, other runs (derived input, second seed)", [("validate.py", "__call__", "_run")]),
    ("lowered program runs", [("validate.py", "__call__", "validate")]),
    ("runners' setup (binding the signatures)", [("validate.py", "__init__", "_run"),
                                                 ("validate.py", "__init__", "validate")]),
    ("derived input made (permuting the inputs)", [("op_checks.py", "permuted", "_run")]),
    ("derived input op by op: fake runs (value_free)", [("op_checks.py", "value_free", "_derived_at_ops")]),
    ("derived input op by op: traces and checks", [("op_checks.py", "check_call", "_derived_at_ops")]),
    ("output comparison", [("op_checks.py", "compare", "validate")]),
    ("op by op, no program run (the runs estimated to cost more than the lowering)", [("op_checks.py", "check_calls")]),
    ("the runs' estimate (run_cost)", [("run_cost.py", "program_work", "_by_ops")]),
    ("diagnosis after a failure (per-op checks, the widened or perturbed run, keep-all lowering, bisection, repair)",
     [("validate.py", "right_where_they_run"), ("validate.py", "rounding_explains"),
      ("validate.py", "amplification_explains"), ("repair.py", "_validates_keeping"), ("repair.py", "_responsible"),
      ("repair.py", "_repaired")]),
    ("which decompositions applied, bounds", [("validate.py", "applied_decompositions"),
                                              ("validate.py", "bounds_for")]),
)


# ------------------------------------------------------------------------------------------------
# One model (the child process)
# ------------------------------------------------------------------------------------------------

@contextlib.contextmanager
def stage_timers(profile: cProfile.Profile | None = None):
    """Within: the lowering's lower and validate stages (pipeline.lower, pipeline.validated) timed into
    the lists yielded, the validate stage run under ``profile`` where given."""
    from exporter.lowering import pipeline

    times = {"lower": [], "validate": []}
    saved = {k: getattr(pipeline, k) for k in ("lower", "validated")}

    def timed(key, fn, prof=None):
        def run(*a, **k):
            t = time.perf_counter()
            try:
                if prof is None:
                    return fn(*a, **k)
                return prof.runcall(fn, *a, **k)
            finally:
                times[key].append(time.perf_counter() - t)
        return run

    pipeline.lower = timed("lower", saved["lower"])
    pipeline.validated = timed("validate", saved["validated"], profile)
    try:
        yield times
    finally:
        for k, fn in saved.items():
            setattr(pipeline, k, fn)


def summarize_profile(prof: cProfile.Profile, total: float) -> dict:
    """The profiled validate stage's seconds by PARTS (cumulative, per caller where PARTS names one),
    the rest as "other", and its ten costliest functions by cumulative time."""
    stats = pstats.Stats(prof).stats
    parts = {}
    for label, funcs in PARTS:
        secs = 0.0
        for spec in funcs:
            suffix, name, caller = (*spec, None)[:3]
            for (file, _, fn), (_, _, _, ct, callers) in stats.items():
                if fn != name or not file.endswith(os.sep + suffix):
                    continue
                if caller is None:
                    secs += ct
                else:
                    secs += sum(c[3] for (cf, _, cfn), c in callers.items() if cfn == caller)
        parts[label] = secs
    parts["other"] = max(0.0, total - sum(parts.values()))
    top = sorted(((ct, f"{os.path.relpath(file, ROOT) if file.startswith(ROOT) else os.path.basename(file)}:{fn}")
                  for (file, _, fn), (_, _, _, ct, _) in stats.items()), reverse=True)
    return {"seconds": total, "parts": parts, "top": [(name, ct) for ct, name in top[1:11]]}


def measure(name: str, repeat: int, profile: bool, tmp: str, save_only: bool = False) -> dict:
    """One candidate built, captured and measured (seconds, pt2b first, anchor second); dropped with the
    reason where it cannot be built or captured. ``save_only``: the save alone."""
    import torch

    from bench.bench_pt2b import interleaved
    from bench.sample_models import SampleRefused, build
    from exporter import export_model, load_for_backend

    rec = {"name": name, "seconds": {}, "ratios": {}}
    t = time.perf_counter()
    try:
        built = build(name)
    except SampleRefused as e:
        return {**rec, "dropped": f"not built: {e}"}
    except Exception as e:  # noqa: BLE001 -- a model its own library cannot build here is dropped with the reason
        return {**rec, "dropped": f"not built: {type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"}
    rec.update(params=built.params, dtype=built.dtype, build_s=time.perf_counter() - t)
    t = time.perf_counter()
    try:
        ep = torch.export.export(built.model, built.args, built.kwargs)
    except Exception as e:  # noqa: BLE001 -- what torch.export cannot capture is dropped with the reason
        first = str(e).strip().splitlines()[0][:200] if str(e).strip() else ""
        return {**rec, "dropped": f"torch.export cannot capture it: {type(e).__name__}: {first}"}
    rec["export_s"] = time.perf_counter() - t
    del built
    pt2, pt2b = os.path.join(tmp, "m.pt2"), os.path.join(tmp, "m.pt2b")
    rec["seconds"]["save"] = interleaved([lambda: export_model(ep, path=pt2b), lambda: torch.export.save(ep, pt2)],
                                         repeat)
    rec["bytes"] = os.path.getsize(pt2b)
    del ep
    if save_only:
        rec["ratios"] = {k: o / a for k, (o, a) in rec["seconds"].items() if a}
        return rec
    try:
        torch.export.load(pt2).run_decompositions()
    except Exception as e:  # noqa: BLE001 -- torch's own lowering fails: nothing to compare with
        rec["skipped"] = f"torch's run_decompositions fails: {type(e).__name__}: {str(e)[:200]}"
        return rec
    try:
        first = load_for_backend(pt2b, "core", cache=False)
    except Exception as e:  # noqa: BLE001 -- the default lowering fails: reported, the rest timed
        rec["default_error"] = f"{type(e).__name__}: {str(e)[:300]}"
        first = None
    if "default_error" not in rec:
        v = first.validation
        rec["validation"] = {"status": v.status, "verdict": v.verdict, "derived": v.derived, "inputs": v.inputs,
                             "max_rel": v.max_rel, "bound": v.bound, "amplified": bool(v.amplified),
                             "describe": v.describe()}
        first = None  # (its memory freed before the timed runs)
        with stage_timers() as stages:
            default, unvalidated, torchs = interleaved(
                [lambda: load_for_backend(pt2b, "core", cache=False),
                 lambda: load_for_backend(pt2b, "core", cache=False, validate=False),
                 lambda: torch.export.load(pt2).run_decompositions()], repeat)
        rec["seconds"]["lower_default"] = (default, torchs)
        rec["seconds"]["lower_unvalidated"] = (unvalidated, torchs)
        rec["seconds"]["validation"] = (statistics.median(stages["validate"]), unvalidated)
        rec["lower_stage_s"] = statistics.median(stages["lower"])
    else:
        rec["seconds"]["lower_unvalidated"] = tuple(interleaved(
            [lambda: load_for_backend(pt2b, "core", cache=False, validate=False),
             lambda: torch.export.load(pt2).run_decompositions()], repeat))
    rec["ratios"] = {k: o / a for k, (o, a) in rec["seconds"].items() if a}
    if profile and "default_error" not in rec:
        prof = cProfile.Profile()
        with stage_timers(prof) as stages:
            with contextlib.suppress(Exception):
                load_for_backend(pt2b, "core", cache=False)
        if stages["validate"]:
            rec["profile"] = summarize_profile(prof, stages["validate"][0])
    return rec


# ------------------------------------------------------------------------------------------------
# The sample (the parent process)
# ------------------------------------------------------------------------------------------------

def run_one(name: str, repeat: int, profile: bool, timeout: float, save_only: bool = False) -> dict:
    """``measure(name)`` in a fresh interpreter, killed past ``timeout`` seconds (then dropped)."""
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "rec.json")
        cmd = [sys.executable, os.path.abspath(__file__), "--one", name, "--repeat", str(repeat), "--record", out]
        if not profile:
            cmd.append("--no-profile")
        if save_only:
            cmd.append("--save-only")
        env = {**os.environ, "PT2B_CACHE": "0", "TMPDIR": tmp}
        t = time.perf_counter()
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env, cwd=ROOT)
        except subprocess.TimeoutExpired:
            return {"name": name, "seconds": {}, "ratios": {}, "dropped": f"timed out after {timeout:.0f} s"}
        if os.path.exists(out):
            with open(out) as f:
                rec = json.load(f)
        else:
            tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
            rec = {"name": name, "seconds": {}, "ratios": {}, "dropped": f"the process failed (rc {proc.returncode}): "
                                                                          f"{tail[0][:200]}"}
        rec["wall_s"] = time.perf_counter() - t
        return rec


def sample(args) -> list[dict]:
    """The records of the sample, drawn library by library (detection first, the 0.6B decoder before
    timm, timm last: a library whose candidates run out hands the rest of its quota to timm), dropped
    candidates included."""
    from bench.sample_models import draw, quotas

    done = {}
    if args.resume and args.out and os.path.exists(args.out):
        with open(args.out) as f:
            done = {r["name"]: r for r in json.load(f)["records"]}
    records = []

    def one(name, repeat=args.repeat, timeout=args.timeout):
        rec = done.get(name) or _progress(run_one(name, repeat, not args.no_profile, timeout, args.save_only))
        records.append(rec)
        if args.out:  # written after each model: a run cut short keeps what it measured
            _write(args, records, {})
        return rec

    if args.models:
        for n in [n for n in args.models.split(",") if n]:
            one(n)
        return records
    order = draw(args.seed)
    want = quotas(args.n) if args.n else {}
    want["transformers"] = args.decoders
    carry = 0
    for lib in ("torchvision-detection", "torchvision", "diffusers", "transformers", "big", "timm"):
        if lib == "big":
            if args.big:
                one("big/decoder-0.6b@bf16", 1, 3 * args.timeout)
            continue
        need = want.get(lib, 0) + (carry if lib == "timm" else 0)
        got, tries = 0, 0
        for name in order[lib]:
            if got >= need or tries >= 3 * need + 10:
                break
            tries += 1
            got += "dropped" not in one(name)
        if lib != "transformers":
            carry += need - got if lib != "timm" else 0
    return records


def _progress(rec: dict) -> dict:
    why = rec.get("dropped")
    r = rec.get("ratios", {})
    print(f"  {rec['name']}: " + (f"dropped: {why}" if why else ", ".join(f"{k} {v:.3f}" for k, v in r.items()))
          + f" ({rec.get('wall_s', 0):.0f} s)", file=sys.stderr, flush=True)
    return rec


COLUMNS = (("lower_default", "default lowering / torch"), ("lower_unvalidated", "validate=False / torch"),
           ("validation", "validation / validate=False lowering"), ("save", "save / torch.export.save"))


def report(records: list[dict]) -> dict:
    """Prints the per-model table, each ratio's worst case and geometric mean, the dropped candidates and
    where validation's time goes on the five models where it costs most; returns the summary."""
    kept = [r for r in records if "dropped" not in r]
    print(f"\n## held-apart sample: {len(kept)} models measured, {len(records) - len(kept)} dropped\n")
    print("| model | params | dtype | " + " | ".join(label for _, label in COLUMNS)
          + " | default / validate=False / torch (s) | validation |")
    print("|---|---|---|" + "---|" * len(COLUMNS) + "---|---|")
    for r in kept:
        cells = [f"{r['ratios'][k]:.2f}" if k in r["ratios"] else "n/a" for k, _ in COLUMNS]
        s = r["seconds"]
        secs = (f"{s['lower_default'][0]:.2f} / {s['lower_unvalidated'][0]:.2f} / {s['lower_default'][1]:.2f}"
                if "lower_default" in s else r.get("skipped") or r.get("default_error", "")[:80])
        v = r.get("validation", {})
        what = f"{v.get('status', '')} {v.get('verdict', '')} {v.get('derived', '')}".strip()
        what += " (amplified)" if v.get("amplified") else ""
        print(f"| {r['name']} | {r.get('params', 0) / 1e6:.1f}M | {r.get('dtype', '')} | " + " | ".join(cells)
              + f" | {secs} | {what} |")
    summary = {}
    print()
    for key, label in COLUMNS:
        vals = sorted(((r["ratios"][key], r["name"]) for r in kept if key in r["ratios"]), reverse=True)
        if not vals:
            continue
        geo = statistics.geometric_mean([v for v, _ in vals])
        summary[key] = {"geomean": geo, "worst": vals[0][0], "worst_model": vals[0][1], "n": len(vals),
                        "over_1": [n for v, n in vals if v > 1.0]}
        print(f"{label}: geometric mean {geo:.3f}, worst {vals[0][0]:.3f} ({vals[0][1]}), "
              f"{len(summary[key]['over_1'])} of {len(vals)} above 1.0 (n={len(vals)})")
    dropped = [r for r in records if "dropped" in r]
    if dropped:
        print("\ndropped:")
        for r in dropped:
            print(f"  {r['name']}: {r['dropped']}")
    costly = sorted((r for r in kept if "profile" in r and "validation" in r["ratios"]),
                    key=lambda r: r["ratios"]["validation"], reverse=True)[:5]
    for r in costly:
        p = r["profile"]
        print(f"\n### where validation's time goes: {r['name']} (validation {r['ratios']['validation']:.2f}x "
              f"the validate=False lowering; {p['seconds']:.2f} s under cProfile)")
        for label, secs in sorted(p["parts"].items(), key=lambda kv: -kv[1]):
            if secs >= 0.005:
                print(f"  {secs:7.2f} s {100 * secs / p['seconds']:5.1f}%  {label}")
        print("  costliest functions (cumulative): " + ", ".join(f"{n} {s:.2f}" for n, s in p["top"][:6]))
    return summary


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=30, help="fp32 models to measure (dropped ones not counted)")
    ap.add_argument("--seed", type=int, default=0, help="the draw's seed: the same seed, the same sample")
    ap.add_argument("--decoders", type=int, default=2, help="bf16 transformers decoders to measure")
    ap.add_argument("--big", action="store_true", help="also the 0.6B bf16 decoder")
    ap.add_argument("--repeat", type=int, default=3, help="rounds of each measure (medians)")
    ap.add_argument("--timeout", type=float, default=900, help="seconds a model may take (the 0.6B decoder: 3x)")
    ap.add_argument("--out", help="write the records and the summary as JSON here")
    ap.add_argument("--models", default="", help="comma-separated candidate names instead of a draw")
    ap.add_argument("--resume", action="store_true", help="reuse the records --out holds already, by name")
    ap.add_argument("--report", action="store_true", help="print the report of the records --out holds; run nothing")
    ap.add_argument("--no-profile", action="store_true", help="skip the profiled validation run")
    ap.add_argument("--save-only", action="store_true", help="measure the save alone (its column of the report)")
    ap.add_argument("--one", help=argparse.SUPPRESS)
    ap.add_argument("--record", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.n < 0 or args.decoders < 0 or args.repeat < 1 or args.timeout <= 0:
        ap.error("--n and --decoders must be >= 0, --repeat >= 1 and --timeout > 0")
    if args.one:
        with tempfile.TemporaryDirectory() as tmp:
            rec = measure(args.one, args.repeat, not args.no_profile, tmp, args.save_only)
        with open(args.record, "w") as f:
            json.dump(rec, f)
        return 0
    if args.report:
        with open(args.out) as f:
            report(json.load(f)["records"])
        return 0
    records = sample(args)
    summary = report(records)
    if args.out:
        _write(args, records, summary)
    return 0


def _write(args, records: list[dict], summary: dict) -> None:
    with open(args.out, "w") as f:
        json.dump({"seed": args.seed, "n": args.n, "decoders": args.decoders, "repeat": args.repeat,
                   "records": records, "summary": summary}, f, indent=1)


if __name__ == "__main__":
    sys.exit(main())
