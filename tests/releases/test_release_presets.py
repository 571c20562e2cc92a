"""Presets frozen per torch release (schemas/opsets/<preset>@<release>.json): each loads, a pinned
older preset lowers on the running release within its own opset (an op outside it is an OpsetError:
tests/lowering/test_lowering.py::test_pinned_preset_guarantees_its_frozen_opset), and the README and
docs/releases.md state what `python -m tools.freeze_presets --changes` generates."""

from __future__ import annotations

import pathlib

import pytest
import torch

from exporter import export_model, load_for_backend
from tools.corpus.zoo import make_case
from exporter.lowering import presets
from runtime_ref import Runtime

ROOT = pathlib.Path(__file__).resolve().parents[2]
RELEASES = presets.frozen_releases("core")


def test_every_supported_release_has_frozen_presets():
    assert RELEASES == ["2.11", "2.12", "2.13", "2.14", "2.15"]
    for name in presets.PRESETS:
        assert presets.frozen_releases(name) == RELEASES, name
        for version in RELEASES:
            p = presets.load(f"{name}@{version}")
            assert p.torch_version == version and p.name == name


@pytest.mark.parametrize("version", RELEASES)
def test_a_pinned_preset_of_any_release_lowers_here_within_its_opset(tmp_path, version):
    case = make_case("cnn_bn")
    path = tmp_path / "m.pt2b"
    export_model(case.model, case.args, path)
    lp = load_for_backend(path, f"core@{version}", cache=False)
    opset = set(presets.load(f"core@{version}").opset)
    assert set(lp.ops()) <= opset
    torch.testing.assert_close(Runtime(lp)(*case.args), case.model(*case.args), rtol=1e-4, atol=1e-4)


def test_docs_state_the_generated_changes():
    results = (ROOT / "docs" / "results.md").read_text()
    releases = (ROOT / "docs" / "releases.md").read_text()
    assert presets.release_summary() in results, "docs/results.md is stale: python -m tools.freeze_presets --changes"
    assert presets.release_summary() in releases and presets.release_changes() in releases, \
        "docs/releases.md is stale: python -m tools.freeze_presets --changes"


def test_every_release_has_its_decomposition_audit():
    """schemas/opsets/audit@<release>.json, written by `pt2b opset audit` on that release: totals that
    count its verdicts, and no decomposition measured wrong."""
    from exporter.lowering import verdicts

    for version in RELEASES:
        doc = verdicts.read(version)
        assert doc is not None and doc["torch_version"] == version, version
        assert doc["totals"] == verdicts.totals(doc["ops"]), version
        assert doc["totals"]["wrong"] == 0, version
        measured = [r for r in doc["ops"].values() if r["samples"] and "composite" not in r["worst"].get("why", "")]
        assert sum("layouts" in r for r in measured) > 0.8 * len(measured), version  # audited on layouts too (0 before)


def test_docs_state_every_releases_audit_totals():
    from exporter.lowering import verdicts

    text = (ROOT / "docs" / "releases.md").read_text()
    for version in RELEASES:
        doc = verdicts.read(version)
        t = doc["totals"]
        row = (f"| {version} | {len(doc['ops']):,} | {t['exact']} | {t['ulp']} | {t['lossy']} | {t['wrong']} | "
               f"{t['untested']} |")
        assert row in text, f"docs/releases.md lacks the audit row {row}"
