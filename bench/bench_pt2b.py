"""pt2b against its anchors (torch.export.save/load, run_decompositions, GraphModule, eager), side
by side in one process per model; prints medians and ratios (targets: docs/benchmarks.md).

Usage: python bench/bench_pt2b.py [--models mlp,encoder_6x512,chain100,gpt_350m,llama_methods,instance_norm_large,
                                           startup]
                                  [--repeat 5]
                                  [--sweep 1,2,4,8,12] [--real-models sample|NAME,NAME...]
gpt_350m (355M parameters, 1.4 GB) runs with at most 2 repeats; llama_methods writes a decoder's prefill
and decode as one artifact and prints its size and the memory of loading it against one method alone; --sweep times save/load/lower of the
512-wide encoder at each layer count and prints the cost per added layer; --real-models times save,
load and cold lowering on real transformers architectures (tools/corpus/transformers_zoo.py; "sample"
is the default test sample, tools/corpus/transformers_sample.txt) and prints each ratio's geometric mean;
startup times `import exporter`, `import runtime_ref`, `pt2b --version` and `pt2b inspect` in fresh
interpreters against `import torch`.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from exporter import eager_decompositions, export_model, load, load_for_backend  # noqa: E402
from exporter.cli import progress  # noqa: E402
from exporter.serialize import writer  # noqa: E402
from tools.corpus.zoo import encoder_6x512, gpt_350m, make_case  # noqa: E402
from runtime_ref import Runtime  # noqa: E402

TARGETS = {"save": 0.25, "size": 1.01, "load": 0.05, "lower_core_cold": 0.3, "lower_core_cold_real": 0.3,
           "lower_core_cached": 0.05, "open": 0.02, "load_first_call": 0.5, "ready": 0.05,
           "runtime_large": 1.0,
           "runtime_tiny": 0.6, "methods_size": 1.01, "methods_rss": 1.1, "startup": 1.3}


def print_rows(rows, targets: dict, ours_name: str) -> None:
    """(label, ours, anchor, target key) rows as a markdown table with each ratio and its verdict; seconds
    unless the label says the values are MB, errors or call counts."""
    print(f"| measure | {ours_name} | anchor | ratio | target |")
    print("|---|---|---|---|---|")
    for label, ours, anchor, key in rows:
        ratio = ours / anchor if anchor else float("nan")
        target = targets.get(key)
        verdict = "" if target is None else f"<= {target} {'met' if ratio <= target else 'MISSED'}"
        unit = "" if any(w in label for w in ("MB", "error", "calls")) else " s"
        print(f"| {label} | {ours:.4g}{unit} | {anchor:.4g}{unit} | {ratio:.3f} | {verdict} |")
    sys.stdout.flush()


def median_time(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def interleaved(fns, repeat: int) -> list[float]:
    """Median time of each of ``fns``, measured in turns (the order rotating each round), so that load
    from other tenants of a shared machine hits pt2b and its anchor alike and their ratio stays fair."""
    times = [[] for _ in fns]
    for r in range(repeat):
        for i in [(r + j) % len(fns) for j in range(len(fns))]:
            t = time.perf_counter()
            fns[i]()
            times[i].append(time.perf_counter() - t)
    return [statistics.median(t) for t in times]


def _rss_growth(body: str) -> float:
    """Resident memory growth (MB) of a fresh process that imports torch and pt2b, then runs ``body``."""
    code = f"""
import sys, torch
sys.path.insert(0, {os.getcwd()!r})
import exporter
def rss():
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
before = rss()
{body}
print((rss() - before) / 1024)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return float(out.stdout.strip().splitlines()[-1])


def peak_rss_of_load(path: str, kind: str) -> float:
    """Resident memory growth (MB) of a fresh process that imports torch and loads ``path``."""
    if kind == "pt2b":
        return _rss_growth(f"p = exporter.load({path!r}); sd = p.exported_program().state_dict")
    return _rss_growth(f"ep = torch.export.load({path!r}); sd = ep.state_dict")


def rss_of_methods(paths: list[str], kind: str) -> float:
    """Resident memory growth (MB) of a fresh process that loads ``paths`` (pt2b: every method of each;
    torch: torch.export.load) and reads every weight and buffer of every program."""
    load = ("eps = [m.exported_program() for p in {0!r} for m in exporter.load(p).methods.values()]" if kind == "pt2b"
            else "eps = [torch.export.load(p) for p in {0!r}]").format(paths)
    return _rss_growth(load + "\ntotal = sum(float(t.detach().sum()) for ep in eps for t in [*ep.state_dict.values(), "
                       "*ep.constants.values()] if isinstance(t, torch.Tensor))")


def bench_methods(tmp: str) -> list[tuple[str, float, float, str]]:
    """A decoder deployed as prefill + decode (transformers' static-cache wrapper around a 4-layer Llama
    with 47M parameters, 190 MB, tools/corpus/methods.py) written as ONE artifact, against the same model
    written with one method, and against one torch .pt2 per method."""
    from tools.corpus.methods import decoder_case

    case = decoder_case(vocab_size=32000, hidden_size=512, intermediate_size=1376, num_hidden_layers=4,
                        num_attention_heads=8, num_key_value_heads=4)
    both, alone = os.path.join(tmp, "methods.pt2b"), os.path.join(tmp, "prefill.pt2b")
    export_model(case.methods, both, strict=case.strict)
    export_model({"prefill": case.methods["prefill"]}, alone, strict=case.strict)
    pt2 = []
    for name in case.methods:
        pt2.append(os.path.join(tmp, f"{name}.pt2"))
        torch.export.save(case.export(name), pt2[-1])
    size = os.path.getsize
    return [("file size (MB), prefill + decode vs prefill alone", size(both) / 1e6, size(alone) / 1e6, "methods_size"),
            ("file size (MB), prefill + decode vs a torch .pt2 per method", size(both) / 1e6,
             sum(map(size, pt2)) / 1e6, ""),
            ("RSS growth (MB), load every method, read every weight: vs prefill alone",
             rss_of_methods([both], "pt2b"), rss_of_methods([alone], "pt2b"), "methods_rss"),
            ("RSS growth (MB), the same vs torch.export.load of a .pt2 per method",
             rss_of_methods([both], "pt2b"), rss_of_methods(pt2, "torch"), "")]


class Chain(torch.nn.Module):
    """A tiny-tensor graph where per-op overhead dominates: 100 dependent adds on 1 element."""

    def forward(self, x):
        for _ in range(100):
            x = x + 1.0
        return x


def tiny_case():
    return make_case("mlp").__class__(name="chain100", model=Chain(), args=(torch.ones(1),))


class InstanceNorm(torch.nn.Module):
    def forward(self, x):
        return torch.nn.functional.instance_norm(x)


def instance_norm_large():
    """Where validation's own work once dominated (issue 37, case 5): instance norm in float16 on a
    1x32x1,048,576 input (64 MB), a single op whose two programs run in a fraction of a second."""
    return make_case("mlp").__class__(name="instance_norm_large", model=InstanceNorm(),
                                      args=(torch.randn(1, 32, 1 << 20, dtype=torch.float16),))


def installed_env(tmp: str, *warm: list[str]) -> dict[str, str]:
    """The environment for timing a fresh interpreter as an installed package runs: with bytecode.
    pip compiles a wheel's modules when it installs them, but an editable checkout on a machine that
    sets PYTHONDONTWRITEBYTECODE (this one does) would compile pt2b's from source at every start, and
    not torch's. Bytecode goes to a folder under ``tmp``; each ``warm`` command runs once to fill it."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env["PYTHONPYCACHEPREFIX"] = os.path.join(tmp, "pycache")
    for cmd in warm:
        subprocess.run(cmd, check=True, capture_output=True, env=env)
    return env


def bench_imports(repeat: int, tmp: str) -> list[tuple[str, float, float, str]]:
    """Start-up: each command in a fresh interpreter, against `python -c "import torch"` measured in
    turns with it (target: within 1.3x)."""
    path = os.path.join(tmp, "startup.pt2b")
    export_model(torch.nn.Linear(4, 4), (torch.randn(2, 4),), path)
    cli = [sys.executable, "-m", "exporter"]
    commands = {"import torch": [sys.executable, "-c", "import torch"],
                "import exporter": [sys.executable, "-c", "import exporter"],
                "import runtime_ref": [sys.executable, "-c", "import runtime_ref"],
                "pt2b --version": cli + ["--version"],
                "pt2b inspect (a small artifact)": cli + ["inspect", path]}
    env = installed_env(tmp, *commands.values())
    fns = [lambda c=c: subprocess.run(c, check=True, capture_output=True, env=env) for c in commands.values()]
    times = dict(zip(commands, interleaved(fns, repeat)))
    anchor = times.pop("import torch")
    return [(name, t, anchor, "startup") for name, t in times.items()]


def bench_model(case, repeat: int, tmp: str) -> list[tuple[str, float, float, str]]:
    def step(what):  # a line under the model's bar, on a terminal
        return progress.status(f"{case.name}: {what}")

    rows = []
    args, kwargs = case.args, case.kwargs or {}
    with step("export"):
        ep = torch.export.export(copy.deepcopy(case.model), args, kwargs, dynamic_shapes=case.dynamic_shapes)
    pt2, pt2b = os.path.join(tmp, "m.pt2"), os.path.join(tmp, "m.pt2b")
    with step("save"):
        ours, t_save = interleaved([lambda: writer.write_artifact(ep, pt2b, ir_level="training"),
                                    lambda: torch.export.save(ep, pt2)], repeat)
        rows.append(("save (write step)", ours, t_save, "save"))
        e2e_t = median_time(lambda: torch.export.save(torch.export.export(case.model, args, kwargs,
                                                                          dynamic_shapes=case.dynamic_shapes), pt2), 1)
        e2e_o = median_time(lambda: export_model(case.model, args, pt2b, kwargs=case.kwargs,
                                                 dynamic_shapes=case.dynamic_shapes), 1)
        rows.append(("export + save end to end", e2e_o, e2e_t, ""))
        rows.append(("file size (MB)", os.path.getsize(pt2b) / 1e6, os.path.getsize(pt2) / 1e6, "size"))
    with step("load"):
        # load() checks the whole file; the fx graph is built on first use (the next rows)
        o_load, t_load = interleaved([lambda: load(pt2b), lambda: torch.export.load(pt2)], repeat)
        rows.append(("load (undecomposed; every check, the graph built on first use)", o_load, t_load, "load"))
        o_open, _ = interleaved([lambda: load(pt2b).ops(), lambda: None], repeat)
        rows.append(("open: load() + ops()", o_open, t_load, "open"))

        def first_call(prog):
            with torch.no_grad():
                return prog(*copy.deepcopy(args), **copy.deepcopy(kwargs))

        o_first, t_first = interleaved([lambda: first_call(load(pt2b)),
                                        lambda: first_call(torch.export.load(pt2).module())], repeat)
        rows.append(("load + first call (undecomposed)", o_first, t_first, "load_first_call"))
        rows.append(("load RSS growth (MB)", peak_rss_of_load(pt2b, "pt2b"), peak_rss_of_load(pt2, "pt2"), ""))
    with step("lowering"):
        # the lowering itself (torch's run_decompositions validates nothing), then with validation
        o_low, t_low = interleaved([lambda: load_for_backend(pt2b, "core", cache=False, validate=False),
                                    lambda: torch.export.load(pt2).run_decompositions()], repeat)
        rows.append(("load_for_backend('core') cold, validate=False", o_low, t_low, "lower_core_cold"))
        o_val = median_time(lambda: load_for_backend(pt2b, "core", cache=False), repeat)
        rows.append(("load_for_backend('core') cold, validated (the default)", o_val, t_low, ""))
        load_for_backend(pt2b, "core", cache=True)  # fills the lowering cache (a folder under tmp)
        o_hit = median_time(lambda: load_for_backend(pt2b, "core", cache=True), repeat)
        assert load_for_backend(pt2b, "core", cache=True).from_cache
        rows.append(("load_for_backend('core') cached", o_hit, t_low, "lower_core_cached"))
        lowered = load_for_backend(pt2b, "core", cache=False)
        low_b, low_t = os.path.join(tmp, "m.core.pt2b"), os.path.join(tmp, "m.core.pt2")
        export_model(lowered, path=low_b)
        torch.export.save(lowered.exported_program(), low_t)

        def ready_pt2b():
            with torch.no_grad():
                return Runtime(load(low_b))(*copy.deepcopy(args), **copy.deepcopy(kwargs))

        def ready_torch():
            with torch.no_grad():
                return torch.export.load(low_t).module()(*copy.deepcopy(args), **copy.deepcopy(kwargs))

        o_ready, t_ready = interleaved([ready_pt2b, ready_torch], repeat)
        probe = Runtime(load(low_b))  # which plan runtime_ref made: straight from the table, or through the program
        how = "planned from the table" if probe.planned_from == "table" else f"through the program: {probe.not_from_table}"
        rows.append((f"ready to run: lowered artifact to first output (runtime_ref, {how})", o_ready, t_ready, "ready"))
    with step("runtime"):
        gm = lowered.exported_program().module()
        rt = Runtime(lowered)
        with torch.no_grad():
            ref = gm(*args, **kwargs)
            out = rt(*args, **kwargs)
            eager = case.model(*args, **kwargs)
            assert torch.allclose(out, ref, rtol=1e-4, atol=1e-4), "runtime_ref differs from the GraphModule"
            assert torch.allclose(load(pt2b)(*args, **kwargs), ep.module()(*args, **kwargs)), "load differs from anchor"
            n = max(repeat * 4, 20)
            t_rt, t_gm, t_eager = interleaved([lambda: rt(*args, **kwargs), lambda: gm(*args, **kwargs),
                                               lambda: case.model(*args, **kwargs)], n)
        kind = "runtime_tiny" if case.name == "chain100" else "runtime_large"
        rows.append(("runtime_ref vs lowered GraphModule", t_rt, t_gm, kind))
        rows.append(("runtime_ref vs eager", t_rt, t_eager, ""))
    with step("eager mode"):
        rows += bench_eager_mode(case, n, t_eager)
    del eager
    return rows


def sweep(layers: list[int], tmp: str) -> list[dict]:
    """save / load / load_for_backend('core') cold of the 512-wide encoder at each layer count, pt2b and
    anchor, with the least-squares cost per added layer."""
    out = []
    for n in progress.track(layers, "layer sweep", unit="size", label=lambda n: f"{n} layers"):
        case = encoder_6x512(n)
        ep = torch.export.export(case.model, case.args)
        pt2, pt2b = os.path.join(tmp, f"s{n}.pt2"), os.path.join(tmp, f"s{n}.pt2b")
        row = {"layers": n, "params_M": sum(p.numel() for p in case.model.parameters()) / 1e6}
        row["save"], row["save_anchor"] = interleaved([lambda: writer.write_artifact(ep, pt2b, ir_level="training"),
                                                       lambda: torch.export.save(ep, pt2)], 3)
        row["load"], row["load_anchor"] = interleaved([lambda: load(pt2b), lambda: torch.export.load(pt2)], 3)
        row["lower"], row["lower_anchor"] = interleaved([lambda: load_for_backend(pt2b, "core", cache=False),
                                                         lambda: torch.export.load(pt2).run_decompositions()], 1)
        with torch.no_grad():
            assert torch.allclose(load(pt2b)(*case.args), ep.module()(*case.args), rtol=1e-4, atol=1e-4)
        out.append(row)
    keys = ["save", "save_anchor", "load", "load_anchor", "lower", "lower_anchor"]
    print("\n## layer sweep: 512-wide encoder (seconds; median of 3, lowering 1)")
    print("| layers | params (M) | " + " | ".join(keys) + " |")
    print("|---" * (len(keys) + 2) + "|")
    for r in out:
        print(f"| {r['layers']} | {r['params_M']:.1f} | " + " | ".join(f"{r[k]:.3f}" for k in keys) + " |")
    if len(out) > 1:
        xs = [r["layers"] for r in out]
        mx = statistics.mean(xs)
        slope = {k: sum((x - mx) * (r[k]) for x, r in zip(xs, out)) / sum((x - mx) ** 2 for x in xs) for k in keys}
        print("| s per layer | | " + " | ".join(f"{slope[k]:.4f}" for k in keys) + " |")
    return out


def _close(out) -> dict:
    """Tolerances for comparing a decomposed run with eager, by the output's dtype (half precision rounds
    each decomposed step)."""
    return {"rtol": 1e-2, "atol": 1e-2} if out.dtype in (torch.float16, torch.bfloat16) else {"rtol": 1e-4, "atol": 1e-4}


def bench_eager_mode(case, n: int, t_eager: float) -> list:
    """eager_decompositions('core') against plain eager: the first call (every op decided) and the
    steady state (decisions cached), outputs checked against plain eager."""
    args, kwargs = case.args, case.kwargs or {}
    with torch.no_grad():
        mode = eager_decompositions("core")
        t = time.perf_counter()
        with mode:
            out = case.model(*args, **kwargs)
        first = time.perf_counter() - t
        assert torch.allclose(out, case.model(*args, **kwargs), **_close(out)), "eager mode differs"

        def steady():
            with mode:
                case.model(*args, **kwargs)
        t_steady = median_time(steady, n)
    return [("eager_decompositions('core') first call vs eager", first, t_eager, ""),
            ("eager_decompositions('core') steady vs eager", t_steady, t_eager, "")]


REAL_STEPS = ("save", "load", "lower_core_cold", "lower_core_default")


def real_model_names(spec: str) -> list[str]:
    from tools.corpus.programs import transformers_sample

    return transformers_sample() if spec == "sample" else [n for n in spec.split(",") if n]


def bench_real_model(name: str, repeat: int, tmp: str) -> dict:
    """bench_captured on one architecture of the real-model corpus, captured as the corpus captures it."""
    from tools.corpus.programs import capture_real
    from tools.corpus.transformers_zoo import make_case as make_real

    case = make_real(name)
    return bench_captured(name, capture_real(case), case.args, case.kwargs or {}, repeat, tmp)


def bench_family(name: str, repeat: int, tmp: str) -> dict:
    """bench_captured on a model of another family (bench/families.py), exported statically."""
    from bench.families import FAMILIES

    try:
        model, args, kwargs = FAMILIES[name]()
    except ImportError as e:
        return {"name": name, "ratios": {}, "seconds": {}, "skipped": {"build": f"not installed: {e}"}}
    return bench_captured(name, torch.export.export(model, args, kwargs), args, kwargs, repeat, tmp)


def bench_captured(name: str, ep, args, kwargs, repeat: int, tmp: str) -> dict:
    """pt2b / torch ratios of save (write step), load and cold core lowering (validate=False, and the
    default, validated) of one captured program; a step either side cannot do is left out with the reason."""
    pt2, pt2b = os.path.join(tmp, "r.pt2"), os.path.join(tmp, "r.pt2b")
    out = {"name": name, "ratios": {}, "seconds": {}, "skipped": {}}
    ours, theirs = interleaved([lambda: writer.write_artifact(ep, pt2b, ir_level="training"),
                                lambda: torch.export.save(ep, pt2)], repeat)
    out["seconds"]["save"] = (ours, theirs)
    o_load, t_load = interleaved([lambda: load(pt2b), lambda: torch.export.load(pt2)], repeat)
    out["seconds"]["load"] = (o_load, t_load)
    with torch.no_grad():  # the benchmark times equal work: pt2b's load gives torch's module's outputs
        a, k = copy.deepcopy(args), copy.deepcopy(kwargs)
        got = load(pt2b)(*a, **k)
        a, k = copy.deepcopy(args), copy.deepcopy(kwargs)
        want = ep.module()(*a, **k)
        for x, y in zip(torch.utils._pytree.tree_leaves(got), torch.utils._pytree.tree_leaves(want)):
            assert not torch.is_tensor(x) or torch.equal(x, y), f"{name}: load differs from torch.export's module"
    try:
        torch.export.load(pt2).run_decompositions()
        validation = load_for_backend(pt2b, "core", cache=False).validation
    except Exception as e:  # noqa: BLE001 -- a lowering either side cannot do is reported, not timed
        out["skipped"]["lower_core_cold"] = f"{type(e).__name__}: {str(e).splitlines()[0][:120]}"
    else:
        default, unvalidated, torchs = interleaved(
            [lambda: load_for_backend(pt2b, "core", cache=False),
             lambda: load_for_backend(pt2b, "core", cache=False, validate=False),
             lambda: torch.export.load(pt2).run_decompositions()], repeat)
        out["seconds"]["lower_core_cold"] = (unvalidated, torchs)
        out["seconds"]["lower_core_default"] = (default, torchs)
        out["validation"] = validation.describe()
    out["ratios"] = {k: o / t for k, (o, t) in out["seconds"].items()}
    return out


def print_real_models(results: list[dict], repeat: int, what: str = "transformers architectures") -> None:
    print(f"\n## {what} ({len(results)}; median of {repeat}; ratio = pt2b / torch)")
    print("| model | " + " | ".join(REAL_STEPS) + " |")
    print("|---|" + "---|" * len(REAL_STEPS))
    for r in results:
        cells = [f"{r['ratios'][k]:.3f}" if k in r["ratios"] else "n/a" for k in REAL_STEPS]
        print(f"| {r['name']} | " + " | ".join(cells) + " |")
    geo = []
    for k in REAL_STEPS:
        vals = [r["ratios"][k] for r in results if k in r["ratios"]]
        geo.append(f"{statistics.geometric_mean(vals):.3f} (n={len(vals)})" if vals else "n/a")
    print("| **geometric mean** | " + " | ".join(geo) + " |")
    for key, label in (("lower_core_cold", "validate=False"), ("lower_core_default", "the default, validated")):
        lowered = sorted((r for r in results if key in r["ratios"]), key=lambda r: r["ratios"][key], reverse=True)
        if not lowered:
            continue
        ratios = [r["ratios"][key] for r in lowered]
        target = TARGETS["lower_core_cold_real"]
        over = [r["name"] for r in lowered if r["ratios"][key] > 1.0]
        print(f"\ncold core lowering ({label}), pt2b / torch load + run_decompositions: geometric mean "
              f"{statistics.geometric_mean(ratios):.3f} (target <= {target}: "
              f"{'met' if statistics.geometric_mean(ratios) <= target else 'MISSED'}), median "
              f"{statistics.median(ratios):.3f}, {len(over)} of {len(ratios)} above 1.0 (target: none)"
              + (f": {', '.join(over)}" if over else ""))
        print("worst five: " + ", ".join(
            f"{r['name']} {r['ratios'][key]:.3f} ({r['seconds'][key][0]:.2f} s / "
            f"{r['seconds'][key][1]:.2f} s)" for r in lowered[:5]))
    for r in results:
        for k, why in r["skipped"].items():
            print(f"  {r['name']}: {k} not timed: {why}")
        if "validation" in r:
            print(f"  {r['name']}: {r['validation'][:160]}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--models", default="mlp,encoder_6x512,chain100")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--json", help="also write the rows as JSON here")
    ap.add_argument("--real-models", default="", help="'sample' (the test sample) or comma-separated case names "
                                                       "of the real-model corpus; prints geometric-mean ratios")
    ap.add_argument("--families", default="", help="'all' or comma-separated names of bench/families.py (conv "
                                                   "classifiers, diffusion U-Nets): save, load and cold lowering ratios")
    ap.add_argument("--sweep", default="", help="layer counts of the 512-wide encoder to time save/load/lower "
                                                "over, e.g. 1,2,4,8,12 (growth with model size)")
    ap.add_argument("-q", "--quiet", action="store_true",
                    help="no progress bars (drawn on stderr only when it is a terminal)")
    ns = ap.parse_args(argv)
    progress.set_quiet(True if ns.quiet else None)
    with progress.torch_internals_quiet():  # torch's warnings about its own internals
        return _run(ns)


def _run(ns) -> int:
    factories = {"mlp": lambda: make_case("mlp"), "encoder_6x512": encoder_6x512, "chain100": tiny_case,
                 "gpt_350m": gpt_350m, "llama_methods": None, "instance_norm_large": instance_norm_large,
                 "startup": None}
    all_rows = {}
    with tempfile.TemporaryDirectory() as tmp:
        os.environ["PT2B_CACHE_DIR"] = os.path.join(tmp, "lowering-cache")
        os.environ.pop("PT2B_CACHE", None)
        if ns.sweep:
            all_rows["sweep"] = sweep([int(n) for n in ns.sweep.split(",")], tmp)
        models = [n for n in ns.models.split(",") if n]
        for name in progress.track(models, "benchmarking", unit="model", label=str):
            repeat = min(ns.repeat, 2) if name == "gpt_350m" else ns.repeat  # 1.4 GB: each step takes seconds
            if name == "llama_methods":  # one artifact with two methods: sizes and memory, no timing
                rows, repeat = bench_methods(tmp), 1
            elif name == "startup":
                rows = bench_imports(repeat, tmp)
            else:
                rows = bench_model(factories[name](), repeat, tmp)
            all_rows[name] = rows
            with progress.printing():
                print(f"\n## {name}  (median of {repeat}; ratio = pt2b / anchor)")
                print_rows(rows, TARGETS, "pt2b")
        if ns.real_models:
            import warnings

            warnings.filterwarnings("ignore")  # transformers' and torch's chatter while building and tracing
            real = [bench_real_model(n, ns.repeat, tmp)
                    for n in progress.track(real_model_names(ns.real_models), "real models", unit="model", label=str)]
            all_rows["real_models"] = real
            print_real_models(real, ns.repeat)
        if ns.families:
            import warnings

            from bench.families import family_names

            warnings.filterwarnings("ignore")
            fam = [bench_family(n, ns.repeat, tmp)
                   for n in progress.track(family_names(ns.families), "other families", unit="model", label=str)]
            all_rows["families"] = fam
            print_real_models(fam, ns.repeat, "other families: torchvision, timm, diffusers")
    if ns.json:
        with open(ns.json, "w") as f:
            json.dump(all_rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
