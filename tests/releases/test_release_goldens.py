"""Artifacts written by real torch releases (tests/golden/torch-<release>/, written by
tools/make_release_goldens.py in that release's venv) load, lower with ``core`` and run on the
running release, matching the outputs the writer stored beside them.

Test ids are ``<writer release>/<case>``: tools/release_matrix.py runs this file on every release
and groups the junit report by writer into the writer x reader table of docs/releases.md.

Bits are a promise between pt2b and torch on one machine: on the writer's release, pt2b's load gives
bitwise what torch's own serializer and loader give on this machine for the same program
(golden_io.torchs_own_result). The outputs stored beside a golden were computed on the machine that
wrote it: another CPU (AVX-512/AMX against AVX2) or another release (the 2.13 CPU wheel and the CUDA
wheels of the others link different oneDNN/MKL builds; a release may change a kernel's accumulation
order) changes the last bits of a float result, not its value, so they are compared within a
tolerance that follows the dtype (golden_io.STORED_TOLERANCE: 1e-5 for float32).
Lowered programs are compared with 1e-4, as tests/releases/test_golden.py does: a decomposition computes the
same value by other ops, with other roundings.
"""

from __future__ import annotations

import copy
import json
import pathlib
import re

import pytest
import torch

import tools.corpus.zoo  # noqa: F401  registers the custom op some goldens call
from exporter import load, load_for_backend
from tests.support.golden_io import assert_close_to_stored, load_io, torchs_own_result
from tests.support.helpers import assert_bitwise, assert_close_to_eager
from runtime_ref import Runtime

GOLDEN = pathlib.Path(__file__).parents[1] / "golden"
WRITER_DIRS = sorted((p for p in GOLDEN.iterdir() if p.is_dir() and re.fullmatch(r"torch-\d+\.\d+\.\d+", p.name)),
                     key=lambda p: tuple(int(x) for x in p.name[len("torch-"):].split(".")))
READER = torch.__version__.split("+")[0]


def _manifest(folder: pathlib.Path) -> dict:
    return json.loads((folder / "manifest.json").read_text())


CASES = [(d.name[len("torch-"):], name) for d in WRITER_DIRS for name in _manifest(d)["cases"]]


def _custom_ops(program) -> list[str]:
    return [op for op in program.ops() if not op.startswith(("aten::", "prims::", "higher_order::", "_operator."))]


def test_release_golden_folders_are_complete():
    assert WRITER_DIRS, "no tests/golden/torch-<release>/ folder"
    cases = {d.name: _manifest(d)["cases"] for d in WRITER_DIRS}
    for d in WRITER_DIRS:
        m = _manifest(d)
        assert m["release"] == d.name[len("torch-"):] and m["torch"].split("+")[0] == m["release"]
        stems = sorted(p.name[:-len(".pt2b")] for p in d.glob("*.pt2b"))
        assert stems == sorted(m["cases"]), d.name
        assert all((d / f"{s}.io.npz").is_file() for s in stems), d.name
        assert len(stems) >= 16 and any(".lowered-" in s for s in stems), d.name
    assert len({tuple(c) for c in cases.values()}) == 1, f"the releases wrote different cases: {cases}"


@pytest.mark.parametrize("writer,name", CASES, ids=[f"{w}/{n}" for w, n in CASES])
def test_release_golden_loads_lowers_and_runs(writer, name):
    path = GOLDEN / f"torch-{writer}" / f"{name}.pt2b"
    (args, kwargs), expected = load_io(path.with_suffix(".io.npz"))
    run = lambda f: f(*copy.deepcopy(args), **copy.deepcopy(kwargs))  # noqa: E731  (buffers mutate)

    prog = load(path, verify=True)
    assert prog.torch_version.split("+")[0] == writer and prog.metadata["golden"] == name
    assert prog.metadata["torch"] == writer
    ours = run(prog)
    if writer == READER:
        assert_bitwise(ours, torchs_own_result(load(path), args, kwargs))  # (prog's state is written)
    assert_close_to_stored(ours, expected)

    if prog.lowering is not None:   # a lowered golden: runs on runtime_ref as stored
        assert prog.lowering["torch_version"].split("+")[0] == writer
        assert_close_to_eager(run(Runtime(prog, extra_ops=_custom_ops(prog))), expected, rtol=1e-4, atol=1e-4)

    lowered = load_for_backend(path, "core", cache=False)
    out = run(Runtime(lowered, extra_ops=_custom_ops(lowered)))
    assert_close_to_eager(out, expected, rtol=1e-4, atol=1e-4)
    stored = path.with_name(f"{name}.lowered-core.pt2b")
    if writer == READER and stored.exists():   # the same release lowers to what its writer stored
        aten = lambda ops: {op: n for op, n in ops.items() if not op.startswith("_operator.")}  # noqa: E731
        assert lowered.ops() == aten(load(stored).ops())   # (a loaded program's ops() lists getitem/mul too)
