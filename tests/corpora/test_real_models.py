"""The real-model corpus: transformers architectures enumerated from transformers' own registry
(tools/corpus/transformers_zoo.py), built offline from shrunk configs with random weights, taken
through the whole pipeline by tools/real_models.run_case: torch.export capture (dynamic sequence
length where torch allows), export_model, load (bitwise against torch.export's module), then for
none/core/max (none/core in the default run's sample): load_for_backend, runtime_ref, outputs close to
eager.

Outcomes:
- every stage passes: the test passes;
- the corpus cannot build the case offline (CaseUnavailable, e.g. inputs it cannot make): skipped
  with the reason;
- torch.export cannot capture it: xfail with torch's own error;
- pt2b's lowering, run or match fails for a preset AND torch's own run_decompositions with the same
  table fails too (run on the same program, compared with eager): xfail naming both errors (a torch
  limitation; lowering you can trust is the subject of its own work);
- anything else (pt2b cannot write, load, round-trip bitwise, or fails where torch succeeds): fails.

The default run takes the sample in tools/corpus/transformers_sample.txt (cases chosen so that every op any
captured architecture calls is called by one of them, and every task is represented:
`python -m tools.real_models --out SWEEP.json --pick-sample tools/corpus/transformers_sample.txt`); the full sweep over every case is `-m slow`.
"""

from __future__ import annotations

import pytest

pytest.importorskip("transformers")

from tools import real_models as rm  # noqa: E402

from tools.corpus.programs import transformers_sample  # noqa: E402

SAMPLE = transformers_sample()


class _Collector:
    record: dict | None = None

    def send(self, rec):
        self.record = rec


def _stage_error(st: dict) -> str:
    return f"{st.get('error_type')}: {st.get('error', '')}"


def check_case(name: str, workdir, presets: tuple[str, ...] = rm.PRESETS) -> None:
    """Run ``name`` through the pipeline in this process, lowered with each of ``presets``, and turn its
    record into a test outcome."""
    sink = _Collector()
    rm.run_case(name, None, sink, str(workdir), presets)
    rec = sink.record
    stages = rec["stages"]
    build = stages["build"]
    if build["status"] != "ok":
        if build.get("error_type") == "CaseUnavailable":
            pytest.skip(f"the corpus cannot build {name} offline: {build['error']}")
        pytest.fail(f"{name}: building the case failed: {_stage_error(build)}")
    if stages["capture"]["status"] != "ok":
        pytest.xfail(f"torch.export cannot capture {name}: {_stage_error(stages['capture'])}")
    if stages["eager"]["status"] != "ok":
        pytest.fail(f"{name}: eager forward failed: {_stage_error(stages['eager'])}")
    for key in ("write", "load", "bitwise"):
        assert stages[key]["status"] == "ok", f"{name}: {key}: {_stage_error(stages[key])}"
    ours, torchs = [], []
    for preset in presets:
        failed = next((k for k in (f"lower:{preset}", f"run:{preset}", f"match:{preset}")
                       if stages[k]["status"] == "fail"), None)
        if failed is None:
            continue
        theirs = stages.get(f"torch:{preset}", {})
        if theirs.get("status") == "fail":
            torchs.append(f"{failed}: {_stage_error(stages[failed])} | torch's run_decompositions: "
                          f"{_stage_error(theirs)}")
        else:
            ours.append(f"{failed}: {_stage_error(stages[failed])} (torch's own lowering succeeds)")
    table = stages.get("table:core", {"status": "ok"})
    if table["status"] == "fail":
        ours.append(f"table:core: {_stage_error(table)}")
    assert not ours, f"{name}:\n" + "\n".join(ours)
    if torchs:
        pytest.xfail(f"{name}: torch's own lowering fails too:\n" + "\n".join(torchs))


# The default run lowers the sample with none and core (the default); max, which decomposes nearly every
# call and takes half of a case's time, runs in the slow sweep below (every case, every preset) and in
# `python -m tools.real_models --sample`.
SAMPLE_PRESETS = ("none", "core")


@pytest.mark.parametrize("name", SAMPLE)
def test_real_model_sample(name, tmp_path):
    check_case(name, tmp_path, SAMPLE_PRESETS)


# issue 39: the workloads people bring, one of each variant in the default run (corpus/variants.py); the
# whole sample in each is `python -m tools.real_models --sample --variants bf16,fp16,int8wo,fp8wo,pt2e`.
# bf16 (the variant that failed the default lowering) is lowered with every preset; the others with the
# default preset, core (max, half of a case's time, runs in the command above)
VARIANT_CASES = {"llama@bf16": rm.PRESETS, "llama@fp16": ("core",), "llama@int8wo": ("core",),
                 "llama@fp8wo": ("core",), "llama@pt2e": ("core",)}


@pytest.mark.parametrize("name", VARIANT_CASES)
def test_real_model_variant_passes_with_default_settings(name, tmp_path):
    """Each variant builds, captures, writes, reads back bitwise, lowers with its presets with validation
    on (the default) and runs on runtime_ref close to eager in its own dtype: nothing skipped or xfailed."""
    if name.endswith(("@int8wo", "@fp8wo", "@pt2e")):
        pytest.importorskip("torchao")
    sink = _Collector()
    presets = VARIANT_CASES[name]
    rm.run_case(name, None, sink, str(tmp_path), presets)
    stages = sink.record["stages"]
    bad = {k: _stage_error(v) for k, v in stages.items() if v["status"] != "ok" and not k.startswith("ratio:")}
    assert not bad, f"{name}: {bad}"
    assert {f"lower:{p}" for p in presets} <= set(stages), stages
    checked = [p for p in presets if p != "none"]
    assert all(sink.record["validation"][p]["status"] == "passed" for p in checked), sink.record["validation"]


def test_a_variant_name_is_checked():
    from tools.corpus import variants
    from tools.corpus.transformers_zoo import make_case

    assert variants.split("llama/causal-lm@bf16") == ("llama/causal-lm", "bf16")
    assert variants.split("llama") == ("llama", None)
    with pytest.raises(ValueError, match=r"unknown variant 'int4'; known: bf16, fp16, int8wo, fp8wo, pt2e"):
        make_case("llama@int4")


def test_sample_names_are_in_the_corpus():
    """The sample file names cases the corpus enumerates (a renamed architecture fails here)."""
    from tools.corpus import transformers_zoo

    missing = sorted(set(SAMPLE) - set(transformers_zoo.case_names()))
    assert not missing, f"transformers_sample.txt names cases the corpus does not hold: {missing}"


def _all_cases():
    from tools.corpus import transformers_zoo

    return transformers_zoo.case_names()


@pytest.mark.slow
@pytest.mark.parametrize("name", _all_cases())
def test_real_model_sweep(name, tmp_path):
    check_case(name, tmp_path)


def test_named_corpora_feed_the_explorer_and_coverage(monkeypatch, tmp_path, capsys):
    """`pt2b opset coverage/page --corpus transformers` capture the real-model sample; a case torch
    cannot capture is left out (here a name the corpus cannot build)."""
    from exporter import cli
    from tools.corpus import programs

    monkeypatch.setattr(programs, "transformers_sample", lambda: ["llama", "no_such_model_type"])
    got = [label for label, _ in programs.programs(("transformers",))]
    assert got == ["transformers:llama"]
    assert cli.main(["opset", "coverage", "--corpus", "transformers", "--preset", "core"]) == 0
    out = capsys.readouterr()
    assert out.err == ""  # progress only on a terminal (tests/cli/test_cli_talk.py)
    assert "preset core: 1 of 1 models fully covered" in out.out and "transformers_llama.pt2b: covered" in out.out
    with pytest.raises(ValueError, match="unknown corpus 'nope'; named corpora: zoo, exportdb, transformers"):
        list(programs.programs(("nope",)))


def test_results_page_holds_the_sweep_of_the_tracked_records():
    """docs/results.md's real-model table is what the tracked sweep records say (bench/records/real_models.json.gz and
    the variant sweep's real_models_variants.json.gz: `python -m tools.real_models --out
    bench/records/real_models.json.gz --readme --readme-variants bench/records/real_models_variants.json.gz`)."""
    import gzip
    import json
    import pathlib

    root = pathlib.Path(__file__).resolve().parents[2]
    with gzip.open(root / "bench" / "records" / "real_models.json.gz", "rt") as f:
        data = json.load(f)
    with gzip.open(root / "bench" / "records" / "real_models_variants.json.gz", "rt") as f:
        variants = json.load(f)["records"]
    table = rm.readme_table(data["records"], data["meta"].get("wall_seconds"), variants)
    assert table in (root / "docs" / "results.md").read_text()
    assert len(data["records"]) >= 300 and all(r.get("pt2b") for r in data["records"])
    # every variant of the whole sample (`--sample --variants bf16,fp16,int8wo,pt2e`)
    assert sorted(r["name"] for r in variants) == sorted(f"{n}@{v}" for n in SAMPLE
                                                         for v in ("bf16", "fp16", "int8wo", "fp8wo", "pt2e"))


def test_a_routes_sweep_record_is_what_the_explorer_traces_and_ships(tmp_path):
    """`tools.real_models --stages routes` keeps, per captured case, the routes the explorer traces for it
    (the page's full corpus is swept case by case); tools/explorer_data.py's --sweep assembles the zoo and
    those records into the shipped file's form: the captured cases named as the corpora name them, a case
    whose routes failed left out with why, one torch.export refuses absent."""
    import copy
    import json

    from tools.corpus import transformers_zoo
    from tools.corpus.programs import capture_real
    from exporter.explorer.corpus import CorpusProgram, corpus_routes
    from exporter.explorer.selection import Selection, evaluate
    from tools import explorer_data

    name = "bert"
    sink = _Collector()
    rm.run_case(name, rm.STOP_AFTER["routes"], sink, str(tmp_path))
    rec = sink.record
    assert rec["stages"]["routes"]["status"] == "ok", rec["stages"]
    assert set(rec["stages"]) == {"build", "capture", "routes"}
    traced = corpus_routes([CorpusProgram(name, capture_real(transformers_zoo.make_case(name)))])
    (m,) = traced["models"]
    assert rec["routes"] == {"trees": [traced["trees"][i] for i in m["trees"]], "leaves": m["leaves"],
                             "unlowered": m["unlowered"]}

    failed = {"name": "broken", "stages": {"build": {"status": "ok"}, "capture": {"status": "ok"},
                                           "routes": {"status": "fail", "error": "LoweringError: no route"}}}
    refused = {"name": "refused", "stages": {"build": {"status": "ok"}, "capture": {"status": "fail"}}}
    again = copy.deepcopy(rec)
    again["name"] = "bert/again"
    zoo = {"trees": [], "models": [], "left_out": []}
    doc = explorer_data.sweep_routes(json.loads(json.dumps([rec, failed, refused, again])), zoo)
    assert [x["name"] for x in doc["models"]] == ["transformers:bert", "transformers:bert/again"]
    assert doc["models"][0]["trees"] == doc["models"][1]["trees"]  # each distinct tree stored once
    assert len(doc["trees"]) == len({json.dumps(t, sort_keys=True) for t in rec["routes"]["trees"]})
    assert doc["left_out"] == [{"name": "transformers:broken", "error": "LoweringError: no route"}]
    from exporter.explorer.page import build_data

    got = evaluate(build_data(routes=doc), Selection(preset="core"))["models"]
    assert got["transformers:bert"] == got["transformers:bert/again"] and got["transformers:bert"]["ops"]


def test_a_model_output_rebuilt_in_its_fields_order_is_compared_key_by_key():
    """A program's module rebuilds a ModelOutput in its fields' order, eager keeps the order the model
    set its keys in: the sweep compares the values of each key, and still finds a wrong one."""
    from tests.support.helpers import model_output_built_out_of_field_order

    model, (x,) = model_output_built_out_of_field_order()
    eager = model(x)
    rebuilt = type(eager)(first=eager["first"], second=eager["second"], third=eager["third"])
    assert [k for k in rebuilt.keys()] != [k for k in eager.keys()]
    assert rm._compare_close(rebuilt, eager, 0, 0) is None and rm._compare_bitwise(rebuilt, eager) is None
    wrong = type(eager)(first=eager["first"], second=eager["second"] + 1, third=eager["third"])
    assert rm._compare_close(wrong, eager, 0, 0).startswith("leaf 2 (3, 4): ")
    assert rm._compare_bitwise(wrong, eager) == "leaf 2: not bitwise equal (max abs diff 1)"
    assert rm._compare_bitwise((x, x * 2), (x * 2, x)).startswith("leaf 0: not bitwise equal")
