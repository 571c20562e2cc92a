"""The opset explorer (`pt2b opset page`, `pt2b opset closure`): its answers equal load_for_backend's on
the corpus, in Python and in a real headless browser (Debian's chromium driven by playwright)."""

from __future__ import annotations

import importlib.util
import json
import pathlib
import re
import warnings

import pytest

from exporter import load_for_backend
from exporter.ops import op_name
from tools.corpus.zoo import zoo_names
from exporter.api import export_model, load
from exporter.errors import LoweringError
from exporter.explorer.corpus import artifact_corpus, corpus_routes, default_corpus, shipped_routes
from exporter.explorer.page import build_data, write_page
from exporter.explorer.selection import Selection, evaluate
from exporter.lowering import tables
from exporter.lowering.pipeline import lower_exported
from exporter.lowering.plan import plan_lowering
from exporter.request import plan_request
from exporter.lowering.presets import torch_minor
from tests.support.browser import opened

ARTIFACTS = pathlib.Path(__file__).resolve().parents[2] / "test-artifacts"

# installed backends' presets (exporter.backends): an op list (onnx) and a table (openvino), where installed
BACKEND_SELECTIONS = {f"backend-{name}": Selection(name) for name, module in (("onnx", "onnxruntime"),
                                                                            ("openvino", "openvino"))
                      if importlib.util.find_spec(module) is not None}

OTHER_RELEASE = "2.11" if torch_minor() != "2.11" else "2.15"  # a release whose presets are frozen, not this torch's

SELECTIONS = {
    "core": Selection("core"),
    "core@other": Selection(f"core@{OTHER_RELEASE}"),
    "core-tag": Selection("core-tag"),
    "none": Selection("none"),
    "max-keep-addmm": Selection("max", keep=("aten::addmm.default",)),
    "core-decompose-softmax": Selection("core", decompose=("aten::_softmax.default",)),
    "supported": Selection(None, supported=("aten::mm.default", "aten::add.Tensor", "aten::mul.Tensor",
                                                     "aten::relu.default", "aten::linear.default"),
                                    keep=("aten::gelu.default",)),
    **BACKEND_SELECTIONS,
}


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """The default corpus (zoo + ExportDB) written as artifacts, and the page data built from them."""
    folder = tmp_path_factory.mktemp("explorer_corpus")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for prog in default_corpus(("zoo", "exportdb")):
            export_model(prog.ep, path=str(folder / (prog.name.replace(":", "__") + ".pt2b")))
        data = build_data(artifact_corpus([folder]))
    return folder, data


_ANSWERS: dict = {}


def library_answer(folder, sel: Selection) -> dict:
    """model -> (lowered op set, ops outside the accepted set), by the library's own lowering."""
    key = (str(folder), repr(sel))
    if key not in _ANSWERS:
        _ANSWERS[key] = _library_answer(folder, sel)
    return _ANSWERS[key]


def _library_answer(folder, sel: Selection) -> dict:
    plan = plan_request(**sel.load_kwargs()).reporting()  # report, as `pt2b opset coverage` does, not raise
    out = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for path in sorted(folder.glob("*.pt2b")):
            lowered = lower_exported(load(str(path)).exported_program(), plan)
            ops = sorted(o for o in lowered.ops() if not o.startswith("higher_order::") and o != "<built-in function getitem>")
            out[path.name] = (ops, sorted(lowered.outside_opset))
    return out


def _plain_ops(ops):
    from exporter.lowering.opset_check import INFRASTRUCTURE

    return sorted(o for o in ops if o not in INFRASTRUCTURE and "::" in o and not o.startswith("higher_order::"))


@pytest.mark.parametrize("key", sorted(SELECTIONS))
def test_python_evaluation_equals_the_library(corpus, key):
    folder, data = corpus
    sel = SELECTIONS[key]
    page = evaluate(data, sel)
    lib = library_answer(folder, sel)
    assert set(page["models"]) == set(lib)
    for name, (ops, missing) in lib.items():
        assert page["models"][name]["ops"] == _plain_ops(ops), name
        assert page["models"][name]["missing"] == missing, name
    assert page["covered"] == sum(1 for _, missing in lib.values() if not missing)


def test_a_real_load_for_backend_call_matches(corpus):
    """The copy-paste call itself (not only the planner) gives the explorer's op set."""
    folder, data = corpus
    sel = SELECTIONS["max-keep-addmm"]
    page = evaluate(data, sel)
    for name in ("zoo__mlp.pt2b", "zoo__transformer_encoder.pt2b"):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            prog = load_for_backend(str(folder / name), cache=False, **sel.load_kwargs())
        assert _plain_ops(prog.ops()) == page["models"][name]["ops"]
        assert "aten::addmm.default" in page["models"][name]["ops"]


def test_decompose_adds_registered_decompositions_and_rejects_unknown(corpus):
    folder, _ = corpus
    path = str(folder / "zoo__multihead_attention.pt2b")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        plain = load_for_backend(path, "core", cache=False).ops()
        more = load_for_backend(path, "core", decompose=["aten::_softmax.default"], cache=False).ops()
    assert "aten::_softmax.default" in plain and "aten::_softmax.default" not in more
    assert "aten::exp.default" in more
    with pytest.raises(LoweringError, match=r"decompose names ops that have no registered decomposition: "
                                            r"aten::mm\.default"):
        plan_lowering("core", decompose=["aten::mm.default"])


def test_closure_cli_reports_unreachable_ops_with_routes(corpus, tmp_path, capsys):
    from exporter import cli

    folder, data = corpus
    sel = SELECTIONS["supported"]
    ops_file = tmp_path / "ops.txt"
    ops_file.write_text("\n".join(sel.supported) + "\n")
    zoo = sorted(str(p) for p in folder.glob("zoo__*.pt2b"))  # the zoo's models: the closure traces each one's routes
    assert cli.main(["opset", "closure", "--supported", str(ops_file), "--keep", *sel.keep, "--corpus", *zoo]) == 0
    out = capsys.readouterr().out
    models = {name: r for name, r in evaluate(data, sel)["models"].items() if name.startswith("zoo__")}
    covered = sum(1 for r in models.values() if not r["missing"])
    assert len(models) == len(zoo) >= 20
    assert f"supported ops (5): " in out and f"{covered} of {len(zoo)} corpus models lower to accepted ops only" in out
    assert "cannot reach the accepted set" in out
    # every unreachable op is listed, and the bmm a matmul decomposes into is shown on its route
    missing = {o for r in models.values() for o in r["missing"]}
    for op in missing:
        assert f"  {op}: needed by" in out
    assert re.search(r"aten::matmul\.default  ->\n(.*\n)*?\s+aten::bmm\.default", out)


def test_page_cli_writes_one_self_contained_file(corpus, tmp_path):
    from exporter import cli

    folder, _ = corpus
    out = tmp_path / "opsets.html"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert cli.main(["opset", "page", "-o", str(out), "--corpus", str(folder / "zoo__mlp.pt2b")]) == 0
    html = out.read_text()
    assert "<script src" not in html and "http://" not in html.replace("http://www.w3.org", "")
    assert "https://" not in html
    data = json.loads(re.search(r'<script id="pt2b-data" type="application/json">(.*?)</script>', html, re.S).group(1))
    assert [m["name"] for m in data["models"]] == ["zoo__mlp.pt2b"]
    assert "aten::linear.default" in data["available"] and data["audit"]["aten::linear.default"]["verdict"]


def test_page_refuses_an_empty_corpus(tmp_path):
    with pytest.raises(LoweringError, match="no .pt2b artifacts found in"):
        artifact_corpus([tmp_path])


# ----------------------------------------------------------------------------------------------
# The page in a real browser
# ----------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def browser_page(corpus, tmp_path_factory):
    folder, data = corpus
    with opened(write_page(data, tmp_path_factory.mktemp("page") / "opsets.html")) as page:
        yield page, data, folder


def _page_answer(page) -> dict:
    """What the page shows: the op rows of the result table, coverage, and the code."""
    rows = page.locator("#ops tbody tr").evaluate_all(
        "rs => rs.map(r => [r.dataset.op, +r.dataset.models, r.classList.contains('missing')])")
    cov = page.locator("#coverage")
    return {"rows": rows, "covered": int(cov.get_attribute("data-covered")),
            "total": int(cov.get_attribute("data-total")),
            "python": page.locator("#code-python").inner_text(), "cli": page.locator("#code-cli").inner_text()}


def _expected(folder, sel):
    lib = library_answer(folder, sel)
    counts: dict[str, int] = {}
    for ops, _ in lib.values():
        for o in _plain_ops(ops):
            counts[o] = counts.get(o, 0) + 1
    missing = {o for _, m in lib.values() for o in m}
    return counts, missing, sum(1 for _, m in lib.values() if not m), lib


def _check(page, folder, sel):
    shown = _page_answer(page)
    counts, missing, covered, lib = _expected(folder, sel)
    assert {op: n for op, n, _ in shown["rows"]} == counts
    assert {op for op, _, bad in shown["rows"] if bad} == missing
    assert (shown["covered"], shown["total"]) == (covered, len(lib))
    # the code the page offers is what was compared: run it on a model and get the page's op set
    call = re.search(r"prog = load_for_backend\(\"model\.pt2b\", (.*)\)\n", shown["python"]).group(1)
    kwargs = eval(f"dict({call})", {}, {"supported_ops": list(sel.supported)})  # noqa: S307 -- our own page's text
    assert kwargs == sel.load_kwargs()
    name = next(n for n, (_, m) in sorted(lib.items()) if not m)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        prog = load_for_backend(str(folder / name), cache=False, **kwargs)
    page_ops = page.evaluate(f"window.pt2bExplorer.current().models[{json.dumps(name)}].ops")
    assert _plain_ops(prog.ops()) == page_ops
    return shown


def test_page_in_a_browser_matches_the_library(browser_page):
    page, data, folder = browser_page
    # 1. pick a preset
    page.locator("#base-core-tag").check()
    shown = _check(page, folder, SELECTIONS["core-tag"])
    assert shown["cli"] == "pt2b lower model.pt2b --preset core-tag"
    # 2. another preset, then toggle one decomposition off (found with the search box)
    page.locator("#base-max").check()
    page.locator("#search").fill("addmm")
    box = page.locator('input[data-dec="aten::addmm.default"]')
    assert box.is_checked()
    box.uncheck()
    page.locator("#search").fill("")
    shown = _check(page, folder, SELECTIONS["max-keep-addmm"])
    assert shown["cli"] == "pt2b lower model.pt2b --preset max --keep aten::addmm.default"
    # 3. toggle a decomposition on that the preset does not apply
    page.locator("#base-core").check()
    page.locator("#only-corpus").set_checked(False)
    page.locator("#search").fill("_softmax.default")
    page.locator('input[data-dec="aten::_softmax.default"]').check()
    page.locator("#search").fill("")
    shown = _check(page, folder, SELECTIONS["core-decompose-softmax"])
    assert 'decompose=["aten::_softmax.default"]' in shown["python"]


def test_page_supported_ops_mode_route_and_keyboard(browser_page):
    page, data, folder = browser_page
    sel = SELECTIONS["supported"]
    page.locator("#base-supported").check()
    page.locator("#supported-text").fill("\n".join(sel.supported))
    page.locator("#search").fill("gelu")
    page.locator('input[data-dec="aten::gelu.default"]').uncheck()  # keep gelu: the backend has it
    page.locator("#search").fill("")
    shown = _check(page, folder, sel)
    assert shown["cli"].startswith("pt2b lower model.pt2b --supported ops.txt --keep aten::gelu.default\n\n# ops.txt\n")
    # the greedy list equals the library-side computation
    res = evaluate(data, sel)
    next_ops = page.locator("#next li").evaluate_all("ls => ls.map(l => l.dataset.op)")
    assert next_ops == [o for o, _ in res["next"]]
    # marking an op supported from the result list moves it into the accepted set
    first_missing = page.locator("#ops tr.missing").first.get_attribute("data-op")
    page.locator(f'input[data-support="{first_missing}"]').check()
    assert first_missing in page.locator("#supported-text").input_value().split("\n")
    assert page.locator(f'#ops tr[data-op="{first_missing}"]').get_attribute("class") == ""
    # the route (bus journey) of matmul: down to bmm, which the backend lacks
    page.locator("#base-core").check()
    page.locator("#base-supported").check()
    page.locator("#supported-text").fill("\n".join(sel.supported))
    page.locator("#search").fill("matmul")
    page.locator('#decomps button[data-route="aten::matmul.default"]').click()
    route = page.locator("#route").inner_text()
    assert "aten::matmul.default decomposes into" in route and "aten::bmm.default (cannot be reached)" in route
    # an op no corpus program reaches: the ops its decomposition called on OpInfo samples (the audit)
    page.locator("#only-corpus").set_checked(False)
    page.locator("#search").fill("aten::special_xlog1py.default")
    page.locator('#decomps button[data-route="aten::special_xlog1py.default"]').click()
    text = page.locator("#route-none").inner_text()
    emits = data["audit"]["aten::special_xlog1py.default"]["emits"]
    assert "not called by any corpus program" in text and emits and all(e in text for e in emits)
    # keyboard: "/" focuses the search box; typing filters; Tab reaches the checkboxes
    page.locator("body").click(position={"x": 5, "y": 5})
    page.keyboard.press("/")
    assert page.evaluate("document.activeElement.id") == "search"
    page.keyboard.press("Control+A")
    page.keyboard.type("aten::addmm.default")
    page.keyboard.press("Tab")
    page.keyboard.press("Tab")
    page.keyboard.press("Tab")
    focused = page.evaluate("document.activeElement.dataset.dec || ''")
    assert focused == "aten::addmm.default"
    page.keyboard.press("Space")
    assert "aten::addmm.default" in page.locator("#code-python").inner_text()  # now kept
    page.locator("#search").fill("")
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "opset-explorer.png"), full_page=False)
    assert (ARTIFACTS / "opset-explorer.png").stat().st_size > 10_000


def test_a_program_whose_full_lowering_fails_is_left_out_and_named(tmp_path, monkeypatch, capsys):
    """Tracing routes lowers with every decomposition; where that fails (transformers' gpt-sw3 under
    torch 2.13: the sdpa decomposition views a non-contiguous tensor, torch's run_decompositions fails
    too) the page and `pt2b opset closure` leave the program out and say so, instead of failing."""
    from exporter import cli
    from tools.corpus.zoo import make_case
    from exporter.explorer import route_trace

    for name in ("mlp", "cnn_bn"):
        case = make_case(name)
        export_model(case.model, case.args, tmp_path / f"{name}.pt2b")
    real = route_trace.record

    def record(ep):
        if any("conv" in str(n.target) for n in ep.graph.nodes):
            raise LoweringError("decomposition failed: RuntimeError: Cannot view a tensor")
        return real(ep)

    monkeypatch.setattr(route_trace, "record", record)
    data = build_data(artifact_corpus([tmp_path]))
    assert [m["name"] for m in data["models"]] == ["mlp.pt2b"]
    assert data["left_out"] == [{"name": "cnn_bn.pt2b", "error": "decomposition failed: RuntimeError: Cannot view a tensor"}]
    assert cli.main(["opset", "closure", "--corpus", str(tmp_path), "--preset", "core", "--verbose"]) == 0
    err = capsys.readouterr().err
    assert "pt2b: left out cnn_bn.pt2b: its lowering with every decomposition fails (decomposition failed" in err


def test_page_targets_another_torch_release(browser_page):
    """A backend picks the torch release it targets: the page then evaluates that release's frozen
    presets (as load_for_backend(preset="core@2.11") applies them) and offers the pinned call."""
    page, data, folder = browser_page
    assert data["release"] == torch_minor() and OTHER_RELEASE in data["releases"] and len(data["releases"]) >= 5
    other = f"core@{OTHER_RELEASE}"
    assert set(data["presets"][other]["table"]) != set(data["presets"]["core"]["table"])  # a real choice
    page.locator("#base-core").check()
    page.locator("#release").select_option(OTHER_RELEASE)
    shown = _check(page, folder, SELECTIONS["core@other"])
    assert shown["cli"] == f"pt2b lower model.pt2b --preset {other}"
    page.locator("#base-max").check()  # the preset buttons stay on the chosen release
    assert page.evaluate("window.pt2bExplorer.state.preset") == f"max@{OTHER_RELEASE}"
    page.locator("#release").select_option(data["release"])
    assert page.evaluate("window.pt2bExplorer.state.preset") == "max"
    assert page.locator("#base-max").is_checked()


# ---- the default corpus's routes, shipped per torch release (issue 42) ----

def test_page_without_a_corpus_reads_the_shipped_routes_and_captures_nothing(tmp_path, monkeypatch, capsys):
    """`pt2b opset page` on a plain install opens in seconds: the default corpus, the zoo and every
    architecture of the real-model corpus torch.export captures, was traced for this torch release
    (tools/real_models.py --stages routes, then tools/explorer_data.py --sweep) and ships as package
    data; a captured case whose routes could not be traced is listed with why."""
    from exporter import cli
    from tools.corpus import programs

    shipped = shipped_routes()
    assert shipped is not None, f"no exporter/_data/explorer/routes@{torch_minor()}.json: run python -m tools.explorer_data"
    assert shipped["torch"].rsplit(".", 1)[0] == torch_minor() and shipped["corpus"] == ["zoo", "transformers-all"]
    names = {m["name"] for m in shipped["models"]}
    assert {f"zoo:{n}" for n in zoo_names()} <= names
    assert {f"transformers:{n}" for n in programs.transformers_sample()} - names <= {e["name"] for e in shipped["left_out"]}
    assert len(names) >= 700 and len(shipped["left_out"]) <= 10
    assert all(e["error"] for e in shipped["left_out"])

    def no_capture(*a, **k):
        raise AssertionError("the page captured the corpus")

    monkeypatch.setattr(programs, "programs", no_capture)
    assert cli.main(["opset", "page", "-o", str(tmp_path / "page.html")]) == 0
    html = (tmp_path / "page.html").read_text()
    embedded = re.search(r'<script id="pt2b-data" type="application/json">(.*?)</script>', html, re.S).group(1)
    data = json.loads(embedded)
    assert f"{len(shipped['models'])} corpus programs" in capsys.readouterr().out
    assert data["models"] == shipped["models"] and data["trees"] == shipped["trees"]


def _expanded(routes: dict) -> dict:
    """model name -> its routes with the shared trees written out (files differ in how trees are shared)."""
    return {m["name"]: ([routes["trees"][i] for i in m["trees"]], m["leaves"], m["unlowered"])
            for m in routes["models"]}


@pytest.mark.slow
def test_the_shipped_routes_are_what_the_corpus_traces_to_now():
    """The shipped file is not stale: tracing the zoo and the transformers sample again gives, model by
    model, the routes it ships (5 min)."""
    from tools.corpus import programs

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fresh = _expanded(corpus_routes(default_corpus(programs.DEFAULT)))
    shipped = _expanded(shipped_routes())
    assert {name: shipped.get(name) for name in fresh} == fresh


def test_the_page_offers_each_installed_backend_as_a_preset(corpus):
    """Issue 38: the installed backends are presets of the page, keyed by the backend and its release, with
    the op list or table plan_lowering uses for them."""
    from exporter import backends

    pytest.importorskip("onnxruntime")
    pytest.importorskip("openvino")
    _, data = corpus
    for name in ("inductor", "onnx", "openvino"):
        assert name in data["backend_presets"] and name in data["preset_names"]
        b = backends.get(name)
        p = data["presets"][name]
        assert p["key"] == b.key and b.version in p["description"]
        plan = plan_lowering(backend=b)
        assert set(p["table"]) == {n for n in (op_name(op) for op in plan.table) if n in set(data["available"])
                                   or n in {op_name(op) for op in b.decompositions()}
                                   or n in {op_name(op) for op in tables.view_prims_via_aten()}}
        assert (p["opset"] is None) == b.takes_what_its_table_leaves
