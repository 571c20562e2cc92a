"""Schema evolution is machine-checked: every released schema is kept under schemas/history/,
the current one conforms to each of its major (flatc --conform), and any change to the schema
needs a version bump: a field appended to Program with its `since`/`holds` attributes, which the
format version is read from (exporter/versioning/formats.py)."""

import pathlib
import subprocess

import pytest
import torch

from exporter import export_model, load
from exporter.errors import ExportError
from tools import regen_flatbuffers as regen
from exporter.versioning.formats import FORMAT_MAJOR, FORMAT_VERSION, KNOWN_VERSIONS, version_str

SCHEMAS = pathlib.Path(__file__).resolve().parents[2] / "schemas"
HISTORY = sorted((SCHEMAS / "history").iterdir())


def _conform(old: pathlib.Path, new: pathlib.Path) -> subprocess.CompletedProcess:
    return subprocess.run([regen.flatc_path(), "--conform", str(old), str(new)], capture_output=True, text=True)


def test_history_holds_every_released_version():
    assert {p.name for p in HISTORY} == {version_str(v) for v in KNOWN_VERSIONS}


def test_current_schema_is_the_released_one_of_this_version():
    current = (SCHEMAS / "history" / version_str(FORMAT_VERSION) / "pt2b.fbs").read_text()
    assert (SCHEMAS / "pt2b.fbs").read_text() == current, (
        "schemas/pt2b.fbs changed: a field appended to Program carries (since: \"<new version>\", holds: "
        "\"...\"); anything else bumps FORMAT_MAJOR in exporter/versioning/formats.py; then add "
        "schemas/history/<new version>/pt2b.fbs")


@pytest.mark.parametrize("old", HISTORY, ids=lambda p: p.name)
def test_schema_conforms_to_every_release_of_its_major(old):
    major = int(old.name.split(".")[0])
    res = _conform(old / "pt2b.fbs", SCHEMAS / "pt2b.fbs")
    if major == FORMAT_MAJOR:
        assert res.returncode == 0, f"incompatible with {old.name} without a major bump:\n{res.stdout}{res.stderr}"


def test_conform_catches_an_incompatible_change(tmp_path):
    bad = (SCHEMAS / "pt2b.fbs").read_text().replace("  storage_offset: long;          // in elements of dtype",
                                                       "  storage_offset: int;")
    assert bad != (SCHEMAS / "pt2b.fbs").read_text()
    (tmp_path / "pt2b.fbs").write_text(bad)
    res = _conform(SCHEMAS / "pt2b.fbs", tmp_path / "pt2b.fbs")
    assert res.returncode != 0 and "storage_offset" in res.stdout + res.stderr


class Tiny(torch.nn.Module):
    def forward(self, x):
        return x * 2


def test_export_to_a_chosen_version(tmp_path):
    export_model(Tiny(), (torch.ones(2),), tmp_path / "a.pt2b", format_version=version_str(FORMAT_VERSION))
    assert load(tmp_path / "a.pt2b").format_version == FORMAT_VERSION
    with pytest.raises(ExportError, match=r"format version 0\.7 does not exist; known versions: 1\.0"):
        export_model(Tiny(), (torch.ones(2),), tmp_path / "b.pt2b", format_version="0.7")
    with pytest.raises(ExportError, match="format_version must look like 'MAJOR.MINOR'"):
        export_model(Tiny(), (torch.ones(2),), tmp_path / "b.pt2b", format_version="one")
    assert not (tmp_path / "b.pt2b").exists()


def test_the_format_version_is_read_from_the_schema(tmp_path, monkeypatch):
    """A Program field appended with (since, holds) is the whole of a minor bump: the version, the
    versions known and the fields an older version cannot hold follow from the schema."""
    import importlib

    from exporter import package_data
    from exporter.layout import fbs
    from exporter.versioning import formats

    text = (SCHEMAS / "pt2b.fbs").read_text()
    assert formats.FORMAT_VERSION == max(formats.KNOWN_VERSIONS) == max(formats.FIELDS_ADDED)
    new = f"{FORMAT_MAJOR}.{FORMAT_VERSION[1] + 1}"
    last = next(line for line in text.splitlines() if line.startswith("  weight_digests: "))  # Program's last field
    grown = text.replace(last, f'{last}\n  footnote: string (since: "{new}", holds: "a note for readers");')
    assert grown.count("footnote") == 1
    monkeypatch.setattr(package_data, "read_text", lambda name: grown if name == "pt2b.fbs" else text)
    fbs.layout.cache_clear()
    try:
        fresh = importlib.reload(formats)
        assert fresh.FORMAT_VERSION == (FORMAT_MAJOR, FORMAT_VERSION[1] + 1)
        assert fresh.FIELDS_ADDED[fresh.FORMAT_VERSION] == {"footnote": "a note for readers"}
        assert fresh.KNOWN_VERSIONS[fresh.FORMAT_VERSION] == "Program.footnote: a note for readers"
    finally:
        monkeypatch.undo()
        fbs.layout.cache_clear()
        importlib.reload(formats)
    assert formats.FORMAT_VERSION == FORMAT_VERSION


@pytest.mark.parametrize("attrs, why", [
    ('(since: "1.9", color: "red")', "only since, holds with string values"),
    ("(since: 3)", "only since, holds with string values"),
    ('(since: "one")', 'since must look like "MAJOR.MINOR"'),
])
def test_the_schema_reader_refuses_other_attributes(attrs, why):
    from exporter.layout import fbs

    text = (SCHEMAS / "pt2b.fbs").read_text().replace("  producer: string;", f"  producer: string {attrs};")
    with pytest.raises(fbs.SchemaLayoutError, match=why.replace("(", r"\(").replace(".", r"\.")):
        fbs.parse(text)
