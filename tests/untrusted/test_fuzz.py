"""Bounded mutation fuzzing of .pt2b artifacts (the tools/fuzz/ package; the long run is
`python -m tools.fuzz --mutants 100000 --seed 1 --workers 2`).

Every mutant (bit flips, byte runs, truncation at every section boundary, swapped sections, huge
lengths, random garbage, the empty file, checksum-repaired program/header edits and structured
edits of the decoded program) is loaded, run, lowered and run with runtime_ref in a worker process
with a time and memory limit. Allowed outcomes are those of `tools.fuzz.oracle.allowed` (its module
docstring has the rule): an ArtifactError, or success with the seed's outputs; a genuinely changed
program may also mismatch or be refused by lowering/torch while running. Crashes, hangs, memory
blow-ups and any other exception fail.

Every bug a campaign found is kept in FIXED with the mutant that found it and replayed as a
regression test; a bug not fixed yet is in KNOWN_BUGS, one strict xfail per mutant (the bounded run
skips nothing else, and the fix makes the xfail pass, which fails until the entry moves to FIXED).
"""

from __future__ import annotations

import pytest

from tools.fuzz.campaign import run_campaign  # noqa: E402
from tools.fuzz.cli import main  # noqa: E402
from tools.fuzz.mutators import KINDS, Mutator  # noqa: E402
from tools.fuzz.oracle import allowed  # noqa: E402
from tools.fuzz.seeds import export_seeds  # noqa: E402

MODELS = ("mlp", "cond", "buffer_mutation")
SEED = 0
N_MUTANTS = 400
TIMEOUT_S = 10.0

_NAMES_IN_SOURCE = (
    "names from the file (module_call_graph forward_arg_names, parameter/buffer/constant FQNs) reach "
    "generated Python source unescaped in ep.module(): SyntaxError/AttributeError, or code execution; "
    "untrusted.check_program should require identifiers / dotted identifier paths"
)
_MODULE_CALL_GRAPH = (
    "module_call_graph is not validated on load (empty, entry 0 without a signature or with fqn != ''): "
    "ep.module()/runtime_ref fail later with AssertionError/AttributeError"
)
_STATE_NAMES = (
    "tensor records are not cross-checked with the graph signature on load: a renamed constant/buffer "
    "loads, then ep.module() raises KeyError"
)
_REQUIRES_GRAD_DTYPE = (
    "reader.rebuild wraps an integer tensor with requires_grad=True in nn.Parameter: RuntimeError "
    "escapes load() instead of CorruptArtifactError"
)
_EXPR_BOMB = (
    "untrusted.check_expr accepts exponent towers (9**9**9**9): sympify hangs inside load()"
)

_SELF_NAME = (
    "a parameter/buffer FQN whose first component is 'self' passes the name check, and ep.module()'s "
    "generated forward binds it to the local `self` (self = self.self), so the next attribute access "
    "raises AttributeError; untrusted's FQN check should refuse the component 'self'"
)

# (seed, index) -> the bug a mutant of MODELS found, now fixed; each is run as a regression
# (those >= N_MUTANTS in addition to the range) and must have an allowed outcome.
FIXED: dict[tuple[int, int], str] = {
    (SEED, 36): _MODULE_CALL_GRAPH + " (fqn '' -> text: AssertionError in ep.module())",
    (SEED, 161): _MODULE_CALL_GRAPH + " (entry 0 replaced by a submodule entry: AssertionError)",
    (SEED, 297): _NAMES_IN_SOURCE + " (a name with a NUL byte: SyntaxError)",
    (SEED, 529): _STATE_NAMES + " (tensor record 'scale' renamed: KeyError)",
    (SEED, 994): _NAMES_IN_SOURCE + " (constant FQN with a quote: AttributeError from generated getattr)",
    (SEED, 1464): _NAMES_IN_SOURCE + " (forward_arg_names 'torch.ops...': SyntaxError)",
    (SEED, 3206): _NAMES_IN_SOURCE + " (parameter FQN breaks out of getattr(self, \"...\"): CODE EXECUTION)",
    (SEED, 14095): _NAMES_IN_SOURCE + " (forward_arg_names with a triple quote: CODE EXECUTION)",
    (SEED, 24060): _REQUIRES_GRAD_DTYPE + " (parameter dtype float -> int8)",
    (SEED, 25483): _EXPR_BOMB + " (timeout in load)",
    (2, 6360): _SELF_NAME + " (rename 'fc1.weight' -> 'self')",
}



# (seed, index) -> a bug a mutant of MODELS finds that is NOT fixed yet: one strict xfail each, so the
# fix turns it into a failure until the entry moves to FIXED.
KNOWN_BUGS: dict[tuple[int, int], str] = {}


@pytest.fixture(scope="module")
def campaign(tmp_path_factory):
    seeds_dir = str(tmp_path_factory.mktemp("fuzz_seeds"))
    jobs = [(SEED, i) for i in range(N_MUTANTS)]
    jobs += [k for k in (*FIXED, *KNOWN_BUGS) if k not in set(jobs)]
    camp = run_campaign(SEED, 0, indices=jobs, workers=2, models=MODELS, seeds_dir=seeds_dir,
                        timeout=TIMEOUT_S, mem_gib=6, keep_results=True)
    camp.seeds_dir = seeds_dir
    camp.by_job = {(r["seed"], r["index"]): r for r in camp.results}
    assert len(camp.by_job) == len(jobs)
    return camp


def _describe(r) -> str:
    return (f"seed {r['seed']} mutant {r['index']} ({r.get('model')}, {r.get('kind')}: {r.get('desc')}; "
            f"verify={r.get('verify')}, preset={r.get('preset')}) -> {r['outcome']} in {r.get('phase')} "
            f"(changed={r.get('changed')}): {r.get('detail', '')[:300]}\n  replay: {r.get('replay', '')}\n"
            f"{r.get('traceback', '')[-1500:]}")


def test_every_mutant_outcome_is_allowed(campaign):
    bad = [r for key, r in sorted(campaign.by_job.items()) if not r["allowed"] and key not in KNOWN_BUGS]
    assert not bad, f"{len(bad)} disallowed outcome(s):\n" + "\n".join(_describe(r) for r in bad)


def test_campaign_reaches_every_layer(campaign):
    """The bounded run is not vacuous: every mutation kind ran, some mutants loaded and matched,
    some were refused, and checksum-repaired ones got past the checksums."""
    results = [campaign.by_job[(SEED, i)] for i in range(N_MUTANTS)]
    kinds = {r["kind"] for r in results}
    assert kinds == set(KINDS) | {"struct_guards"}, f"kinds never drawn: {set(KINDS) - kinds}"
    guards = [r for r in results if r["kind"] == "struct_guards"]
    assert any(r["outcome"] == "ok_equal" or r.get("phase") not in (None, "load") for r in guards)  # some load
    outcomes = {r["outcome"] for r in results}
    assert "ok_equal" in outcomes and "artifact_error:CorruptArtifactError" in outcomes
    assert "artifact_error:NotAnArtifactError" in outcomes
    past_checksums = [r for r in results if r["kind"] in ("struct_fb", "struct_schema", "repaired_program")
                      and (r["outcome"] == "ok_equal" or r.get("phase") not in (None, "load"))]
    assert len(past_checksums) >= 20
    assert campaign.done == len(campaign.by_job)


@pytest.mark.parametrize("job", sorted(FIXED), ids=lambda k: f"{k[0]}:{k[1]}")
def test_fixed_bug_stays_fixed(campaign, job):
    r = campaign.by_job[job]
    assert r["allowed"], f"regression of: {FIXED[job]}\n" + _describe(r)


@pytest.mark.parametrize(
    "job", [pytest.param(k, id=f"{k[0]}:{k[1]}", marks=pytest.mark.xfail(strict=True, reason=reason))
            for k, reason in sorted(KNOWN_BUGS.items())]
    or [pytest.param(None, marks=pytest.mark.skip(reason="no known unfixed bug"))])
def test_known_bug(campaign, job):
    r = campaign.by_job[job]
    assert r["allowed"], _describe(r)


def test_allowed_rule():
    assert allowed("ok_equal", False) and allowed("ok_equal", True) and allowed("ok_equal", None)
    assert allowed("artifact_error:CorruptArtifactError", None)
    for o in ("mismatch", "lowering_error:OpsetError", "run_error:RuntimeError"):
        assert allowed(o, True, "run") and not allowed(o, False, "run") and not allowed(o, None, "load")
    assert allowed("memory", True, "run") and not allowed("memory", None, "load")
    for o in ("crash", "timeout", "other:KeyError", "other:CodeExecution", "fuzzer_error"):
        assert not allowed(o, False, "eager") and not allowed(o, True, "load_for_backend")
    for o in ("crash", "other:KeyError", "other:CodeExecution", "fuzzer_error"):
        assert not allowed(o, True, "run")
    # torch computing what a changed size literal asks for may take any time; pt2b's own phases may not
    assert allowed("timeout", True, "run") and allowed("timeout", True, "eager")
    assert not allowed("timeout", None, "eager") and not allowed("timeout", True, "fingerprint")


def test_mutants_are_deterministic_and_replayable(campaign, tmp_path):
    paths = export_seeds(MODELS, campaign.seeds_dir)
    seeds = {n: open(p, "rb").read() for n, p in paths.items()}
    a, b = Mutator(seeds), Mutator(seeds)
    for i in (0, 1, 7, 123):
        ma, mb = a.mutant(SEED, i), b.mutant(SEED, i)
        assert (ma.data, ma.desc, ma.kind, ma.verify, ma.preset) == (mb.data, mb.desc, mb.kind, mb.verify, mb.preset)
        assert (ma.desc, ma.kind) == (campaign.by_job[(SEED, i)]["desc"], campaign.by_job[(SEED, i)]["kind"])
    assert len({a.mutant(SEED, i).data for i in range(20)}) > 15
    out = tmp_path / "m.pt2b"
    rc = main(["--replay", f"{SEED}:7", "--out", str(out), "--models", ",".join(MODELS),
               "--seeds-dir", campaign.seeds_dir])
    assert rc == 0 and out.read_bytes() == a.mutant(SEED, 7).data


METHODS_MODELS = ("mlp_methods",)  # the zoo's mlp written as two methods over one set of weights
N_METHODS_MUTANTS = 150


@pytest.fixture(scope="module")
def methods_campaign(tmp_path_factory):
    seeds_dir = str(tmp_path_factory.mktemp("fuzz_seeds_methods"))
    camp = run_campaign(SEED, 0, indices=[(SEED, i) for i in range(N_METHODS_MUTANTS)], workers=2,
                        models=METHODS_MODELS, seeds_dir=seeds_dir, timeout=TIMEOUT_S, mem_gib=6, keep_results=True)
    camp.by_job = {(r["seed"], r["index"]): r for r in camp.results}
    assert len(camp.by_job) == N_METHODS_MUTANTS
    return camp


def test_multi_method_mutants_have_allowed_outcomes(methods_campaign):
    """Mutants of a multi-method artifact (its Method tables, every method's graph, the shared segments)
    are refused or run every method, eagerly and on runtime_ref, as the seed does."""
    results = list(methods_campaign.by_job.values())
    bad = [r for r in results if not r["allowed"]]
    assert not bad, f"{len(bad)} disallowed outcome(s):\n" + "\n".join(_describe(r) for r in bad)
    outcomes = {r["outcome"] for r in results}
    assert "ok_equal" in outcomes and "artifact_error:CorruptArtifactError" in outcomes
    past_checksums = [r for r in results if r["kind"] in ("struct_fb", "struct_schema", "repaired_program")
                      and (r["outcome"] == "ok_equal" or r.get("phase") not in (None, "load"))]
    assert len(past_checksums) >= 5
