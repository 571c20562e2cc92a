"""The backend matrix: real transformers models (tools/corpus/transformers_zoo.py) exported once by
pt2b, lowered with each backend's own preset, handed to the backend and run there, compared with eager;
one process per case (tools/real_models.py's sweep, on exporter.sweep).

Stages per case: build, capture, eager, write; then per backend B: lower:B (load_for_backend(path, B)),
handoff:B (backends.to_backend), run:B, match:B. Where one of them fails, direct:B hands torch.export's
own program to the backend (which decomposes it its own way) and runs it: where that works the failure
is pt2b's (unless torch's own save/load round trip of the program fails there too: torch's), where it
fails too it is the backend's (owner:B in the record). Then fallback:B runs it split with the reference
(to_backend(..., fallback="reference"): the share the backend runs; a case lower:B refused for ops no
decomposition brings to B's list is lowered again with fallback="reference", those ops left to the
reference); a split that runs past the case's timeout leaves the owner known.

  .venv/bin/python -m tools.backend_matrix --backends onnx,openvino --out bench/records/backends@2.13.json.gz
  .venv/bin/python -m tools.backend_matrix --out bench/records/backends@2.13.json.gz --summary-only
  .venv/bin/python -m tools.backend_matrix --out ... --resume --redo   # again: pt2b's failures, timeouts
  .venv/bin/python -m tools.backend_matrix --out ... --resume --again a,b   # again: the cases named
"""

from __future__ import annotations

import argparse
import collections
import copy
import json
import os
import re
import sys
import time

from tools import real_models as rm

DEFAULT_BACKENDS = ("onnx", "openvino")
# backends compute in float32 with their own kernels (fused, reordered): results agree with eager to
# float32 rounding accumulated over a model, not to the reference runtime's 1e-4
TOLERANCE = 1e-3
# the hand-off options every user of a backend passes: LiteRT's converter takes static shapes only, so its
# users convert at fixed sizes (litert-torch converts at its sample inputs' sizes); the matrix then checks
# the compiled model at the stored example inputs' sizes, the ones it takes
HANDOFF_OPTIONS = {"litert": {"specialize": True}}


def _stages(backends) -> list[str]:
    return ["build", "capture", "eager", "write"] + [f"{s}:{b}" for b in backends for s in
                                                     ("lower", "handoff", "run", "match", "direct",
                                                      "direct_read_back", "fallback")]


def run_case(name: str, backends, conn, workdir: str) -> None:
    """The stages of one case, the record sent through ``conn`` after each."""
    rm._quiet_everything()
    import torch

    torch.set_num_threads(1)
    rec = {"name": name, "stages": {}, "owner": {}}

    def stage(key, fn):
        rec["current"] = key
        conn.send(rec)
        t0 = time.perf_counter()
        try:
            value, st, ok = fn(), {"status": "ok"}, True
        except Exception as e:  # noqa: BLE001 -- every failure is a result here
            value, st, ok = None, rm._err(e), False
            if e.__cause__ is not None or key.startswith("direct:"):  # the backend's own error, in one line
                from exporter.backends import first_line

                st["cause"] = first_line(e.__cause__ or e)[:rm.MSG_CHARS]
        st["seconds"] = round(time.perf_counter() - t0, 3)
        rec["stages"][key] = st
        rec.pop("current", None)
        conn.send(rec)
        return ok, value

    from tools.corpus.transformers_zoo import make_case

    ok, case = stage("build", lambda: make_case(name))
    if not ok:
        rec["stages"]["build"]["unavailable"] = rec["stages"]["build"].get("error_type") == "CaseUnavailable"
        return conn.send(rec)
    rec.update(model_type=case.model_type, task=case.task, params=sum(p.numel() for p in case.model.parameters()))
    eager_model = copy.deepcopy(case.model)
    args, kwargs = case.args, case.kwargs or {}

    def fresh():
        torch.manual_seed(0)
        return copy.deepcopy(args), copy.deepcopy(kwargs)

    def capture():
        from tools.corpus.programs import capture_real

        return capture_real(case, {})

    ok, ep = stage("capture", capture)
    if not ok:
        for b in backends:
            rec["owner"][b] = "torch"  # torch.export cannot capture it: no backend sees it either way
        return conn.send(rec)

    ok, ref = stage("eager", lambda: rm.run_eager(eager_model, fresh))
    if not ok:
        return conn.send(rec)

    import exporter
    from exporter import backends as registry

    path = os.path.join(workdir, re.sub(r"[^A-Za-z0-9_.-]", "_", name) + ".pt2b")
    ok, _ = stage("write", lambda: exporter.export_model(ep, path=path))
    if not ok:
        return conn.send(rec)

    from exporter.lowering.random_draws import drawn_results

    drawn = drawn_results(ep)  # outputs computed from random draws: no two generators agree on them
    if drawn.outputs:
        rec["random_outputs"] = {"leaves": sorted(drawn.outputs), "ops": list(drawn.ops)}

    def differs(out) -> str | None:
        """How ``out`` differs from eager beyond the matrix's tolerance (a leaf computed from random
        draws: in shape or dtype), or None."""
        return rm._compare_close(out, ref, max(case.rtol, TOLERANCE), max(case.atol, TOLERANCE), drawn.outputs)

    torch_differs = []  # torch.export's own module differs from eager (computed on the first mismatch)

    def torch_module_differs() -> bool:
        if not torch_differs:
            a, k = fresh()
            with torch.no_grad():
                torch_differs.append(differs(ep.module()(*a, **k)))
        return torch_differs[0] is not None

    def read_back():
        """torch.export.save + torch.export.load of the captured program (torch's own file round trip)."""
        pt2 = path[: -len(".pt2b")] + ".pt2"
        torch.export.save(ep, pt2)
        return torch.export.load(pt2)

    def matches(out):
        msg = differs(out)
        if msg:
            raise AssertionError(msg)

    def runs(compiled):
        a, k = fresh()
        with torch.no_grad():
            return compiled(*a, **k)

    splits = []  # (backend, its options, the program lowered for it or None): the splits to run
    for b in backends:
        options = HANDOFF_OPTIONS.get(b, {})
        ok, lp = stage(f"lower:{b}", lambda: exporter.load_for_backend(path, backend=b, cache=False))
        if ok:
            ok, compiled = stage(f"handoff:{b}", lambda: registry.to_backend(b, lp, **options))
        if ok and not compiled.backend.runs_here:  # (Core ML off macOS) converted and its model checked: no run here
            rec["stages"][f"run:{b}"] = {"status": "skipped", "why": f"{b} does not run on this system"}
            rec["owner"][b] = None
            continue
        if ok:
            ok, out = stage(f"run:{b}", lambda: runs(compiled))
        if ok:
            ok, _ = stage(f"match:{b}", lambda: matches(out))
        if ok:
            rec["owner"][b] = None
            continue
        # whose failure it is first (a split may run until the case's timeout, the owner still known)
        if rec["stages"].get(f"match:{b}", {}).get("status") == "fail" and torch_module_differs():
            rec["owner"][b] = "torch"  # torch.export's own ep.module() differs from eager the same way
            rec["stages"][f"match:{b}"]["torch"] = torch_differs[0][: rm.MSG_CHARS]
            continue  # (no split runs closer to eager than the program itself)
        direct_ok, _ = stage(f"direct:{b}", lambda: matches(runs(registry.to_backend(b, ep, **options))))
        if direct_ok:  # pt2b's program is read back from a file: so is torch's, through its own save/load
            read_ok, _ = stage(f"direct_read_back:{b}",
                               lambda: matches(runs(registry.to_backend(b, read_back(), **options))))
            rec["owner"][b] = "pt2b" if read_ok else "torch"
        else:
            rec["owner"][b] = "backend"
        lowered = rec["stages"].get(f"lower:{b}", {})
        if lowered.get("status") == "ok" or lowered_again_with_fallback(lowered):  # what pt2b routes around
            splits.append((b, options, lp if lowered.get("status") == "ok" else None))
    # The splits run after every backend's whole hand-off: a split may run until the case's timeout,
    # and what the other backends did is known by then.
    for b, options, lp in splits:
        def with_fallback():
            fb_lp = lp if lp is not None else exporter.load_for_backend(path, backend=b, cache=False,
                                                                        fallback="reference")
            return fallback_share(registry.to_backend(b, fb_lp, fallback="reference", **options), runs, matches,
                                  left=fb_lp.outside_opset)

        fb_ok, share = stage(f"fallback:{b}", with_fallback)
        if fb_ok:
            rec.setdefault("fallback", {})[b] = share
    conn.send(rec)


def lowered_again_with_fallback(lowered: dict) -> bool:
    """Whether a failed lower:B stage (its record) is one a lowering with fallback="reference" routes
    around: the OpsetError naming ops no decomposition brings to the backend's list."""
    return (lowered.get("status") == "fail" and lowered.get("error_type") == "OpsetError"
            and "cannot reach the accepted op set" in lowered.get("error", ""))


def fallback_share(compiled, runs, matches, left=None) -> dict:
    """A case the backend runs with fallback="reference", close to eager: the share of its op nodes and
    FLOPs the backend runs (1.0: handed over whole), the ops left to the reference, the nodes it computes
    wrong, and (``left``) the ops the lowering left to the reference (op -> call sites)."""
    matches(runs(compiled))
    share = compiled.share
    if share is None:
        return {"nodes": 1.0, "flops": 1.0, "on_reference": {}, "wrong": [], "left_by_lowering": dict(left or {})}
    return {"nodes": round(share.node_share, 4), "flops": round(share.flop_share, 4),
            "on_reference": dict(share.on_reference), "wrong": [op for _, op, _ in share.wrong],
            "left_by_lowering": dict(left or {})}


# pt2b's own stages between torch.export's capture and any backend: a case failing there fails every backend
PT2B_STAGES = ("write", "load")


def _pt2b_stage_failed(rec: dict) -> str | None:
    """The pt2b stage (PT2B_STAGES) a captured case failed at before any backend saw it, or None."""
    if rec["stages"].get("capture", {}).get("status") != "ok":
        return None
    return next((k for k in PT2B_STAGES if rec["stages"].get(k, {}).get("status") == "fail"), None)


def _plain(text: str) -> str:
    """An error text without what differs between machines and runs: a temporary artifact's path (FILE),
    the folder holding site-packages, an object's address."""
    text = re.sub(r"\S*/\.?[\w.@-]+?\.pt2b(\.\w+\.tmp)?", "FILE", text)
    text = re.sub(r"(?:/[\w.@+-]+)+/site-packages/", "site-packages/", text)
    return re.sub(r" at 0x[0-9a-f]+", "", text)


def failure_key(rec: dict, b: str) -> str:
    """Where and why backend ``b`` failed on a case, in one line: the stage and the backend's reason, or
    for a lowering the ops that could not reach the backend's op set."""
    stage = _pt2b_stage_failed(rec)
    if stage is not None:
        st = rec["stages"][stage]
        return re.sub(r"\s+", " ", f"{stage}: {_plain(st.get('cause') or st.get('error', ''))}")[:200]
    for k, st in rec["stages"].items():
        if k.endswith(f":{b}") and st.get("status") == "fail":
            text = _plain(st.get("cause") or st.get("error_key") or st.get("error", ""))
            ops = re.findall(r"^\s+(\S+::\S+) \(\d+ call sites\)", st.get("error", ""), re.M)
            if k.startswith("lower:") and ops:
                text = "cannot reach the backend's ops: " + ", ".join(ops)
            return re.sub(r"\s+", " ", f"{k}: {text}")[:200]
    return "?"


def owner(rec: dict, b: str):
    """Whose failure a case's backend ``b`` run is: None (it ran close to eager), "torch" (torch.export
    cannot capture it, its own ep.module() differs from eager as the backend's result does, or the
    backend takes torch's program in memory but not once torch's own save/load read it back), "pt2b" (the backend runs
    torch.export's own program, or pt2b did not write or read back the captured program), "backend" (it fails that
    too, or crashed or hung the process in its own stages), or "?" (not run)."""
    if b in rec.get("owner", {}):
        return rec["owner"][b]
    if _pt2b_stage_failed(rec) is not None:  # pt2b did not write or read back what torch.export captured
        return "pt2b"
    failed = [k for k, st in rec["stages"].items() if k.endswith(f":{b}") and st.get("status") == "fail"]
    if failed and failed[0].startswith(("handoff:", "run:", "direct:")):
        return "backend"  # the backend crashed or hung its process (a signal, the timeout)
    return "pt2b" if failed else "?"


def redo(rec: dict, backends) -> bool:
    """Whether ``--redo`` runs a case again: a backend failed on it as pt2b's, did not run it ('?'), or
    a stage hit the timeout. A case torch.export cannot capture is not run again."""
    if rec["stages"].get("capture", {}).get("status") != "ok":
        return False
    return any(owner(rec, b) in ("pt2b", "?") for b in backends) or any(
        "timeout" in str(st.get("error", "")) for st in rec["stages"].values())


def run_again(resume: dict, backends, redo_failed: bool, named) -> set[str]:
    """The recorded cases a resumed sweep runs again: ``named`` (after a fix for them landed), and with
    ``redo_failed`` those ``redo`` picks. A name with no record is run anyway, as a new case."""
    again = {n.strip() for n in named if n.strip() and n.strip() in resume}
    if redo_failed:
        again |= {n for n, r in resume.items() if redo(r, backends)}
    return again


def summarize(records: list[dict], backends, file=sys.stdout) -> dict:
    """Per backend: cases run through pt2b and close to eager, of those torch.export captures; the
    failures grouped by owner and error."""
    captured = [r for r in records if r["stages"].get("capture", {}).get("status") == "ok"]
    built = [r for r in records if r["stages"].get("build", {}).get("status") == "ok"]
    out = {}
    for b in backends:
        ran = [r for r in captured if b in r.get("owner", {}) or any(k.endswith(f":{b}") for k in r["stages"])
               or _pt2b_stage_failed(r) is not None]
        owners = collections.Counter(owner(r, b) for r in ran)
        groups = collections.defaultdict(list)  # (owner, where and why) -> case names
        for r in ran:
            who = owner(r, b)
            if who is not None:
                groups[(who, failure_key(r, b))].append(r["name"])
        # the cases that failed whole but run close to eager split with the reference (fallback="reference"),
        # the backend running most of the model; those where the reference runs most are counted apart
        split = [r for r in ran if owner(r, b) is not None and b in r.get("fallback", {})]
        with_fallback = [r for r in split if backend_share(r["fallback"][b]) >= MOSTLY]
        out[b] = {"built": len(built), "captured_by_torch": len(captured), "captured": len(ran), "ok": owners[None], "pt2b_fails": owners["pt2b"],
                  "backend_fails": owners["backend"], "torch_fails": owners["torch"], "groups": dict(groups),
                  "with_fallback": len(with_fallback), "mostly_reference": len(split) - len(with_fallback)}
        print(f"{b}: {owners[None]} of {len(ran)} captured cases run through pt2b close to eager, "
              f"{len(with_fallback)} more with fallback, {len(split) - len(with_fallback)} more with the reference "
              f"running most ({owners['pt2b']} pt2b's failures, {owners['backend']} the backend's, "
              f"{owners['torch']} torch's)", file=file)
        for (who, key), names in sorted(groups.items(), key=lambda kv: -len(kv[1]))[:12]:
            print(f"   {len(names):4d}  [{who}] {key[:160]}", file=file)
    return out


# a case run split counts as run with fallback where the backend runs at least this share of its FLOPs
# (of its op nodes where the FLOPs were not counted): below it the model runs mostly on the reference
MOSTLY = 0.5


def backend_share(fallback: dict) -> float:
    """The share of a split case's FLOPs the backend runs (its op nodes' where the record has no FLOPs)."""
    return fallback.get("flops", fallback.get("nodes", 0.0))


def markdown(data: dict) -> str:
    """docs/results/backends.md: the counts per backend and every failure group with its owner."""
    import io

    records, backends = data["records"], data["meta"].get("backends", list(DEFAULT_BACKENDS))
    counts = summarize(records, backends, file=io.StringIO())
    commits = sorted({c for r in records for c in r.get("pt2b", "?").split(", ")})
    files = data["meta"].get("files", ["FILE"])
    command = f"--out {files[0]}" + (f" --also {' '.join(files[1:])}" if files[1:] else "")
    planned = data["meta"].get("cases", len(records))
    lines = ["# The backend matrix", "",
             f"Written by `python -m tools.backend_matrix {command} --markdown` over {len(records)} cases of the "
             f"real-model corpus" + (f" (of the {planned} the sweep runs)" if planned > len(records) else "")
             + f", one sweep per backend (pt2b {', '.join(commits)}): each "
             "case exported once by pt2b, lowered with the backend's preset, handed over, run and compared with "
             "eager within 1e-3. A failure is pt2b's where the backend runs torch.export's own program, the "
             "backend's where it fails on that too (or crashes), torch's where torch.export cannot capture the "
             "model, its own `ep.module()` differs from eager as the backend's result does, or the backend takes "
             "torch's program in memory but not once `torch.export.save`/`load` read it back.", "",
             "A failing case is tried once more with `to_backend(..., fallback=\"reference\")` (one whose lowering "
             "was refused for ops no decomposition brings to the backend's list is first lowered again with "
             "`load_for_backend(..., fallback=\"reference\")`, those ops left to the reference): \"more with "
             "fallback\" counts those that then run close to eager, split between the backend and the reference, the "
             f"backend running at least {MOSTLY:.0%} of the FLOPs; \"the reference runs most\" those that run close "
             "to eager with the backend running less (counted among the failures too).",
             "", *(["Hand-off options every user of a backend passes, used in every hand-off to it here: "
                    + "; ".join(f"{b}: " + ", ".join(f"`{k}={v!r}`" for k, v in o.items())
                                for b, o in HANDOFF_OPTIONS.items() if b in backends) + ".", ""]
                   if any(b in backends for b in HANDOFF_OPTIONS) else []),
             "| backend | run close to eager | more with fallback | the reference runs most | of captured | pt2b's "
             "failures | the backend's failures | torch's |",
             "|---|---|---|---|---|---|---|---|"]
    # backends that do not run on the machine of the sweep (Core ML off macOS): their cases converted, not run
    skipped = {b for r in records for b in backends if r["stages"].get(f"run:{b}", {}).get("status") == "skipped"}
    for b in backends:
        c = counts[b]
        ok = f"{c['ok']} (converted: no run here)" if b in skipped else c["ok"]
        # a sweep made before the matrix tried fallback has no fallback stage: not tried, rather than none
        tried = any(f"fallback:{b}" in r["stages"] for r in records)
        fallback = (c["with_fallback"], c["mostly_reference"]) if tried else ("not tried", "not tried")
        lines.append(f"| {b} | {ok} | {fallback[0]} | {fallback[1]} | {c['captured']} | {c['pt2b_fails']} | "
                     f"{c['backend_fails']} | {c['torch_fails']} |")
    built = counts[backends[0]]["built"] if backends else 0
    lines += ["", f"{built} cases built offline; {built - counts[backends[0]]['captured_by_torch']} of them torch.export "
                  "does not capture (owner: torch).", ""]
    random = sorted(r["name"] for r in records if r.get("random_outputs"))
    if random:
        lines += [f"{len(random)} case(s) return values computed from random draws ({', '.join(random)}): those "
                  "values are compared with eager by shape and dtype only, as the hand-off check compares them "
                  "(a backend's generator is not torch's), the others as always.", ""]
    by_name = {r["name"]: r for r in records}
    for b in backends:
        lines += [f"## {b}: the failures", "",
                  "\"run with fallback\": of the group's cases, those `fallback=\"reference\"` runs close to eager "
                  "(the backend running at least half of the FLOPs, and in all).", "",
                  "| cases | owner | run with fallback | where and why (first case) |", "|---|---|---|---|"]
        groups = {k: v for k, v in counts[b]["groups"].items() if k[0] != "?"}
        for (who, key), names in sorted(groups.items(), key=lambda kv: -len(kv[1])):
            shown = ", ".join(names[:4]) + (f" and {len(names) - 4} more" if len(names) > 4 else "")
            split = [by_name[n]["fallback"][b] for n in names if b in by_name[n].get("fallback", {})]
            mostly = sum(backend_share(f) >= MOSTLY for f in split)
            lines.append(f"| {len(names)} | {who} | {mostly} ({len(split)}) | `{key.replace('|', '/')}` ({shown}) |")
        lines.append("")
    return "\n".join(lines)


def merged(paths: list[str]) -> dict:
    """Record files of the same cases through different backends, merged case by case."""
    out = {"meta": {"backends": [], "cases": 0, "files": paths}, "records": []}
    by_name: dict = {}
    for path in paths:
        with rm._open_json(path) as f:
            data = json.load(f)
        found = data["meta"].get("backends") or sorted({k.split(":", 1)[1] for r in data["records"] for k in r["stages"]
                                                        if k.startswith("lower:")})  # (a sweep still running)
        out["meta"]["backends"] += [b for b in found if b not in out["meta"]["backends"]]
        out["meta"]["cases"] = max(out["meta"]["cases"], data["meta"].get("cases", 0))
        for rec in data["records"]:
            have = by_name.get(rec["name"])
            by_name[rec["name"]] = rm.merge_record(have, rec) if have is not None else rm.merge_record(rec, {})
    out["records"] = list(by_name.values())
    return out


def _place(text: str) -> tuple[str, str]:
    """--python's BACKEND=PYTHON as (backend, python)."""
    backend, sep, python = text.partition("=")
    if not sep or not backend or not python:
        raise SystemExit(f"--python {text!r}: give BACKEND=PYTHON, e.g. executorch=/opt/venvs/executorch/bin/python")
    return backend.strip(), python.strip()


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m tools.backend_matrix", description=__doc__.splitlines()[0])
    ap.add_argument("--backends", default=",".join(DEFAULT_BACKENDS))
    ap.add_argument("--only", help="comma-separated case names")
    ap.add_argument("--sample", action="store_true", help="the default test sample (transformers_sample.txt)")
    ap.add_argument("--limit", type=int)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--ray", metavar="ADDRESS", help="run the cases on the Ray cluster at ADDRESS ('auto': the one this "
                                                      "machine is part of)")
    ap.add_argument("--python", action="append", default=[], metavar="BACKEND=PYTHON",
                    help="run BACKEND's stages with the python of the venv it is installed in, a case of their own "
                         "per model (on Ray: on the nodes that offer the resource backend_BACKEND); repeatable")
    ap.add_argument("--timeout", type=float, default=600.0)
    ap.add_argument("--out", default="/tmp/backend_matrix.json.gz")
    ap.add_argument("--resume", action="store_true")
    ap.add_argument("--redo", action="store_true",
                    help="with --resume: run again the cases some backend failed on as pt2b's, not at all ('?'), "
                         "or by the timeout (a sweep resumed on newer code, or after a pause)")
    ap.add_argument("--again", default="", metavar="CASES",
                    help="with --resume: comma-separated cases to run again whatever their records say (a fix "
                         "for them landed)")
    ap.add_argument("--summary-only", action="store_true")
    ap.add_argument("--markdown", action="store_true", help="print docs/results/backends.md of --out and exit")
    ap.add_argument("--also", nargs="*", default=[], metavar="FILE",
                    help="with --summary-only/--markdown: more record files (other backends, run in their own "
                         "venvs), merged case by case")
    args = ap.parse_args(argv)
    backends = [b.strip() for b in args.backends.split(",") if b.strip()]
    places = dict(_place(p) for p in args.python)
    if args.summary_only or args.markdown:
        data = merged([args.out, *args.also])
        if args.markdown:
            print(markdown(data))
            return 0
        summarize(data["records"], data["meta"].get("backends", backends))
        return 0
    zoo = rm._preload()
    from exporter import backends as registry

    for b in backends:
        if b not in places:  # (a backend of another venv is read there)
            registry.get(b)  # installed, and its op list read once before the children fork
    if args.only:
        names = [n.strip() for n in args.only.split(",") if n.strip()]
    elif args.sample:
        from tools.corpus.programs import transformers_sample

        names = transformers_sample()
    else:
        names = zoo.case_names()
    names = names[: args.limit] if args.limit else names
    resume, again = None, set()
    if args.resume and os.path.exists(args.out):
        with rm._open_json(args.out) as f:
            resume = {r["name"]: r for r in json.load(f)["records"]}
        again = run_again(resume, backends, args.redo, args.again.split(","))
        resume = {n: r for n, r in resume.items() if n not in again}
    log_dir = args.out + ".logs"
    os.makedirs(log_dir, exist_ok=True)
    rm.STAGE_ORDER[:] = _stages(backends)
    print(f"{len(names)} cases through {', '.join(backends)}, {args.workers} workers, out {args.out}", flush=True)
    records, wall = rm.sweep(names, workers=args.workers, timeout=args.timeout, stop_after=None, out_path=args.out,
                             log_dir=log_dir, resume=resume, redo=again, backends=backends, ray=args.ray,
                             places=places)
    with rm._open_json(args.out) as f:
        data = json.load(f)
    data["meta"]["backends"] = backends
    with rm._open_json(args.out, "w") as f:
        json.dump(data, f, indent=1)
    summarize([records[n] for n in names if n in records], backends)
    print(f"\n{wall:.0f} s. JSON: {args.out}  logs: {log_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
