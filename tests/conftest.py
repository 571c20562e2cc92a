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


class TorchStateLeft(UserWarning):
    """A test left torch's tracing state set: a dispatch, pre-dispatch or torch-function mode pushed,
    make_fx's current tracer, dynamo's frame callback (named in the warning summary)."""


@pytest.fixture(autouse=True)
def tracing_state_clear(request):
    """Each test leaves torch's tracing state as it found it. A trace that fails half-way may leave a
    dispatch mode on the stack or make_fx's current tracer set, and every later torch.cond export on
    the worker then fails inside dynamo ("Attempted to inline function marked as skipped"). What a
    test leaves is named in the warning summary and cleared, so that it fails no other test."""
    import torch
    import torch.fx.experimental.proxy_tensor as proxy_tensor
    from torch.utils._python_dispatch import _pop_mode

    yield
    left = []
    while torch._C._len_torch_dispatch_stack() > 0:
        left.append(f"dispatch mode {type(_pop_mode()).__name__}")
    # export's pre-dispatch trace keeps modes of its own, and torch-function modes sit on a stack of theirs:
    # one left there reroutes a later trace's higher-order ops (a cond taken for an eager call compiles)
    while torch._ops._len_torch_dispatch_stack_pre_dispatch() > 0:
        left.append(f"pre-dispatch mode {type(torch._ops._pop_mode_from_pre_dispatch()).__name__}")
    while torch._C._len_torch_function_stack() > 0:
        left.append(f"torch-function mode {type(torch._C._pop_torch_function_stack()).__name__}")
    if getattr(proxy_tensor, "_CURRENT_MAKE_FX_TRACER", None) is not None:
        left.append("make_fx's current tracer")
        proxy_tensor._CURRENT_MAKE_FX_TRACER = None
    callback = torch._C._dynamo.eval_frame.get_eval_frame_callback()
    if callback not in (None, False):
        left.append(f"dynamo's frame callback {callback!r}")
        torch._C._dynamo.eval_frame.set_eval_frame(None)
    if left:
        import warnings

        warnings.warn(TorchStateLeft(f"{request.node.nodeid} left {', '.join(left)}"))
