"""One word, one meaning: the glossary defines backend, preset, strict, lossless, check, verify and
validate once, and the code and docs use each only in that sense (docs/glossary.md)."""

from __future__ import annotations

import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
BACKENDS = ("onnx", "inductor", "openvino", "executorch", "iree")

# word pattern -> the modules (paths under the repository) where it may appear, each for its one sense
HOMES = {
    # torch.export's tracing mode (export_model, capture, `pt2b export --strict`), and the shims that
    # turn an earlier release's strict= (now lossless=) into today's with a warning
    r"\bstrict\b": {"exporter/api.py", "exporter/exporting.py", "exporter/capture.py", "exporter/cli/__init__.py",
                    "exporter/cli/export.py", "exporter/cli/lower.py", "exporter/errors.py", "exporter/request.py",
                    "exporter/serialize/write/serde_repairs.py", "exporter/hf.py",
                    "exporter/backends/partition.py"},  # (a part traced with torch.export, non-strict)
    # a file's bytes against what it records (torch's and FlatBuffers' verifiers keep their names)
    r"\bverif(?!iers?\b)\w*": {"exporter/api.py", "exporter/loading.py", "exporter/cli/__init__.py",
                               "exporter/cli/verify.py", "exporter/cli/upgrade.py", "exporter/cli/progress.py",
                               "exporter/lowering/cache.py", "exporter/lowering/pipeline.py",
                               "exporter/backends/executorch.py",  # ExecuTorch's exir.verification module
                               "exporter/serialize/read/*", "exporter/layout/*"},
    # a lowered program's values against the unlowered program's (torch's ExportedProgram.validate()
    # keeps its name)
    r"\bvalidat\w*": {"exporter/api.py", "exporter/cli/__init__.py", "exporter/cli/lower.py", "exporter/cli/run.py",
                      "exporter/lowering/validate.py", "exporter/lowering/repair.py", "exporter/lowering/pipeline.py",
                      "exporter/lowering/op_checks.py",
                      "exporter/lowering/lowered.py", "exporter/lowering/lower.py", "exporter/lowering/cache.py",
                      "exporter/lowering/verdicts.py", "exporter/lowering/opset_check.py",
                      "exporter/serialize/read/weights.py", "exporter/serialize/write/writer.py",
                      # and a backend's outputs against the lowered program's (to_backend)
                      "exporter/backends/__init__.py", "exporter/backends/validation.py", "exporter/cli/run.py",
                      "exporter/backends/openvino.py"},  # (OpenVINO's Model.validate_nodes_and_infer_types)
}


def _sources():
    for package in ("exporter", "runtime_ref"):
        for path in sorted((ROOT / package).rglob("*.py")):
            if "generated" not in path.parts:
                yield path.relative_to(ROOT).as_posix(), path.read_text()


def _at_home(where: str, homes: set[str]) -> bool:
    return any(where == h or (h.endswith("/*") and where.startswith(h[:-1])) for h in homes)


def out_of_place(sources) -> list[str]:
    """file:line: word for each use of a glossary word outside its homes."""
    found = []
    for where, text in sources:
        for pattern, homes in HOMES.items():
            if _at_home(where, homes):
                continue
            for m in re.finditer(pattern, text, flags=re.IGNORECASE):
                found.append(f"{where}:{text.count(chr(10), 0, m.start()) + 1}: {m.group(0)}")
    return found


def test_each_word_is_used_only_in_its_sense():
    assert not out_of_place(_sources())


def test_the_check_finds_a_word_out_of_place():
    planted = [("exporter/lowering/engines/x.py", "x = 1\n# verified against the table\nstrict = True\n"),
               ("exporter/serialize/read/y.py", "# verify the checksum; ep.verifiers are torch's\n")]
    assert out_of_place(planted) == ["exporter/lowering/engines/x.py:3: strict",
                                     "exporter/lowering/engines/x.py:2: verified"]


@pytest.mark.parametrize("word", ["backend", "check", "lossless", "lowered for", "preset", "strict", "validate",
                                  "verify"])
def test_the_glossary_defines_each_word_once(word):
    text = (ROOT / "docs" / "glossary.md").read_text()
    assert len(re.findall(rf"^\*\*{re.escape(word)}\*\* — ", text, flags=re.MULTILINE)) == 1


def _doc_pages():
    yield "README.md", (ROOT / "README.md").read_text()
    for path in sorted((ROOT / "docs").rglob("*.md")):
        yield path.relative_to(ROOT).as_posix(), path.read_text()


def backend_named_as_preset(pages) -> list[str]:
    """Where a page teaches a backend as a preset (``preset="onnx"``, ``--preset onnx``), outside the
    paragraph that names earlier releases' spellings ("Earlier releases spelt")."""
    names = "|".join(BACKENDS)
    found = []
    for where, text in pages:
        for paragraph in text.split("\n\n"):
            if re.search(r"[Ee]arlier (pt2b )?releases? (spelt|still)|an earlier (pt2b )?release", paragraph):
                continue
            for m in re.finditer(rf"""preset\s*=\s*["']({names})["']|--preset\s+({names})\b""", paragraph):
                found.append(f"{where}: {m.group(0)}")
    return found


def test_the_docs_name_a_backend_as_a_backend():
    assert not backend_named_as_preset(_doc_pages())
    assert backend_named_as_preset([("x.md", 'lp = load_for_backend(p, preset="onnx")\n\n`--preset iree`')]) == [
        'x.md: preset="onnx"', "x.md: --preset iree"]


def test_a_backend_is_not_a_preset_below_the_api():
    """plan_lowering takes presets alone; a backend comes as backend= (exporter.request looks it up)."""
    from exporter.errors import LoweringError
    from exporter.lowering.plan import plan_lowering

    with pytest.raises(LoweringError, match=r"unknown preset 'onnx'"):
        plan_lowering("onnx")
