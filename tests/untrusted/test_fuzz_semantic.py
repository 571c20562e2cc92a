"""The fuzzer's semantic mode (tools/fuzz/semantic.py; `python -m tools.fuzz --semantic`): mutations of
the decoded program's meaning (callables and targets, tables shared many times, grown symbolic
expressions, sizes and strides at int64's limits, many long guards), each a valid FlatBuffer with its
checksums repaired, run through every entry point (load, check, first call, verify, inspect,
load_for_backend, runtime_ref) in a worker with a time and memory limit and its cwd a watched
temporary folder. tools/fuzz/semantic_oracle.py's docstring has the rule: an ArtifactError or success;
a changed program may also be refused by torch or the lowering while it runs; a timeout, a memory
blow-up, any other exception, a signal, any side effect (the canary file, a new file, a process spawned),
a change of torch's process-global state, a terminal control character in what a phase prints or in a pt2b
error's message, and resident memory beyond the bound for the file's size fail.

Run alone: ``pytest tests/untrusted/test_fuzz_semantic.py`` (the bounded campaign: ``-k semantic_campaign``;
the concrete attacks: ``-k attack``).

Three parts:
  - a bounded semantic campaign that must have no findings (a finding not fixed yet is a KNOWN_BUGS
    entry, one strict xfail per mutant, as in tests/untrusted/test_fuzz.py);
  - faults planted in the same worker's phases (tests/support/planted_faults.py), one per class of
    finding the oracle claims beyond exceptions: each must come back as that finding;
  - one regression per attack family (tools/fuzz/semantic_build.py ATTACKS, the builders the mutator
    uses): the concrete attack file must be refused with a typed ArtifactError subclass by load or the
    graph's first use, by `pt2b verify` and by load_for_backend, in bounded time, with no side effect.
"""

from __future__ import annotations

import os

import pytest

from tools.fuzz import observe  # noqa: E402
from tools.fuzz.campaign import run_campaign  # noqa: E402
from tools.fuzz.cli import main  # noqa: E402
from tools.fuzz.seeds import export_seeds  # noqa: E402
from tools.fuzz.semantic import ATTACK_SEED, SEMANTIC_KINDS, SemanticMutator, family  # noqa: E402
from tools.fuzz.semantic_build import ATTACKS  # noqa: E402
from tools.fuzz.semantic_oracle import allowed  # noqa: E402

from tests.support import planted_faults

MODELS = ("mlp", "cond", "dynamic_shapes")
SEED = 0
N_MUTANTS = int(os.environ.get("PT2B_SEMANTIC_MUTANTS", "60"))
TIMEOUT_S = 8.0  # per mutant: every phase of these small seeds takes well under a second
ATTACK_BOUND_S = 5.0  # a third of the attack worker's timeout: a hang guard, never a speed assertion

_GUARDS = ("guards_code is bounded per guard (MAX_EXPR_LEN) but not in count or total size: hundreds of "
           "~4 KB shape guards pass check_guards and cost seconds at each of check, the first call (ep.module() "
           "compiles them), verify and load_for_backend")

_SCHEMA_NESTING = ("an op-table schema string whose argument type nests thousands deep overflows the stack of "
                   "torch's C++ schema parser: the worker died of SIGSEGV in load; now its nesting is bounded before "
                   "torch._C.parse_schema sees it")
_ESCAPES = ("a recorded schema with ESC/BEL/C1 characters was quoted raw in SchemaDriftError's message (load, "
            "load_for_backend), acting on the terminal it is printed to; now escaped")

# (seed, index) -> a bug a semantic mutant of MODELS finds that is not fixed yet: one strict xfail each.
KNOWN_BUGS: dict[tuple[int, int], str] = {}
# (seed, index) -> a bug a semantic mutant found, fixed since: replayed in the bounded campaign, must be allowed
FIXED: dict[tuple[int, int], str] = {
    (SEED, 19): _GUARDS + " (500 guards of ~4000 chars: timeout); now untrusted.MAX_GUARDS_TEXT",
    (SEED, 35): _GUARDS + " (500 guards of ~4000 chars: timeout); now untrusted.MAX_GUARDS_TEXT",
    (11, 258): ("cond's target swapped for with_effects, its subgraph where with_effects takes its operator: "
                "AssertionError inside torch at the first call; now untrusted.ALLOWED_HOPS' callable places"),
    (12, 943): ("a new with_effects node over aten.view (an aliasing op without effects): AssertionError inside "
                "torch at the first call; now refused unless torch's has_effects holds for the op"),
    (11, 371): ("cond's target swapped for wrap_with_set_grad_enabled, one subgraph too many: KeyError "
                "false_graph_0 in load_for_backend; now untrusted.ALLOWED_HOPS' callable places"),
    (SEED, 14): _SCHEMA_NESTING + " (Future(...) 65530 characters)",
    (SEED, 16): _SCHEMA_NESTING + " (Dict(str, ...) 65527 characters)",
    (SEED, 30): _ESCAPES + " (OSC 52 in a default string)",
    (21, 447): ("an op-table schema whose int default is 40 digits: torch's parser raised IndexError (stoll) "
                "out of load; now a SchemaDriftError"),
    (21, 595): ("an op-table schema whose float default is 1e999...: IndexError (stod) out of load; now a "
                "SchemaDriftError"),
    (21, 2514): ("a node's device string holding CSI and OSC sequences: the CorruptArtifactError's message and its "
                 "chained cause quoted them raw; now errors.py escapes messages and the cause is not chained"),
}

# attack -> what it does to pt2b when it is not refused
ATTACK_DOC = {
    "foreach_map_system": "load_for_backend traces foreach_map(torch.os.system, 'touch ...'): a shell command runs",
    "torch_save": "tracing calls torch.save(tensor, 'pt2b_fuzz_saved.pt'): a file is written",
    "shared_methods": "1000 Method tables over one exported_program: each method's graph walked and checked again",
    "shared_subgraph": "a DAG of 40 cond levels over shared Graph tables: 2**40 subgraph visits",
    "expr_max": "Max over ~580 symbols with a range each: sympy compares Max arguments pairwise",
    "expr_nested": "Max(Min(Max(...))) ~340 deep: the parser and sympy recurse",
    "expr_floordiv": ("FloorDiv(FloorDiv(...), s) 64 deep in a TensorMeta size, ranges [0, oo): within the depth "
                      "and Max/Min limits, and torch's symbolic_shapes._fast_expand takes exponential time building "
                      "the fake tensor (16 deep: over 15 s)"),
    "expr_product": ("s1000*s1001*...*s1031 (191 characters) as a parameter's TensorMeta size, ranges [0, oo): "
                     "torch's symbolic_shapes expands it while building the fake tensor (24 symbols: over 15 s)"),
    "huge_weight": "a weight record of 2**124 elements (stride 0): overflows int64 in torch",
    "huge_example_input": "an example input of 2**40 rows (stride 0): validation computes over all of them",
    "huge_meta": "TensorMeta of 2**124 elements: fake tensors overflow int64",
    "many_guards": _GUARDS,
}
assert set(ATTACK_DOC) == set(ATTACKS)


@pytest.fixture(scope="module")
def seeds_dir(tmp_path_factory):
    return str(tmp_path_factory.mktemp("semantic_fuzz_seeds"))


# planted faults (tests/support/planted_faults.py) ride along in the bounded campaign's worker: mutant
# PLANT_BASE + 2k has the k-th planted, PLANT_BASE + 2k + 1 runs after it in the same worker
PLANT_BASE = 1_000_000
PLANTED = {name: (SEED, PLANT_BASE + 2 * k) for k, name in enumerate(planted_faults.PLANTS)}


@pytest.fixture(scope="module")
def campaign(seeds_dir):
    """The bounded campaign, the planted faults, then the known bugs (a worker they kill is restarted
    only while jobs are left: crashes last)."""
    jobs = [(SEED, i) for i in range(N_MUTANTS)]
    jobs += [k for k in FIXED if k not in set(jobs)]
    crashing = {PLANTED["segfault"]}
    for job in PLANTED.values():
        if job not in crashing:
            jobs += [job, (job[0], job[1] + 1)]
    jobs += [k for k in KNOWN_BUGS if k not in set(jobs)] + sorted(crashing)
    plant = {job: (planted_faults.PLANTS[name][0], f"{planted_faults.__name__}:{name}")
             for name, job in PLANTED.items()}
    camp = run_campaign(SEED, 0, indices=jobs, workers=1, models=MODELS, seeds_dir=seeds_dir, timeout=TIMEOUT_S,
                        mem_gib=6, keep_results=True, semantic=True, plant=plant)
    camp.by_job = {(r["seed"], r["index"]): r for r in camp.results}
    assert len(camp.by_job) == len(jobs)
    return camp


@pytest.fixture(scope="module")
def attacks(seeds_dir):
    jobs = [(ATTACK_SEED, i) for i in range(len(ATTACKS))]
    camp = run_campaign(ATTACK_SEED, 0, indices=jobs, workers=1, models=MODELS, seeds_dir=seeds_dir,
                        timeout=max(TIMEOUT_S, 3 * ATTACK_BOUND_S), mem_gib=6, keep_results=True, semantic=True)
    by_name = {list(ATTACKS)[r["index"]]: r for r in camp.results}
    assert set(by_name) == set(ATTACKS)
    return by_name


def _describe(r) -> str:
    return (f"{r.get('kind')} ({r.get('model')}: {r.get('desc')}) -> {r['outcome']} in {r.get('phase')} "
            f"after {r.get('seconds', -1):.1f} s: {r.get('detail', '')[:300]}\n  phases: {r.get('phases')}\n"
            f"  phase seconds: {r.get('phase_seconds')}\n  side effects: {r.get('side_effects')}\n"
            f"  replay: python -m tools.fuzz --replay={r['seed']}:{r['index']} --semantic --run\n"
            f"{r.get('traceback', '')[-1500:]}")


def test_semantic_campaign_has_no_findings(campaign):
    bad = [r for key, r in sorted(campaign.by_job.items())
           if not r["allowed"] and key not in KNOWN_BUGS and key[1] < PLANT_BASE]
    assert not bad, f"{len(bad)} disallowed outcome(s):\n" + "\n".join(_describe(r) for r in bad)


def test_semantic_campaign_reaches_every_family(campaign):
    """The bounded run is not vacuous: every family drawn, some mutants refused, some run to the end."""
    results = [campaign.by_job[(SEED, i)] for i in range(N_MUTANTS)]
    assert {family(r["kind"]) for r in results} == {family(k) for k in SEMANTIC_KINDS}
    outcomes = {r["outcome"] for r in results}
    assert "ok" in outcomes and "artifact_error:CorruptArtifactError" in outcomes
    ran = [r for r in results if r.get("phases", {}).get("run") == "ok"]
    assert ran, "no mutant got through load_for_backend and runtime_ref"


@pytest.mark.parametrize(
    "job", [pytest.param(k, id=f"{k[0]}:{k[1]}", marks=pytest.mark.xfail(strict=True, reason=reason))
            for k, reason in sorted(KNOWN_BUGS.items())]
    or [pytest.param(None, marks=pytest.mark.skip(reason="no known unfixed bug"))])
def test_semantic_known_bug(campaign, job):
    r = campaign.by_job[job]
    assert r["allowed"], _describe(r)


@pytest.mark.parametrize("job", sorted(FIXED), ids=lambda k: f"{k[0]}:{k[1]}")
def test_semantic_fixed_bug_stays_fixed(campaign, job):
    r = campaign.by_job[job]
    assert r["allowed"], FIXED[job] + "\n" + _describe(r)


@pytest.mark.parametrize("name", list(planted_faults.PLANTS))
def test_oracle_reports_a_planted_fault(campaign, name):
    """Each class of finding the oracle claims (state_change, terminal_escape, memory_bound,
    signal:<NAME>) comes back from a fault planted in the phase that class watches, naming what happened."""
    phase, outcome, words = planted_faults.PLANTS[name]
    r = campaign.by_job[PLANTED[name]]
    why = f"planted {name} in {phase}:\n" + _describe(r)
    assert (r["outcome"], r["phase"]) == (outcome, phase) and not r["allowed"], why
    assert all(w in r["detail"] for w in words), why
    if outcome == "memory_bound":
        assert r["rss_growth"] > observe.rss_bound(r["disk_bytes"]), why
    after = campaign.by_job.get((SEED, PLANTED[name][1] + 1))
    if after is not None:  # the next mutant in the same worker starts from the worker's own state again
        assert "state_change" not in (after.get("phases") or {}).values(), _describe(after)
        assert after["rss_growth"] <= observe.rss_bound(after["disk_bytes"]), _describe(after)


@pytest.mark.parametrize("text", [b"\x1b[2J", b"a\x07", b"x\xc2\x9b2J", b"x\x9b2J", b"\x00", b"\x0b", b"\x1f"])
def test_terminal_controls_are_found(text):
    assert observe.terminal_controls(text)


def test_plain_text_has_no_terminal_controls():
    assert observe.terminal_controls("a\tb\r\nc ünïcødé → ok\x7f\n".encode()) == ""


def test_state_changes_are_named_and_set_back():
    import torch

    before = observe.snapshot()
    try:
        torch.set_grad_enabled(False)
        torch.set_default_dtype(torch.float64)
        torch.set_float32_matmul_precision("medium")
        torch.amp.autocast_mode._enter_autocast("cpu", torch.bfloat16, True, None)
        names = {d.split(":")[0] for d in observe.changes(before, observe.snapshot())}
        assert {"grad_enabled", "default_dtype", "float32_matmul_precision", "autocast_enabled[cpu]",
                "autocast_nesting"} <= names
        assert observe.restore(before) == [] and observe.changes(before, observe.snapshot()) == []
    finally:
        observe.restore(before)


@pytest.mark.parametrize("name", list(ATTACKS))
def test_attack_is_refused(attacks, name):
    """The concrete attack: a typed ArtifactError (CorruptArtifactError expected) from load or the graph's
    first use (check), from `pt2b verify` and from load_for_backend; no timeout (the worker's hang guard); no side effect."""
    r = attacks[name]
    why = f"{name}: {ATTACK_DOC[name]}\n" + _describe(r)
    phases = r.get("phases", {})
    assert not r.get("side_effects"), why
    assert r["outcome"] not in ("timeout", "memory", "crash"), why
    first_use = phases.get("load") if phases.get("load") != "ok" else phases.get("check")
    for label, outcome in (("load/check", first_use), ("verify", phases.get("verify")),
                           ("load_for_backend", phases.get("load_for_backend"))):
        assert outcome is not None and outcome.startswith("artifact_error:") and outcome != "artifact_error:ArtifactError", \
            f"{label}: {outcome}\n{why}"
    assert r["allowed"], why


def test_semantic_rule():
    assert allowed("ok", True, "run") and allowed("artifact_error:CorruptArtifactError", True, "check")
    for o in ("mismatch", "run_error:TypeError", "lowering_error:OpsetError"):
        assert allowed(o, True, "load_for_backend") and allowed(o, True, "call")
        assert not allowed(o, False, "call") and not allowed(o, True, "check") and not allowed(o, True, "verify")
    for o in ("timeout", "memory", "crash", "other:KeyError", "other:SystemExit", "other:CodeExecution",
              "side_effect:NewFile", "fuzzer_error"):
        for phase in ("load", "check", "call", "verify", "inspect", "load_for_backend", "run"):
            assert not allowed(o, True, phase)


def test_semantic_mutants_are_deterministic_and_replayable(seeds_dir, tmp_path):
    paths = export_seeds(MODELS, seeds_dir)
    seeds = {n: open(p, "rb").read() for n, p in paths.items()}
    a, b = SemanticMutator(seeds), SemanticMutator(seeds)
    for i in (0, 1, 7, 123, 4567):
        ma, mb = a.mutant(SEED, i), b.mutant(SEED, i)
        assert (ma.data, ma.desc, ma.kind, ma.model, ma.verify) == (mb.data, mb.desc, mb.kind, mb.model, mb.verify)
    assert len({a.mutant(SEED, i).data for i in range(20)}) > 15
    out = tmp_path / "m.pt2b"
    rc = main(["--semantic", "--replay", f"{SEED}:7", "--out", str(out), "--models", ",".join(MODELS),
               "--seeds-dir", seeds_dir])
    assert rc == 0 and out.read_bytes() == a.mutant(SEED, 7).data
    out = tmp_path / "attack.pt2b"
    rc = main(["--semantic", f"--replay={ATTACK_SEED}:0", "--out", str(out), "--models", ",".join(MODELS),
               "--seeds-dir", seeds_dir])
    assert rc == 0 and out.read_bytes() == a.attack(list(ATTACKS)[0]).data
