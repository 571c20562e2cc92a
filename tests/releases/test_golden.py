"""Golden artifacts of every released format version (tests/golden/<major.minor>/) load, lower
with each preset and run forever, matching the outputs stored beside them."""

import copy
import pathlib
import re

import pytest

import tools.corpus.subclasses  # noqa: F401  registers the tensor subclass of the .subclass goldens
import tools.corpus.zoo  # noqa: F401  registers the custom op some goldens call
from exporter import load, load_for_backend
from exporter.versioning.formats import FORMAT_VERSION, KNOWN_VERSIONS, version_str
from tests.support.golden_io import load_io
from tests.support.helpers import assert_close_to_eager
from runtime_ref import runtimes

GOLDEN = pathlib.Path(__file__).parents[1] / "golden"
VERSION_DIRS = sorted(p for p in GOLDEN.iterdir() if p.is_dir() and re.fullmatch(r"\d+\.\d+", p.name))
ARTIFACTS = [p for d in VERSION_DIRS for p in sorted(d.glob("*.pt2b"))]


def test_every_released_version_has_goldens():
    assert {d.name for d in VERSION_DIRS} == {version_str(v) for v in KNOWN_VERSIONS}
    assert (GOLDEN / version_str(FORMAT_VERSION)).is_dir()
    for d in VERSION_DIRS:
        assert len(list(d.glob("*.pt2b"))) >= 12


def run(get, path, inputs):
    """The golden's calls through ``get(method)``: one call (args, kwargs), or for a multi-method golden
    (<name>.methods) the list of calls [method, args, kwargs] in order, over one state."""
    if not path.stem.endswith(".methods"):
        args, kwargs = inputs
        return get("forward")(*copy.deepcopy(args), **copy.deepcopy(kwargs))
    return [get(name)(*copy.deepcopy(args), **copy.deepcopy(kwargs)) for name, args, kwargs in inputs]


@pytest.mark.parametrize("path", ARTIFACTS, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_golden_loads_lowers_and_runs(path):
    inputs, expected = load_io(path.with_suffix(".io.npz"))
    prog = load(path, verify=True)
    assert prog.format_version == tuple(int(x) for x in path.parent.name.split("."))
    assert prog.metadata["golden"] == path.stem
    one = len(prog.methods) == 1
    assert one != path.stem.endswith(".methods")
    assert_close_to_eager(run(lambda name: prog if one else prog[name], path, inputs), expected, rtol=1e-5, atol=1e-5)
    for preset in ("none", "core", "core-tag", "max"):
        try:
            lowered = load_for_backend(path, preset)
        except Exception as e:  # core-tag may name ops that cannot reach core; nothing else may fail
            assert preset == "core-tag" and type(e).__name__ == "OpsetError", f"{preset}: {e}"
            continue
        custom = [op for op in lowered.ops() if not op.startswith(("aten::", "prims::", "higher_order::"))]
        rts = runtimes(lowered, extra_ops=custom)
        out = run(lambda name: next(iter(rts.values())) if one else rts[name], path, inputs)
        assert_close_to_eager(out, expected, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("path", ARTIFACTS, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_upgrade_tool_round_trips_golden(path, tmp_path):
    from exporter.cli.upgrade import upgrade_file

    inputs, expected = load_io(path.with_suffix(".io.npz"))
    res = upgrade_file(path, tmp_path / path.name)
    assert res.written and res.to_version == FORMAT_VERSION
    new = load(tmp_path / path.name, verify=True)
    old = load(path)
    assert list(new.methods) == list(old.methods) and new.metadata == old.metadata
    assert all(new[name].ops() == old[name].ops() for name in old.methods)
    one = len(new.methods) == 1
    assert_close_to_eager(run(lambda name: new if one else new[name], path, inputs), expected, rtol=1e-5, atol=1e-5)
