"""docs/benchmarks.md holds current numbers only: no commit hash and no date, which belong to the runs'
history in docs/journal/benchmarks.md."""

from __future__ import annotations

import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "benchmarks.md"

FENCE = re.compile(r"^```[^\n]*\n.*?^```[ \t]*$", re.M | re.S)
# a link's target (a page, an anchor or a web address) and a bare web address are addresses, not prose
URL = re.compile(r"\]\([^)\s]*\)|\bhttps?://\S+")
# 7 to 40 hex digits with at least one digit and one letter: a commit hash, full or abbreviated
COMMIT = re.compile(r"\b(?=[0-9a-fA-F]*[a-fA-F])(?=[0-9a-fA-F]*[0-9])[0-9a-fA-F]{7,40}\b")
ISO_DATE = re.compile(r"\b\d{4}-\d{2}-\d{2}\b")


def provenance(text: str) -> list[str]:
    """Each commit hash and ISO date in the prose of a markdown page, outside code blocks and addresses,
    as 'line: token'."""
    prose = URL.sub("", FENCE.sub(lambda m: "\n" * m.group(0).count("\n"), text))
    found = []
    for n, line in enumerate(prose.splitlines(), 1):
        found += [f"{n}: {m.group(0)}" for m in COMMIT.finditer(line)]
        found += [f"{n}: {m.group(0)}" for m in ISO_DATE.finditer(line)]
    return found


def test_the_detector_finds_a_hash_and_a_date_and_nothing_else():
    sample = ("# Load\n"
              "Run of 2026-11-25, recorded in 2e9f045: 0.006x, 2.336e-05 s, 1,048,576 elements, bf16, sha256.\n"
              "```bash\ngit show 4c666e0  # in a code block\n```\n"
              "See [the run](journal/benchmarks.md#big-models-2026-12-03) and https://example.com/c41e1ec.\n"
              "At deadbeef1 (bfloat16, float32, 1.03B parameters).\n")
    assert provenance(sample) == ["2: 2e9f045", "2: 2026-11-25", "7: deadbeef1"]


def test_the_benchmarks_page_names_no_commit_and_no_date():
    found = provenance(PAGE.read_text())
    assert not found, ("docs/benchmarks.md names commits or dates (move the run's provenance to "
                       f"docs/journal/benchmarks.md): {found}")
