"""Issue 39: the generation example (examples/generate.py, docs/generation.md) runs as a user runs it and
its tokens equal transformers' generate() for two sequences, each from an empty cache."""

from __future__ import annotations

import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]

pytest.importorskip("transformers")


def test_the_generation_example_matches_transformers(tmp_path):
    out = subprocess.run([sys.executable, str(ROOT / "examples" / "generate.py"), "--out", str(tmp_path / "d.pt2b"),
                          "--new-tokens", "6"], capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    lines = out.stdout.splitlines()
    assert lines[0].startswith(f"{tmp_path / 'd.pt2b'}: methods ['decode', 'prefill']")
    matches = [ln for ln in lines if ln.startswith("prompt ")]
    assert len(matches) == 2 and all(" == transformers " in ln for ln in matches)
    assert lines[-1] == "tokens match transformers' generate()"
    assert (tmp_path / "d.pt2b").exists()
