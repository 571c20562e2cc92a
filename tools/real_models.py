"""Sweep real transformers models (tools/corpus/transformers_zoo.py) through the pt2b pipeline, one process per case
(exporter.sweep: here or on a Ray cluster, resumed from <out>.jsonl).

Stages per case: build, capture (torch.export, dynamic then static), eager, write, load (+ bitwise round trip vs
ep.module()), then per preset none/core/max: lower (load_for_backend), run (runtime_ref.Runtime), match (vs eager).
Writes one JSON record per case (--out) and prints a summary plus the distinct failures grouped with counts.

  .venv/bin/python -m tools.real_models --stages capture              # what torch.export itself captures
  .venv/bin/python -m tools.real_models --only llama,t5/seq2seq,vit    # full pipeline on a few cases
"""

from __future__ import annotations

import argparse
import collections
import copy
import gzip
import json
import os
import re
import subprocess
import sys
import tempfile
import time
import traceback

os.environ["PT2B_CACHE"] = "off"
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

PRESETS = ("none", "core", "max")
STAGE_ORDER = ["build", "capture", "routes", "eager", "write", "load", "bitwise"] + \
    [f"{what}:{p}" for p in PRESETS for what in ("lower", "run", "match", "torch")] + ["table:core"]
# "table:core": the core lowering written, loaded and planned by runtime_ref straight from the graph
# table where it can, its outputs bitwise those of the plan from the program
# "torch:<preset>" runs only where pt2b's lower/run/match failed: torch's own run_decompositions with the
# preset's table, run and compared with eager; where it fails too the failure is torch's limitation
# "ratio": build, capture, write, then only the ratio:core timing (one untimed lowering first, as the
# full pipeline's lowerings warm the tracing machinery before it): the per-model ratios of a corpus
# whose other stages were swept before
# "routes": build, capture, then only the opset explorer's routes of the captured program (what
# tools/explorer_data.py --sweep ships as the page's full corpus); no other stage
STOP_AFTER = {"build": "build", "capture": "capture", "routes": "routes", "eager": "eager", "write": "write",
              "load": "bitwise",
              "ratio": "ratio:core",
              "all": None}
MSG_CHARS = 300
# "ratio:core" (after the core lowering): torch's load + run_decompositions timed beside pt2b's cold core
# lowering, for the per-model ratio; on in the sweep (off with --no-ratios), off where tests call run_case
RATIOS = False
# address-space limit of one case's process: a program that asks for more (a decomposition that
# materializes a huge broadcast) fails with torch's allocation error instead of being killed
MEMORY_LIMIT_GB = 10


# ------------------------------------------------------------------------------------------------
# Child side: one case
# ------------------------------------------------------------------------------------------------

def _quiet_everything():
    import logging
    import warnings

    warnings.filterwarnings("ignore")
    logging.disable(logging.WARNING)
    try:
        from transformers.utils import logging as hf_logging

        hf_logging.set_verbosity_error()
        hf_logging.disable_progress_bar()
    except Exception:
        pass


_BOILERPLATE = [re.compile(r"\(accepted: [^)]*\)"), re.compile(r"Set TORCH_LOGS=[^\n]*"),
                re.compile(r"For more information[^\n]*")]


def _err(e: BaseException) -> dict:
    msg = str(e).strip()
    st = {"status": "fail", "error_type": type(e).__name__, "error": msg[:MSG_CHARS]}
    key = msg
    for rx in _BOILERPLATE:
        key = rx.sub("", key)
    key = re.sub(r"\s+", " ", key).strip()
    if key[:MSG_CHARS] != msg[:MSG_CHARS]:
        st["error_key"] = key[:MSG_CHARS]  # the message without boilerplate, used to group failures
    return st


def _leaves(out):
    import torch.utils._pytree as pytree

    return pytree.tree_flatten(out)[0]


def _aligned(out, ref) -> tuple[list, list]:
    """The leaves of ``out`` and ``ref``, paired: by key path where both hold the same paths in another
    order (a ModelOutput rebuilt from its keys, as a program's module rebuilds it, orders them as its
    fields, eager as the model set them), in flattening order otherwise."""
    lo, lr, _ = _aligned_at(out, ref)
    return lo, lr


def _aligned_at(out, ref) -> tuple[list, list, list]:
    """_aligned, and for each pair the position of its ``out`` leaf in ``out``'s flattening order."""
    import torch.utils._pytree as pytree

    lo, lr = _leaves(out), _leaves(ref)
    at = list(range(len(lo)))
    try:
        ko = [pytree.keystr(path) for path, _ in pytree.tree_flatten_with_path(out)[0]]
        kr = [pytree.keystr(path) for path, _ in pytree.tree_flatten_with_path(ref)[0]]
    except Exception:  # noqa: BLE001 -- (a class registered without keys: its leaves in order)
        return lo, lr, at
    if ko != kr and len(ko) == len(lo) and sorted(ko) == sorted(kr) and len(set(ko)) == len(ko):
        index = {k: i for i, k in enumerate(ko)}
        at = [index[k] for k in kr]
        lo = [lo[i] for i in at]
    return lo, lr, at


def _compare_bitwise(a, b) -> str | None:
    import torch

    la, lb = _aligned(a, b)
    if len(la) != len(lb):
        return f"output leaf count differs: {len(la)} vs {len(lb)}"
    for i, (x, y) in enumerate(zip(la, lb)):
        if torch.is_tensor(x) or torch.is_tensor(y):
            if not (torch.is_tensor(x) and torch.is_tensor(y)):
                return f"leaf {i}: tensor vs {type(y).__name__ if torch.is_tensor(x) else type(x).__name__}"
            if x.shape != y.shape or x.dtype != y.dtype:
                return f"leaf {i}: {tuple(x.shape)}/{x.dtype} vs {tuple(y.shape)}/{y.dtype}"
            if not torch.equal(x, y) and not (x.is_floating_point() and torch.equal(x.nan_to_num(), y.nan_to_num())
                                              and torch.equal(x.isnan(), y.isnan())):
                return f"leaf {i}: not bitwise equal (max abs diff {(x.double() - y.double()).abs().max().item():.3g})"
        elif x != y:
            return f"leaf {i}: {x!r} != {y!r}"
    return None


def _compare_close(out, ref, rtol, atol, drawn=frozenset()) -> str | None:
    """How ``out`` differs from ``ref`` beyond the tolerances, or None; the leaves of ``out`` at the
    positions ``drawn`` (computed from random draws: exporter.lowering.random_draws) by shape and dtype."""
    import torch

    lo, lr, at = _aligned_at(out, ref)
    if len(lo) != len(lr):
        return f"output leaf count differs: {len(lo)} (runtime) vs {len(lr)} (eager)"
    for i, (x, y) in enumerate(zip(lo, lr)):
        if torch.is_tensor(x) and torch.is_tensor(y) and at[i] in drawn:
            if x.shape != y.shape or x.dtype != y.dtype:
                return f"leaf {i} (random): {tuple(x.shape)} {x.dtype} (runtime) vs {tuple(y.shape)} {y.dtype} (eager)"
        elif torch.is_tensor(x) and torch.is_tensor(y):
            try:
                torch.testing.assert_close(x, y, rtol=rtol, atol=atol, equal_nan=True, check_device=False)
            except AssertionError as e:
                lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
                return f"leaf {i} {tuple(y.shape)}: " + " ".join(lines[:4])
        elif torch.is_tensor(x) != torch.is_tensor(y):
            return f"leaf {i}: {type(x).__name__} (runtime) vs {type(y).__name__} (eager)"
    return None


def _op_label(target) -> str:
    """A stable name of a call target: "aten.add.Tensor", "operator.mul", "torch.sym_min"."""
    import torch

    if isinstance(target, (torch._ops.OpOverload, torch._ops.HigherOrderOperator)):
        return str(target)
    module = {"_operator": "operator", "builtins": "operator"}.get(target.__module__, target.__module__)
    return f"{module}.{target.__name__}"


def _routes(ep, rec) -> None:
    """The opset explorer's routes of ``ep`` (exporter/explorer/route_trace.py): the decomposition trees
    of its call sites, its leaves and its functionalized op set, kept in the record; a program whose
    routes cannot be traced fails the stage with the explorer's reason."""
    from exporter.explorer.corpus import CorpusProgram, corpus_routes

    got = corpus_routes([CorpusProgram(rec["name"], ep)])
    if got["left_out"]:
        raise RuntimeError(got["left_out"][0]["error"])
    (m,) = got["models"]
    rec["routes"] = {"trees": [got["trees"][i] for i in m["trees"]], "leaves": m["leaves"],
                     "unlowered": m["unlowered"]}


def _ops_of(ep) -> list[str]:
    import torch.fx

    ops = set()
    for _, m in ep.graph_module.named_modules():
        if isinstance(m, torch.fx.GraphModule):
            ops.update(_op_label(n.target) for n in m.graph.nodes if n.op == "call_function")
    return sorted(ops)


def run_case(name: str, stop_after: str | None, conn, workdir: str, presets: tuple[str, ...] = PRESETS) -> None:
    """Run the stages for ``name``, sending the (growing) record through ``conn`` after each stage
    (``presets``: the lowerings to run, of PRESETS)."""
    _quiet_everything()
    import torch

    torch.set_num_threads(1)
    rec = {"name": name, "stages": {}}

    def send():
        conn.send(rec)

    def stage(key, fn):
        """Run fn, record status/seconds; returns (ok, value)."""
        rec["current"] = key
        send()
        t0 = time.perf_counter()
        try:
            value = fn()
            st = {"status": "ok"}
            ok = True
        except Exception as e:  # noqa: BLE001 -- every failure is a result here
            value, st, ok = None, _err(e), False
            if os.environ.get("PT2B_SWEEP_TRACEBACK"):
                st["traceback"] = traceback.format_exc()[-3000:]
        st["seconds"] = round(time.perf_counter() - t0, 3)
        rec["stages"][key] = st
        rec.pop("current", None)
        send()
        return ok, value

    def done(key):
        return stop_after is not None and key == stop_after

    def skip_rest(after, why="an earlier stage failed"):
        _skip_after(rec["stages"], after, why, stop_after)
        send()

    from tools.corpus.transformers_zoo import CaseUnavailable, make_case

    ok, case = stage("build", lambda: make_case(name))
    if not ok:
        st = rec["stages"]["build"]
        st["unavailable"] = st.get("error_type") == "CaseUnavailable"
        return skip_rest("build")
    rec.update(model_type=case.model_type, task=case.task, model_class=case.model_class,
               attn_implementation=case.attn_implementation, inputs=case.inputs, notes=case.notes,
               params=sum(p.numel() for p in case.model.parameters()),
               input_shapes={k: list(v.shape) for k, v in (case.kwargs or {}).items() if torch.is_tensor(v)},
               rtol=case.rtol, atol=case.atol, strict=case.strict)
    if done("build"):
        return send()
    eager_model = copy.deepcopy(case.model)  # export and the runs below must not see a mutated model
    args, kwargs = case.args, case.kwargs or {}

    def fresh():
        # every run starts from the same generator state: models that draw random numbers in forward
        # (vit_mae's masking, univnet's noise) then compute the same thing each time
        torch.manual_seed(0)
        return copy.deepcopy(args), copy.deepcopy(kwargs)

    def capture():
        from tools.corpus.programs import capture_real

        notes = {}
        try:
            return capture_real(case, notes)
        finally:
            rec.update(notes)

    ok, ep = stage("capture", capture)
    if not ok:
        return skip_rest("capture")
    rec["ops"] = _ops_of(ep)
    rec["n_nodes"] = sum(1 for n in ep.graph.nodes if n.op == "call_function")
    if done("capture"):
        return send()
    if stop_after == "routes":
        stage("routes", lambda: _routes(ep, rec))
        return send()

    ok, ref = stage("eager", lambda: run_eager(eager_model, fresh))
    if not ok:
        return skip_rest("eager")
    if done("eager"):
        return send()

    import exporter
    import runtime_ref

    path = os.path.join(workdir, re.sub(r"[^A-Za-z0-9_.-]", "_", name) + ".pt2b")
    ok, _ = stage("write", lambda: exporter.export_model(ep, path=path))
    if not ok:
        return skip_rest("write")
    rec["artifact_bytes"] = os.path.getsize(path)
    if done("write"):
        return send()
    if stop_after == "ratio:core":
        stage("ratio:core", lambda: _lowering_ratio(ep, path, rec, warm=True))
        return send()

    def load():
        prog = exporter.load(path)
        a, k = fresh()
        with torch.no_grad():
            return prog(*a, **k)

    ok, out = stage("load", load)
    if ok:
        def bitwise():
            a, k = fresh()
            with torch.no_grad():
                want = ep.module()(*a, **k)
            msg = _compare_bitwise(out, want)
            if msg:
                raise AssertionError(msg)

        stage("bitwise", bitwise)
    else:
        rec["stages"]["bitwise"] = {"status": "skip", "why": "load failed"}
    if done("bitwise"):
        return send()

    for preset in presets:
        ok, lp = stage(f"lower:{preset}", lambda: exporter.load_for_backend(path, preset, cache=False))
        if not ok:
            rec["stages"][f"run:{preset}"] = rec["stages"][f"match:{preset}"] = {"status": "skip",
                                                                                   "why": "lower failed"}
            stage(f"torch:{preset}", lambda: _torch_lowering(ep, preset, fresh, ref, case))
            continue
        if preset != "none":
            rec.setdefault("lowered_op_counts", {})[preset] = len(_ops_of(lp.exported_program()))
        if lp.validation is not None:  # load_for_backend validated its lowering on the stored inputs
            v = lp.validation
            rec.setdefault("validation", {})[preset] = {"status": v.status, "verdict": v.verdict, "why": v.why,
                                                        "max_rel": v.max_rel, "kept": v.kept, "seconds": v.seconds}
        custom = custom_ops(lp.exported_program())
        if custom:  # ops of torch.library (transformers registers some): runtime_ref runs them when told to
            rec["custom_ops"] = sorted(set(rec.get("custom_ops", [])) | set(custom))

        def run():
            a, k = fresh()
            return runtime_ref.Runtime(lp, extra_ops=custom)(*a, **k)

        ok, got = stage(f"run:{preset}", run)
        if not ok:
            rec["stages"][f"match:{preset}"] = {"status": "skip", "why": "run failed"}
            stage(f"torch:{preset}", lambda: _torch_lowering(ep, preset, fresh, ref, case))
            continue

        def match():
            msg = _compare_close(got, ref, case.rtol, case.atol)
            if msg:
                raise AssertionError(msg)

        if not stage(f"match:{preset}", match)[0]:
            stage(f"torch:{preset}", lambda: _torch_lowering(ep, preset, fresh, ref, case))
        elif preset == "core":
            stage("table:core", lambda: _table_plan(lp, path, custom, fresh, rec))
    if RATIOS and rec["stages"].get("lower:core", {}).get("status") == "ok":
        stage("ratio:core", lambda: _lowering_ratio(ep, path, rec))
    send()


def run_eager(model, fresh):
    """The model on a fresh copy of the case's inputs, from the same generator state, without grad."""
    import torch

    a, k = fresh()
    with torch.no_grad():
        return model(*a, **k)


def _table_plan(lp, path, custom, fresh, rec) -> None:
    """The core lowering written to disk and loaded: runtime_ref plans it straight from the graph table
    where it can (rec["table_plan"] says whether, or why not), and that plan's outputs must equal
    bitwise those of the plan from the lowered program (both run from the same generator state)."""
    import torch

    import exporter
    import runtime_ref

    low = path[: -len(".pt2b")] + ".core.pt2b"
    exporter.export_model(lp, path=low)
    prog = exporter.load(low)
    rt = runtime_ref.Runtime(prog, extra_ops=custom)
    rec["table_plan"] = {"planned_from": rt.planned_from, "why_not": rt.not_from_table}
    outs = []
    for runtime in (rt, runtime_ref.Runtime(lp, extra_ops=custom)):
        a, k = fresh()
        torch.manual_seed(0)
        outs.append(runtime(*a, **k))
    msg = _compare_bitwise(*outs)
    if msg:
        raise AssertionError(f"the plan from the table differs from the plan from the program: {msg}")
    if rt.planned_from == "table" and prog._built.done:
        raise AssertionError("planning from the table built the ExportedProgram")


def _lowering_ratio(ep, path, rec, warm: bool = False) -> None:
    """pt2b's cold core lowering (load_for_backend(path, "core", cache=False, validate=False): torch's
    does not validate) against torch's torch.export.load + run_decompositions() of the same program
    saved as .pt2, back to back in the case's process (the tracing machinery warm from the lowerings
    before), each timed in CPU seconds of this process: other work on the machine (the sweep's other
    worker, a test run) stretches wall time, not these."""
    import torch

    import exporter

    pt2 = path[: -len(".pt2b")] + ".pt2"
    torch.export.save(ep, pt2)
    if warm:  # (the tracing machinery warmed, as the full pipeline's lowerings leave it)
        exporter.load_for_backend(path, "core", cache=False, validate=False)
    t0 = time.process_time()
    exporter.load_for_backend(path, "core", cache=False, validate=False)
    ours = time.process_time() - t0
    t0 = time.process_time()
    torch.export.load(pt2).run_decompositions()
    theirs = time.process_time() - t0
    rec["lowering_ratio"] = {"pt2b_s": round(ours, 3), "torch_s": round(theirs, 3), "ratio": round(ours / theirs, 3),
                             "clock": "cpu"}


def custom_ops(ep) -> list[str]:
    """Names of the torch.library operators (namespaces other than aten and prims) a program calls."""
    return [op for op in _ops_of(ep) if op.count(".") == 2 and op.split(".")[0] not in ("aten", "prims")]


def _torch_lowering(ep, preset, fresh, ref, case):
    """What torch itself does where pt2b's lowering, run or match failed: torch's run_decompositions
    with the preset's table, its module run on the inputs and compared with eager. Raises where torch
    fails too (a torch limitation, recorded with torch's own error)."""
    import torch

    from exporter.lowering import tables

    table = {"none": {}, "core": None, "max": tables.available_decompositions()}[preset]
    lowered = ep.run_decompositions() if table is None else ep.run_decompositions(table)
    a, k = fresh()
    with torch.no_grad():
        out = lowered.module()(*a, **k)
    msg = _compare_close(out, ref, case.rtol, case.atol)
    if msg:
        raise AssertionError(f"torch's lowered module differs from eager: {msg}")


class _Reporter:
    """The ``conn`` run_case sends its growing record to, inside a sweep's case: each one reported to
    the runner (a case that crashes or runs out of time is recorded as far as it got)."""

    def __init__(self):
        self.last = None

    def send(self, rec):
        from exporter import sweep

        self.last = copy.deepcopy(rec)
        sweep.report(self.last)


def sweep_case(name: str, stop_after: str | None, ratios: bool = False, backends: list[str] | None = None) -> dict:
    """One case of the sweep (exporter.sweep runs it in a process of its own): run_case's stages, or
    the backend matrix's with ``backends``; returns the finished record."""
    global RATIOS
    RATIOS = ratios
    sink = _Reporter()
    with tempfile.TemporaryDirectory(prefix="pt2b_real_models_") as workdir:
        if backends is not None:
            from tools import backend_matrix

            backend_matrix.run_case(name, backends, sink, workdir)
        else:
            run_case(name, stop_after, sink, workdir)
    return sink.last


# ------------------------------------------------------------------------------------------------
# Parent side: scheduling, records, summary
# ------------------------------------------------------------------------------------------------

def _preload():
    """Import the heavy modules once so that forked children start warm."""
    _quiet_everything()
    import torch  # noqa: F401
    import transformers  # noqa: F401

    import exporter  # noqa: F401
    import runtime_ref  # noqa: F401
    from tools.corpus import transformers_zoo

    return transformers_zoo


def _finish_dead(rec: dict, name: str, why: str, log_path: str, stop_after=None) -> dict:
    rec = dict(rec or {"name": name, "stages": {}})
    rec.setdefault("stages", {})
    cur = rec.pop("current", None)
    if cur is None:
        cur = next((k for k in STAGE_ORDER if k not in rec["stages"]), "build")
    tail = ""
    try:
        with open(log_path, errors="replace") as f:
            tail = f.read()[-MSG_CHARS:]
    except OSError:
        pass
    rec["stages"][cur] = {"status": "fail", "error_type": why.split(":")[0], "error": (why + " " + tail).strip()[:MSG_CHARS]}
    _skip_after(rec["stages"], cur, why, stop_after)
    return rec


def _skip_after(stages: dict, after: str, why: str, stop_after) -> None:
    """Mark every stage after ``after`` that has no result as skipped, up to ``stop_after`` (stages
    after --stages are not part of the run)."""
    started = False
    for k in STAGE_ORDER:
        if started and k not in stages:
            stages[k] = {"status": "skip", "why": why}
        if k == after:
            started = True
        if k == stop_after:
            break


def _descends(commit: str, base: str) -> bool:
    """Whether ``commit`` (a record's pt2b field, maybe "+dirty") is ``base`` or a later commit."""
    commit = commit.removesuffix("+dirty").removesuffix("-dirty")
    if not commit or commit == "unknown":
        return False
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    return subprocess.run(["git", "-C", here, "merge-base", "--is-ancestor", base, commit],
                          capture_output=True).returncode == 0


def sweep(names, *, workers: int, timeout: float, stop_after, out_path: str, log_dir: str, resume: dict | None = None,
          progress=True, backends: list[str] | None = None, ray: str | None = None, fresh: bool = False,
          redo: set | None = None, places: dict | None = None):
    """Run sweep_case for every name not in ``resume`` on the sweep runner (exporter.sweep: one process
    per case, ``workers`` at a time here or on the Ray cluster ``ray``), its records file beside
    ``out_path`` resumed from unless ``fresh`` (the cases named in ``redo`` run again); ``out_path``
    holds the records in this tool's form, rewritten as cases finish. ``places``: backend -> the python
    of the venv it is installed in; each model's stages on such a backend are a case of their own run
    there (routed_cases), merged into the model's record."""
    from exporter import sweep as runner

    records = dict(resume or {})
    cases, model_of = routed_cases([n for n in names if n not in records], stop_after, backends, places, ray)
    t_start = time.time()

    def flush():
        # the temporary file's name ends as out_path's does: _open_json compresses what ends in .gz
        tmp = out_path[:-3] + ".tmp.gz" if out_path.endswith(".gz") else out_path + ".tmp"
        with _open_json(tmp, "w") as f:
            json.dump({"meta": {"stop_after": stop_after, "cases": len(names), "wall_seconds":
                                round(time.time() - t_start, 1), "workers": workers, "timeout": timeout},
                       "records": [records[n] for n in names if n in records]}, f, indent=1)
        os.replace(tmp, out_path)

    journal = (out_path[:-3] if out_path.endswith(".gz") else out_path) + ".jsonl"
    got = runner.iterate(cases, journal, workers=workers, ray=ray, resume=not fresh, log_dir=log_dir,
                         limits=runner.Limits(timeout=timeout, memory_gb=MEMORY_LIMIT_GB),
                         redo=lambda r: model_of.get(r["id"]) in (redo or ()))  # (a routed case's id: "model@backend")
    for i, (rec, new) in enumerate(got):
        name = model_of[rec["id"]]
        part = _from_runner(rec, stop_after, runner.log_path(log_dir, rec["id"]))
        records[name] = merge_record(records[name], part) if name in records else part
        if progress and new:
            print(f"[{len(records)}/{len(names)} {time.time() - t_start:6.0f}s] {rec['id']}: {_one_line(part)}",
                  flush=True)
        if i % 5 == 4:
            flush()
    flush()
    return records, time.time() - t_start


# A case routed to a backend's own venv on a Ray cluster asks for this custom resource, which the nodes
# where that venv is installed offer (``ray start --resources '{"backend_executorch": 1000}'``); a small
# amount per task, so that the node's CPUs, not the resource, bound how many run there at once
ROUTE_RESOURCE = "backend_{}"
ROUTE_AMOUNT = 0.001


def routed_cases(names, stop_after, backends, places, ray) -> tuple[list, dict]:
    """(the sweep's cases, case id -> model name): one case per model for the backends installed here
    (or the corpus sweep's stages, without ``backends``), and one per model and backend of ``places``
    (backend -> the python of its venv), run by that interpreter and, on Ray, on a node offering
    ROUTE_RESOURCE of it. Its id is "model@backend"."""
    from exporter import sweep as runner
    from exporter.errors import SweepError

    places = dict(places or {})
    unknown = sorted(set(places) - set(backends or ()))
    if unknown:
        raise SweepError(f"--python names backends the sweep does not run ({', '.join(unknown)}): name them "
                                f"in --backends too, or leave them out of --python.")
    here = [b for b in backends or () if b not in places]
    cases, model_of = [], {}
    for n in names:
        if backends is None or here:
            cases.append(runner.Case(n, "tools.real_models:sweep_case", (n, stop_after, RATIOS),
                                     kwargs={"backends": here} if backends else {}))
            model_of[n] = n
        for b, python in places.items():
            cid = f"{n}@{b}"
            cases.append(runner.Case(cid, "tools.real_models:sweep_case", (n, stop_after, RATIOS),
                                     kwargs={"backends": [b]}, backend=b, interpreter=python,
                                     resources={ROUTE_RESOURCE.format(b): ROUTE_AMOUNT} if ray else None))
            model_of[cid] = n
    return cases, model_of


def merge_record(have: dict, rec: dict) -> dict:
    """Two records of one model (its stages on different backends, run in different cases or files) as
    one: the stages, owners and fallback shares of both (``have``'s where both ran one), both code
    versions."""
    out = {**have, "stages": dict(have["stages"]), "owner": dict(have.get("owner", {}))}
    out["stages"].update({k: v for k, v in rec.get("stages", {}).items() if k not in out["stages"]})
    out["owner"].update(rec.get("owner", {}))
    fallback = {**rec.get("fallback", {}), **have.get("fallback", {})}  # (per backend: what ran split)
    if fallback:
        out["fallback"] = fallback
    out["pt2b"] = ", ".join(sorted({*str(have.get("pt2b") or "").split(", "), str(rec.get("pt2b") or "")} - {""}))
    return out


def _from_runner(rec: dict, stop_after, log_path: str) -> dict:
    """This tool's record of a case from the runner's: the case's own, or where the case's process
    failed (a crash, the time limit, an error of the tool's), as far as it got with that stage failed."""
    if rec["outcome"] == "ok":
        out = dict(rec["result"])
    else:
        why = {"error": "internal_error", "memory": "internal_error"}.get(rec["outcome"], rec["outcome"])
        out = _finish_dead(rec.get("partial"), rec["id"], f"{why}: {rec.get('error', '')}"[:MSG_CHARS], log_path,
                           stop_after)
    out["wall_seconds"] = rec.get("seconds")
    out["pt2b"] = rec.get("git") or rec.get("pt2b")
    return out


def _open_json(path: str, mode: str = "r"):
    """A sweep record file, gzip-compressed when its name ends in .gz (bench/records/ keeps them so)."""
    return gzip.open(path, mode + "t") if str(path).endswith(".gz") else open(path, mode)


def _one_line(rec) -> str:
    st = rec.get("stages", {})
    for k in STAGE_ORDER:
        s = st.get(k)
        if s and s["status"] == "fail":
            return f"FAIL at {k}: {s.get('error_type')}: {s.get('error', '')[:100]}"
    last = [k for k in STAGE_ORDER if st.get(k, {}).get("status") == "ok"]
    ratio = f", core lowering {rec['lowering_ratio']['ratio']:.2f}x torch's" if "lowering_ratio" in rec else ""
    return f"ok through {last[-1] if last else '-'} ({rec.get('wall_seconds', 0)}s{ratio})"


_NORMALIZERS = [
    (re.compile(r"0x[0-9a-fA-F]+"), "0x…"),
    (re.compile(r"/tmp/[^\s'\"]+"), "<tmp>"),
    (re.compile(r"\b\d+(\.\d+)?(e[-+]?\d+)?\b"), "N"),
    (re.compile(r"\s+"), " "),
]


def _group_key(stage: str, st: dict) -> str:
    msg = st.get("error_key") or st.get("error", "")
    for rx, rep in _NORMALIZERS:
        msg = rx.sub(rep, msg)
    return f"{stage} | {st.get('error_type')}: {msg[:160]}"


def summarize(records: list[dict], wall: float | None = None, file=sys.stdout) -> None:
    p = lambda *a: print(*a, file=file)  # noqa: E731
    n = len(records)
    cnt = collections.Counter()
    for r in records:
        for k, s in r.get("stages", {}).items():
            cnt[(k, s["status"])] += 1
    unavailable = sum(1 for r in records if r.get("stages", {}).get("build", {}).get("unavailable"))
    p(f"\n== {n} cases" + (f", {wall:.0f}s wall" if wall is not None else ""))
    p(f"{'stage':<14}{'ok':>6}{'fail':>6}{'skip':>6}")
    for k in STAGE_ORDER:
        if cnt[(k, "ok")] or cnt[(k, "fail")]:
            p(f"{k:<14}{cnt[(k, 'ok')]:>6}{cnt[(k, 'fail')]:>6}{cnt[(k, 'skip')]:>6}")
    p(f"(build failures that are CaseUnavailable: {unavailable})")
    types = collections.defaultdict(set)
    for r in records:
        t = r["name"].split("/", 1)[0]
        types["tried"].add(t)
        st = r.get("stages", {})
        for k in ("build", "capture", "write", "bitwise", "match:none", "match:core", "match:max"):
            if st.get(k, {}).get("status") == "ok":
                types[k].add(t)
    p("model types (any case of the type): " + ", ".join(
        f"{k}={len(types[k])}" for k in ("tried", "build", "capture", "write", "bitwise", "match:none", "match:core",
                                          "match:max") if k == "tried" or types[k] or k in ("build", "capture")))
    dyn = collections.Counter(r.get("dynamic") for r in records if r.get("stages", {}).get("capture", {}).get("status") == "ok")
    if dyn:
        p("captured programs: " + ", ".join(f"{k}={v}" for k, v in dyn.most_common()))
    by_task = collections.defaultdict(collections.Counter)
    for r in records:
        task = r.get("task") or (r["name"].split("/", 1)[1] if "/" in r["name"] else "base")
        st = r.get("stages", {})
        by_task[task]["tried"] += 1
        for k in ("build", "capture", "bitwise", "match:core"):
            if st.get(k, {}).get("status") == "ok":
                by_task[task][k] += 1
    p(f"\n{'task':<24}{'tried':>6}{'built':>6}{'capt':>6}{'bitw':>6}{'core':>6}")
    for task, c in sorted(by_task.items(), key=lambda kv: -kv[1]["tried"]):
        p(f"{task:<24}{c['tried']:>6}{c['build']:>6}{c['capture']:>6}{c['bitwise']:>6}{c['match:core']:>6}")
    groups = collections.defaultdict(list)
    for r in records:
        for k in STAGE_ORDER:
            s = r.get("stages", {}).get(k)
            if s and s["status"] == "fail":
                groups[_group_key(k, s)].append(r["name"])
    p(f"\n== {len(groups)} distinct failures (stage | error), by count")
    for key, names in sorted(groups.items(), key=lambda kv: -len(kv[1])):
        ex = ", ".join(names[:4]) + (" …" if len(names) > 4 else "")
        p(f"{len(names):>4}  {key}\n      e.g. {ex}")


def _ok(rec: dict, stage: str) -> bool:
    return rec.get("stages", {}).get(stage, {}).get("status") == "ok"


def _torch_save_fails(stage: str, st: dict) -> bool:
    """A write pt2b refused because torch's own export serializer, which torch.export.save uses too,
    cannot serialize the program (a flat_apply higher-order op)."""
    return stage == "write" and "torch's export serializer rejected the program" in st.get("error", "")


def _torch_fails_too(rec: dict, preset: str) -> bool:
    return rec.get("stages", {}).get(f"torch:{preset}", {}).get("status") == "fail"


def markdown(records: list[dict], wall: float | None = None) -> str:
    """The full table (docs/real-models.md): cases and model types through each step, then every failure grouped by cause."""
    rows = [("tried", lambda r: True), ("built offline (random weights)", lambda r: _ok(r, "build")),
            ("captured by torch.export", lambda r: _ok(r, "capture")),
            ("written by pt2b", lambda r: _ok(r, "write")),
            ("read back, bitwise equal to torch.export's module", lambda r: _ok(r, "bitwise"))]
    for p in PRESETS:
        rows.append((f"`{p}`: lowered, run on runtime_ref, close to eager",
                     lambda r, p=p: _ok(r, f"match:{p}")))
        if any(r.get("validation") for r in records):  # (sweeps from the validating load_for_backend on)
            rows.append((f"`{p}`: validated by load_for_backend (passed; a decomposition kept where it failed)",
                         lambda r, p=p: r.get("validation", {}).get(p, {}).get("status") == "passed"))
        rows.append((f"`{p}`: fails where torch's own run_decompositions fails too",
                     lambda r, p=p: not _ok(r, f"match:{p}") and _torch_fails_too(r, p)))
    out = ["| | cases | model types |", "|---|---|---|"]
    for label, pred in rows:
        hit = [r for r in records if pred(r)]
        out.append(f"| {label} | {len(hit)} | {len({r['name'].split('/', 1)[0] for r in hit})} |")
    dyn = collections.Counter(r.get("dynamic") for r in records if _ok(r, "capture"))
    out.append("")
    out.append(f"Captured with a dynamic sequence length: {dyn.get('dynamic', 0)}; static shapes: "
               f"{sum(dyn.values()) - dyn.get('dynamic', 0)} (torch.export refused the dynamic dimension or the "
               f"model has none)." + (f" Sweep wall time: {wall / 60:.0f} min." if wall else ""))
    versions = collections.Counter(r.get("pt2b", "unrecorded") for r in records if _ok(r, "capture"))
    out.append("pt2b code of the captured cases' rows: " + ", ".join(
        f"{v} ({n})" for v, n in versions.most_common()) + ".")
    groups = _failure_groups(records)
    out.append("")
    out.append("| cause | stage and error | cases | e.g. |")
    out.append("|---|---|---|---|")
    order = {"pt2b": 0, "torch too": 1, "torch.export": 2, "corpus": 3}
    for (cause, key), names in sorted(groups.items(), key=lambda kv: (order[kv[0][0]], -len(kv[1]))):
        out.append(f"| {cause} | {key.replace('|', '/')[:200]} | {len(names)} | {', '.join(names[:3])} |")
    out += ratio_markdown(records)
    return "\n".join(out)


def _failure_groups(records: list[dict]) -> dict:
    """(cause, stage and normalized error) -> case names; cause: "pt2b", "torch too" (torch's own
    run_decompositions fails as well), "torch.export" (capture) or "corpus" (the case cannot be built)."""
    groups = collections.defaultdict(list)
    for r in records:
        for k in STAGE_ORDER:
            st = r.get("stages", {}).get(k)
            if st and st["status"] == "fail" and not k.startswith("torch:"):
                preset = k.partition(":")[2]
                cause = ("torch too" if (preset and _torch_fails_too(r, preset)) or _torch_save_fails(k, st) else
                         "corpus" if k == "build" else "torch.export" if k == "capture" else "pt2b")
                groups[(cause, _group_key(k, st))].append(r["name"])
                if k != "build" and preset == "":
                    break
    return groups


VARIANT_LABELS = {"bf16": "sample in bfloat16", "fp16": "sample in float16",
                  "int8wo": "sample, torchao int8 weight-only", "fp8wo": "sample, torchao float8 weight-only",
                  "pt2e": "sample, PT2E int8 (X86 quantizer)"}


def _variant_of(name: str) -> str | None:
    return name.partition("@")[2] or None


def readme_table(records: list[dict], wall: float | None = None, variants: list[dict] | None = None) -> str:
    """docs/results.md's compact form of the sweep: cases and model types through each step, and who the
    failures after capture belong to (``--readme``; tests/corpora/test_real_models.py checks docs/results.md holds it).
    ``variants``: the records of a variant sweep (``--sample --variants ...``), a row of cases per variant."""
    cols = [("tried", lambda r: True), ("built offline", lambda r: _ok(r, "build")),
            ("captured by torch.export", lambda r: _ok(r, "capture")),
            ("written, read back bitwise", lambda r: _ok(r, "bitwise"))]
    cols += [(f"`{p}`", lambda r, p=p: _ok(r, f"match:{p}")) for p in PRESETS]  # lowered, run on runtime_ref, close to eager
    lines = ["| | " + " | ".join(label for label, _ in cols) + " |", "|---" * (len(cols) + 1) + "|"]
    rows = [("cases", records, lambda r: r["name"]), ("model types", records, lambda r: r["name"].split("/", 1)[0])]
    by_variant = collections.defaultdict(list)
    for r in variants or []:
        by_variant[_variant_of(r["name"])].append(r)
    rows += [(f"{VARIANT_LABELS.get(v, v)} (`@{v}`)", recs, lambda r: r["name"])
             for v, recs in sorted(by_variant.items(), key=lambda kv: list(VARIANT_LABELS).index(kv[0])
                                   if kv[0] in VARIANT_LABELS else 99)]
    for what, recs, key in rows:
        lines.append(f"| {what} | " + " | ".join(str(len({key(r) for r in recs if pred(r)})) for _, pred in cols)
                     + " |")
    after = collections.defaultdict(set)
    for (cause, _), names in _failure_groups(records + list(variants or [])).items():
        if cause in ("pt2b", "torch too"):
            after[cause].update(names)
    pt2b = sorted(after["pt2b"])
    versions = sorted({r.get("pt2b", "unrecorded") for r in records if _ok(r, "capture")})
    lines.append("")
    lines.append(f"`none`/`core`/`max`: lowered with that preset, run on runtime_ref, close to eager. Failures after "
                 f"capture: {len(after['torch too'])} cases where torch's own `run_decompositions` (or `torch.export.save`) "
                 f"fails too, {len(pt2b)} pt2b's" + (f" ({', '.join(pt2b[:6])})" if pt2b else "")
                 + f". pt2b {', '.join(versions)}" + (f", {wall / 3600:.1f} h on 2 cores." if wall else ".")
                 + (f" Variant rows: pt2b {', '.join(sorted({r.get('pt2b', 'unrecorded') for r in variants}))}, "
                    f"the variants' own failures in [real-models.md](real-models.md#variants-half-precision-and-quantized-weights)."
                    if variants else "")
                 + _ratio_sentence(records))
    return "\n".join(lines)


def _timed(records: list[dict]) -> list[dict]:
    """The records with a ratio:core timing in CPU seconds, slowest ratio first (not those timed in wall
    seconds, before the CPU clock: they moved with whatever else ran on the machine)."""
    return sorted((r for r in records if r.get("lowering_ratio", {}).get("clock") == "cpu"),
                  key=lambda r: -r["lowering_ratio"]["ratio"])


def _ratio_sentence(records: list[dict]) -> str:
    """The per-model lowering ratios in one sentence (docs/results.md's): geomean, median, count above 1.0x, worst five."""
    import statistics

    timed = _timed(records)
    if not timed:
        return ""
    ratios = [r["lowering_ratio"]["ratio"] for r in timed]
    worst = ", ".join(f"{r['name']} {r['lowering_ratio']['ratio']:.2f}" for r in timed[:5])
    failed = sum(1 for r in records if "error" in r.get("lowering_ratio", {}))
    versions = collections.Counter(r["lowering_ratio"].get("pt2b", "unrecorded") for r in timed)
    return (f" Cold `core` lowering over torch's `torch.export.load` + `run_decompositions()`, per case in CPU seconds "
            f"({len(ratios)} cases, pt2b {', '.join(f'{v} ({n})' for v, n in versions.most_common())}, "
            f"[real-models.md](real-models.md#cold-core-lowering-per-case)): geometric mean "
            f"{statistics.geometric_mean(ratios):.3f}x, median {statistics.median(ratios):.3f}x, "
            f"{sum(x > 1.0 for x in ratios)} above 1.0x; worst five: {worst}"
            + (f"; {failed} more where torch's load or `run_decompositions()` fails" if failed else "") + ".")


def ratio_markdown(records: list[dict]) -> list[str]:
    """Cold core lowering, pt2b / torch, per case (the ratio:core stage): the distribution, then every case."""
    import statistics

    timed = _timed(records)
    if not timed:
        return []
    ratios = [r["lowering_ratio"]["ratio"] for r in timed]
    over = [r["name"] for r in timed if r["lowering_ratio"]["ratio"] > 1.0]
    failed = sorted(r["name"] for r in records if "error" in r.get("lowering_ratio", {}))
    out = ["", "### Cold core lowering per case", "", f"Cold core lowering, pt2b's `load_for_backend(path, \"core\", cache=False, validate=False)` over torch's "
           f"`torch.export.load` + `run_decompositions()`, one run each, back to back in the case's process, "
           f"in CPU seconds ({len(ratios)} cases): "
           f"geometric mean {statistics.geometric_mean(ratios):.3f}x, median {statistics.median(ratios):.3f}x, "
           f"{len(over)} above 1.0x" + (f" ({', '.join(over[:10])}{', ...' if len(over) > 10 else ''})" if over else "")
           + "." + (f" No ratio where torch's own `torch.export.load` or `run_decompositions()` fails: "
                     f"{', '.join(failed)}." if failed else ""), "", "<details><summary>per case, slowest ratio first</summary>", "",
           "| case | pt2b s | torch s | ratio |", "|---|---|---|---|"]
    out += [f"| {r['name']} | {r['lowering_ratio']['pt2b_s']:.2f} | {r['lowering_ratio']['torch_s']:.2f} | "
            f"{r['lowering_ratio']['ratio']:.2f} |" for r in timed]
    out += ["", "</details>"]
    return out


SAMPLE_CASE_SECONDS = 40.0  # a case slower than this in the sweep stays in the slow sweep only


def _stable_op(op: str) -> str:
    """Op names of records written before _op_label (a function's repr held its address)."""
    m = re.fullmatch(r"<(?:built-in )?function (\w+)(?: at 0x[0-9a-f]+)?>", op)
    if m is None:
        return op
    return ("torch." if m.group(1).startswith("sym_") else "operator.") + m.group(1)


def pick_sample(records: list[dict], max_seconds: float = SAMPLE_CASE_SECONDS) -> list[tuple[str, str]]:
    """Cases for the default test run, chosen from a sweep's records: greedily, the case that adds the
    most ops not yet called per second of its run, until every op any captured case calls is called
    by a chosen one; then the quickest case of every task not yet represented. Cases that took longer
    than ``max_seconds`` are not chosen (their ops are listed as left to the slow sweep). Returns
    (name, why) pairs; a name of None carries a note."""
    captured = [r for r in records if r.get("stages", {}).get("capture", {}).get("status") == "ok"]
    cost = {r["name"]: max(float(r.get("wall_seconds") or 1.0), 0.5) for r in captured}
    every = set().union(*({_stable_op(o) for o in r.get("ops", [])} for r in captured)) if captured else set()
    captured = [r for r in captured if cost[r["name"]] <= max_seconds]
    ops = {r["name"]: {_stable_op(o) for o in r.get("ops", [])} for r in captured}
    uncovered = set().union(*ops.values()) if ops else set()
    chosen = []
    while uncovered:
        best = max(ops, key=lambda n: (len(ops[n] & uncovered) / cost[n], -cost[n], n))
        gain = ops[best] & uncovered
        if not gain:
            break
        chosen.append((best, f"{len(gain)} new ops, e.g. {', '.join(sorted(gain)[:3])}"))
        uncovered -= gain
    tasks = {n for n, _ in chosen}
    have = {next(r.get("task") for r in captured if r["name"] == n) for n in tasks}
    for r in sorted(captured, key=lambda r: cost[r["name"]]):
        if r.get("task") not in have:
            have.add(r.get("task"))
            chosen.append((r["name"], f"task {r.get('task')}"))
    left = sorted(every - set().union(*(ops[n] for n, _ in chosen)) if chosen else every)
    if left:
        chosen.append((None, f"ops called only by cases slower than {max_seconds:.0f} s (slow sweep): "
                             + ", ".join(left)))
    return chosen


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m tools.real_models", description=__doc__.splitlines()[0])
    ap.add_argument("--only", help="comma-separated case names")
    ap.add_argument("--tasks", help="comma-separated tasks (default: the corpus' default set)")
    ap.add_argument("--sample", action="store_true", help="the default test sample (transformers_sample.txt)")
    ap.add_argument("--variants", help="comma-separated variants of each case (bf16, fp16, int8wo, fp8wo, pt2e: "
                    "tools/corpus/variants.py), e.g. --sample --variants bf16,fp16")
    ap.add_argument("--readme-variants", metavar="FILE", help="with --readme: the variant sweep's records, a row each")
    ap.add_argument("--stages", default="all", choices=sorted(STOP_AFTER), help="stop after this stage")
    ap.add_argument("--limit", type=int, help="first N cases only")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--timeout", type=float, default=300.0, help="seconds per case")
    ap.add_argument("--out", default="/tmp/real_models.json")
    ap.add_argument("--log-dir", default=None, help="per-case stdout/stderr logs (default: <out>.logs/)")
    ap.add_argument("--resume", action="store_true", help="keep the records already in --out, run the rest (a "
                    "sweep resumes from its records file, <out>.jsonl, without it)")
    ap.add_argument("--fresh", action="store_true", help="start over: forget the records file <out>.jsonl")
    ap.add_argument("--ray", metavar="auto|ADDRESS", help="run the cases on a Ray cluster (pip install 'pt2b[ray]')")
    ap.add_argument("--redo-failed", metavar="STAGE", help="with --resume: run again the cases whose STAGE failed "
                    "('any': any stage after capture; 'captured': every case torch.export captured, so that "
                    "pt2b's stages all come from the code checked out now)")
    ap.add_argument("--keep-since", metavar="COMMIT", help="with --redo-failed captured: keep the records that "
                    "ran on COMMIT or a later one (a sweep resumed after a restart)")
    ap.add_argument("--no-ratios", action="store_true", help="skip timing torch's lowering beside pt2b's (ratio:core)")
    ap.add_argument("--summary-only", action="store_true", help="print the summary of --out and exit")
    ap.add_argument("--markdown", action="store_true", help="print the tables of --out (docs/real-models.md) and exit")
    ap.add_argument("--readme", action="store_true", help="print docs/results.md's compact table of --out and exit")
    ap.add_argument("--pick-sample", metavar="FILE", help="write the default test sample chosen from --out to FILE")
    args = ap.parse_args(argv)
    import signal

    signal.signal(signal.SIGPIPE, signal.SIG_DFL)  # `| head` ends the output quietly

    if args.summary_only or args.pick_sample or args.markdown or args.readme:
        with _open_json(args.out) as f:
            data = json.load(f)
        if args.markdown:
            print(markdown(data["records"], data.get("meta", {}).get("wall_seconds")))
            return 0
        if args.readme:
            extra = None
            if args.readme_variants:
                with _open_json(args.readme_variants) as f:
                    extra = json.load(f)["records"]
            print(readme_table(data["records"], data.get("meta", {}).get("wall_seconds"), extra))
            return 0
        if args.pick_sample:
            chosen = pick_sample(data["records"])
            with open(args.pick_sample, "w") as f:
                f.write(f"# default-run sample of the real-model corpus: every op of {len(data['records'])} swept cases "
                        f"and every task\n# written by `python -m tools.real_models --out SWEEP.json --pick-sample "
                        f"FILE`\n")
                f.writelines(f"{n}  # {why}\n" if n else f"# {why}\n" for n, why in chosen)
            print(f"{sum(1 for n, _ in chosen if n)} cases -> {args.pick_sample}")
            return 0
        summarize(data["records"], data.get("meta", {}).get("wall_seconds"))
        return 0
    global RATIOS
    RATIOS = not args.no_ratios
    zoo = _preload()
    if args.only:
        names = [n.strip() for n in args.only.split(",") if n.strip()]
    elif args.sample:
        from tools.corpus.programs import transformers_sample

        names = transformers_sample()
    else:
        names = zoo.case_names(args.tasks.split(",") if args.tasks else None)
    if args.variants:
        names = [f"{n}@{v}" for v in args.variants.split(",") if v for n in names]
    if args.limit:
        names = names[: args.limit]
    resume, redo = None, set()
    if args.resume and os.path.exists(args.out):
        with _open_json(args.out) as f:
            resume = {r["name"]: r for r in json.load(f)["records"]}
        if args.redo_failed:
            def failed(r):
                st = r.get("stages", {})
                if args.redo_failed == "captured":
                    return st.get("capture", {}).get("status") == "ok" and not (
                        args.keep_since and _descends(r.get("pt2b", ""), args.keep_since))
                if args.redo_failed == "any":  # every failure after capture (pt2b's stages)
                    return any(v.get("status") == "fail" for k, v in st.items()
                               if k not in ("build", "capture") and not k.startswith("ratio:"))
                return st.get(args.redo_failed, {}).get("status") == "fail"

            redo = {n for n, r in resume.items() if failed(r)}
            resume = {n: r for n, r in resume.items() if n not in redo}
    log_dir = args.log_dir or args.out + ".logs"
    os.makedirs(log_dir, exist_ok=True)
    print(f"{len(names)} cases, stages up to {args.stages}, {args.workers} workers, timeout {args.timeout:.0f}s, "
          f"out {args.out}", flush=True)
    records, wall = sweep(names, workers=args.workers, timeout=args.timeout, stop_after=STOP_AFTER[args.stages],
                          out_path=args.out, log_dir=log_dir, resume=resume, redo=redo, ray=args.ray,
                          fresh=args.fresh)
    summarize([records[n] for n in names if n in records], wall)
    print(f"\nJSON: {args.out}  logs: {log_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
