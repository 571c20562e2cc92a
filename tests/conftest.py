import os
import pathlib
import sys

import pytest

# the suite tests lowering itself; tests of the lowering cache turn it on in a folder of their own
os.environ["PT2B_CACHE"] = "off"

sys.path.insert(0, os.path.dirname(__file__))

# the test files every supported torch release runs (tools/release_matrix.py): one list, in compat.txt
COMPAT_FILES = frozenset(ln.strip() for ln in (pathlib.Path(__file__).parent / "compat.txt").read_text().splitlines()
                         if ln.strip() and not ln.startswith("#"))


def pytest_collection_modifyitems(items):
    for item in items:
        if item.path.name in COMPAT_FILES:
            item.add_marker(pytest.mark.compat)
