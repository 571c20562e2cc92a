"""Schema evolution is machine-checked: every released schema is kept under schemas/history/,
the current one conforms to each of its major (flatc --conform), and any change to the schema
needs a version bump recorded in exporter/versioning/formats.py."""

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
        "schemas/pt2b.fbs changed: bump FORMAT_MINOR (fields appended) or FORMAT_MAJOR (anything else) "
        "in exporter/versioning/formats.py and add schemas/history/<new version>/pt2b.fbs")


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
