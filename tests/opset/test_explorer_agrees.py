"""The opset explorer agrees with the rest of pt2b: `closure`, `coverage` and the page read op lists with
load_for_backend's matcher, "implement next" is a greedy set cover that names the ATen op above a prims
op, unreachable ops name what emits them, typos warn, left-out programs are one line."""

from __future__ import annotations

import re
import warnings

import pytest
import torch

from exporter import export_model, load_for_backend
from exporter.errors import LoweringError, OpsetError, UnknownOpsWarning
from exporter.explorer import coverage
from exporter.explorer.corpus import artifact_corpus
from exporter.explorer.page import build_data, write_page
from exporter.explorer.selection import Selection, evaluate, unreachable
from exporter.ops import OpMatcher
from tests.support.browser import opened
from tools.corpus.zoo import make_case


# the spellings the docs allow: an overload-less name (every overload), the dotted form, a glob
SUPPORTED = ["aten::mm", "aten.add.Tensor", "aten::mul.*", "aten::relu", "aten::addmm", "aten::permute",
             "aten::view", "aten::erf"]


class Cos(torch.nn.Module):
    def forward(self, x):
        return torch.cos(x) * x


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """Three artifacts (a gelu MLP, a conv net, cos): the list above covers the MLP only."""
    folder = tmp_path_factory.mktemp("agree_corpus")
    export_model(Cos(), (torch.randn(3),), folder / "cos.pt2b")
    for name in ("mlp", "cnn_bn"):
        case = make_case(name)
        export_model(case.model, case.args, folder / f"{name}.pt2b")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        data = build_data(artifact_corpus([folder]))
    return folder, data


def _lowers(path, supported) -> bool:
    try:
        load_for_backend(str(path), supported_ops=supported, cache=False)
        return True
    except OpsetError:
        return False


def test_closure_and_coverage_count_the_models_load_for_backend_covers(corpus, tmp_path, capsys):
    from exporter import cli

    folder, data = corpus
    ops_file = tmp_path / "ops.txt"
    ops_file.write_text("\n".join(SUPPORTED) + "\n")
    truth = sum(_lowers(p, SUPPORTED) for p in sorted(folder.glob("*.pt2b")))
    assert truth == 1  # the MLP: its mul.Tensor, add.Tensor and mm come through the spellings above
    assert cli.main(["opset", "coverage", "--corpus", str(folder), "--supported", str(ops_file)]) == 0
    cov = int(re.search(r"(\d+) of 3 models fully covered", capsys.readouterr().out).group(1))
    assert cli.main(["opset", "closure", "--corpus", str(folder), "--supported", str(ops_file)]) == 0
    clo = int(re.search(r"(\d+) of 3 corpus models lower to accepted ops only", capsys.readouterr().out).group(1))
    assert cov == clo == truth == evaluate(data, Selection(None, supported=tuple(SUPPORTED)))["covered"]


def test_implement_next_is_a_set_cover_naming_the_aten_op_above(corpus):
    folder, data = corpus
    res = evaluate(data, Selection(None, supported=tuple(SUPPORTED)))
    ops = [o for o, _ in res["next"]]
    assert len(ops) == len(set(ops))  # each op once
    # cos lacks only prims::cos, which aten::cos's decomposition emits: aten::cos completes it first
    assert res["next"][0] == ("aten::cos.default", 2)
    assert res["models"]["cos.pt2b"]["producers"] == {"prims::cos.default": ["aten::cos.default"]}
    assert not any(o.startswith("prims::") and o.replace("prims::", "aten::") in ops for o in ops)
    # what it recommends is what load_for_backend then covers
    assert _lowers(folder / "cos.pt2b", SUPPORTED + ["aten::cos.default"])
    covered = [k for o, k in res["next"]]
    assert covered == sorted(covered) and covered[-1] <= 3
    # a chosen op that completes nothing is not chosen again (the list used to repeat it)
    assert coverage.greedy_next([{"a", "b"}, {"a", "c"}], limit=5) == [("a", 0), ("b", 1), ("c", 2)]
    # a tie goes to the ATen op over the prims op it decomposes to
    assert coverage.greedy_next([[["aten::cos.default", "prims::cos.default"]]]) == [("aten::cos.default", 1)]


def test_closure_names_producers_and_the_route_of_an_unreachable_op(corpus, tmp_path, capsys):
    from exporter import cli

    folder, data = corpus
    ops_file = tmp_path / "ops.txt"
    ops_file.write_text("\n".join(SUPPORTED) + "\n")
    assert cli.main(["opset", "closure", "--corpus", str(folder), "--supported", str(ops_file)]) == 0
    out = capsys.readouterr().out
    assert re.search(r"  prims::cos\.default: needed by 1 model\(s\), e\.g\. cos\.pt2b; emitted by aten::cos\.default\n"
                     r"      aten::cos\.default  ->\n          prims::cos\.default\n", out)
    assert "  aten::cos.default -> 2 of 3  (instead of prims::cos.default)" in out
    miss = unreachable(evaluate(data, Selection(None, supported=tuple(SUPPORTED))))
    assert miss["aten::convolution.default"] == {"models": ["cnn_bn.pt2b"], "producers": ["aten::conv2d.default"]}


def test_opset_error_suggests_the_aten_op_above_a_prims_op(corpus):
    folder, _ = corpus
    with pytest.raises(OpsetError) as e:
        load_for_backend(str(folder / "cos.pt2b"), supported_ops=["aten::mul.Tensor"], cache=False)
    assert ("Add them to supported_ops (rather than a prims op, the ATen op whose decomposition emits it: "
            "aten::cos.default for prims::cos.default)") in str(e.value)


def test_closure_warns_of_typos_as_lower_does(corpus, tmp_path, capsys):
    from exporter import cli

    folder, _ = corpus
    ops_file = tmp_path / "ops.txt"
    ops_file.write_text("\n".join(SUPPORTED + ["aten::linearr"]) + "\n")
    with pytest.warns(UnknownOpsWarning, match=r"supported_ops names 1 op\(s\) .* left out: aten::linearr"):
        assert cli.main(["opset", "closure", "--corpus", str(folder / "cos.pt2b"), "--supported", str(ops_file)]) == 0
    capsys.readouterr()
    assert cli.main(["opset", "closure", "--corpus", str(folder / "cos.pt2b"), "--keep", "aten::gelu.defualt"]) == 2
    assert ("keep names ops this torch does not have: aten::gelu.defualt (did you mean aten::gelu.default?)"
            in capsys.readouterr().err)


def test_left_out_programs_are_one_line_unless_verbose(corpus, monkeypatch, capsys):
    from exporter import cli
    from exporter.explorer import route_trace

    folder, _ = corpus
    real = route_trace.record

    def record(ep):
        if any("conv" in str(n.target) for n in ep.graph.nodes):
            raise LoweringError("decomposition failed: RuntimeError: Cannot view a tensor")
        return real(ep)

    monkeypatch.setattr(route_trace, "record", record)
    args = ["opset", "closure", "--corpus", str(folder / "cnn_bn.pt2b"), str(folder / "cos.pt2b")]
    assert cli.main(args) == 0
    err = capsys.readouterr().err
    assert ("pt2b: left out 1 corpus program(s) whose lowering with every decomposition fails: cnn_bn.pt2b "
            "(--verbose says why)\n") in err and "Cannot view" not in err
    assert cli.main(args + ["--verbose"]) == 0
    assert ("pt2b: left out cnn_bn.pt2b: its lowering with every decomposition fails (decomposition failed: "
            "RuntimeError: Cannot view a tensor)") in capsys.readouterr().err


# ---- the page's script, in Debian's chromium (skipped where it is absent, as tests/opset/test_explorer.py) ----

@pytest.fixture(scope="module")
def page(corpus, tmp_path_factory):
    _, data = corpus
    with opened(write_page(data, tmp_path_factory.mktemp("page") / "opsets.html")) as pg:
        yield pg


ENTRIES = ["aten::mm", "aten.add.Tensor", "torch.ops.aten.relu.default", "aten::mul.*", "aten::*pool*",
           "aten::conv[12]d.default", "aten::conv[!1]d.*", "prims", "aten::ad?.Tensor", "aten::linearr",
           "aten::linear.defualt", "mylib::*", "aten::[a-c]*"]
NAMES = ["aten::mm.default", "aten::mm.out", "aten::add.Tensor", "aten::add.Scalar", "aten::relu.default",
         "aten::mul.Tensor", "aten::mul.Scalar", "aten::max_pool2d.default", "aten::conv1d.default",
         "aten::conv2d.default", "aten::conv3d.default", "prims::cos.default", "aten::addmm.default",
         "aten::linear.default", "mylib::foo.default", "aten::bmm.default", "aten::dot.default", "aten::mma.default"]


def test_the_page_matches_names_as_op_matcher_does(page):
    """One matcher: the page's script answers as exporter.ops.OpMatcher on every spelling, typo and glob."""
    for entry in ENTRIES:
        want = [n in OpMatcher([entry]) for n in NAMES]
        assert page.evaluate("([e, ns]) => window.pt2bExplorer.matches([e], ns)", [entry, NAMES]) == want, entry
    assert page.evaluate("es => window.pt2bExplorer.unknown(es)", ENTRIES) == OpMatcher(ENTRIES).unknown_entries()
    for typo in ("aten::linearr", "aten::linear.defualt", "aten::soft_max.int", "prims::coss", "aten::zzzzqq"):
        assert page.evaluate("n => window.pt2bExplorer.closestOp(n)", typo) == OpMatcher.closest(typo), typo


def test_the_page_agrees_with_closure_and_lets_you_click_through(page, corpus):
    _, data = corpus
    sel = Selection(None, supported=tuple(SUPPORTED + ["aten::linearr"]))
    res = evaluate(data, sel)
    page.locator("#base-supported").check()
    page.locator("#supported-text").fill("\n".join(sel.supported))
    cur = page.evaluate("window.pt2bExplorer.current()")
    assert int(page.locator("#coverage").get_attribute("data-covered")) == res["covered"] == 1
    for name, r in res["models"].items():
        assert {k: cur["models"][name][k] for k in r} == r, name
    assert [tuple(x) for x in cur["next"]] == res["next"]
    assert cur["unreached"] == unreachable(res)
    # the typo is named, with the closest op
    warning = page.locator("#supported-unknown").inner_text()
    assert "aten::linearr (did you mean aten::linear.default?)" in warning
    # "implement next" items are buttons that show the route; an unreachable op names what emits it
    page.locator('#next button[data-route="aten::cos.default"]').click()
    assert page.locator("#route-op").inner_text() == "aten::cos.default"
    assert "aten::cos.default decomposes into" in page.locator("#route").inner_text()
    item = page.locator('#unreached li[data-op="prims::cos.default"]')
    assert "emitted by aten::cos.default" in item.inner_text()
    item.locator('button[data-route="prims::cos.default"]').click()
    assert "the decomposition of aten::cos.default emits it" in page.locator("#route-producers").inner_text()
    assert "prims::cos.default (cannot be reached)" in page.locator("#route").inner_text()
    # ticking the recommended op covers the model, as load_for_backend does
    page.locator("#supported-text").fill("\n".join([*sel.supported, "aten::cos.default"]))
    assert int(page.locator("#coverage").get_attribute("data-covered")) == 2
