import os
import pathlib

import pytest

# the suite tests lowering itself; tests of the lowering cache turn it on in a folder of their own
os.environ["PT2B_CACHE"] = "off"

# a pt2b entry point that had to give back process state other than grad mode fails the test
# (exporter/util/process_state.py): a valid program never changes it
from exporter.util import process_state  # noqa: E402

process_state.ASSERT_UNCHANGED = True

# the test files every supported torch release runs (tools/release_matrix.py): one list, in compat.txt
# (paths from tests/: <group>/<file>)
COMPAT_FILES = frozenset(ln.strip() for ln in (pathlib.Path(__file__).parent / "compat.txt").read_text().splitlines()
                         if ln.strip() and not ln.startswith("#"))


def pytest_collection_modifyitems(items):
    for item in items:
        if "/".join(item.path.parts[-2:]) in COMPAT_FILES:
            item.add_marker(pytest.mark.compat)


class GradModeLeft(UserWarning):
    """A test left grad mode off (named in the warning summary)."""


@pytest.fixture(autouse=True)
def grad_mode_on(request):
    """Each test starts with grad mode on, whatever ran before it on this worker. A lowered GraphModule
    run outside runtime_ref leaves grad mode as its program's last ``_set_grad_enabled`` switch set it
    (as torch's lowered programs do); a later export of a ``with torch.no_grad():`` block would then
    record no region. A test that leaves it off is named in the warning summary."""
    import torch

    torch._C._set_grad_enabled(True)
    yield
    if not torch.is_grad_enabled():
        torch._C._set_grad_enabled(True)
        import warnings

        warnings.warn(GradModeLeft(f"{request.node.nodeid} left grad mode off"))


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    """A lowering cache of the test's own, on (the suite runs with it off)."""
    folder = tmp_path / "cache"
    monkeypatch.setenv("PT2B_CACHE_DIR", str(folder))
    monkeypatch.delenv("PT2B_CACHE", raising=False)
    return folder
