"""A lowering request flows one way: read -> plan -> (cache lookup) -> lower -> validate -> (cache
store) -> LoweredProgram, each stage calling only the stages after it, and the LoweredProgram built
complete (nothing set on it after its constructor)."""

from __future__ import annotations

import ast
import pathlib
import sys

import pytest
import torch

from exporter import export_model, load_for_backend
from exporter.lowering.lowered import LoweredProgram
from exporter.lowering.pipeline import lower_exported
from exporter.lowering.plan import plan_lowering

ROOT = pathlib.Path(__file__).resolve().parents[2]

# The request path's modules, each calling only modules after it (the result, LoweredProgram, answers
# from what the stages made: its lazily read parts are the reader's and the cache's).
STAGES = ["exporter.api", "exporter.request", "exporter.lowering.pipeline", "exporter.lowering.lowered",
          "exporter.loading", "exporter.lowering.cache", "exporter.lowering.repair", "exporter.lowering.validate",
          "exporter.lowering.lower", "exporter.lowering.plan"]


def _calls_between_stages(fn) -> set[tuple[str, str]]:
    """(caller stage, callee stage) of every call ``fn`` makes from one stage's code into another's; a
    call made through anything else (a decorator, a Lazy, torch) counts from the nearest stage frame."""
    edges = set()

    def profile(frame, event, arg):
        if event != "call":
            return
        callee = frame.f_globals.get("__name__")
        if callee not in STAGES:
            return
        back = frame.f_back
        while back is not None and back.f_globals.get("__name__") not in STAGES:
            back = back.f_back
        if back is not None and back.f_globals["__name__"] != callee:
            edges.add((back.f_globals["__name__"], callee))

    sys.setprofile(profile)
    try:
        fn()
    finally:
        sys.setprofile(None)
    return edges


def _backward(edges) -> list[str]:
    return sorted(f"{a} -> {b}" for a, b in edges if STAGES.index(a) > STAGES.index(b))


class _WrongGelu(torch.nn.Module):
    def forward(self, x):
        return torch.nn.functional.gelu(x) + 1


def _wrong_gelu(x):
    return x * 0.5


@pytest.fixture
def artifact(tmp_path, monkeypatch):
    monkeypatch.setenv("PT2B_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("PT2B_CACHE", raising=False)  # (the suite turns the cache off)
    export_model(_WrongGelu(), (torch.randn(3, 4),), tmp_path / "m.pt2b")
    return tmp_path / "m.pt2b"


def test_a_request_calls_each_stage_from_the_one_before(artifact):
    """A miss (lowered, validated, a wrong decomposition found and kept, stored), then a hit whose
    lazily built parts are used: every call between stages goes forward."""
    x = torch.randn(3, 4)
    request = dict(keep=None, decompositions={torch.ops.aten.gelu.default: _wrong_gelu})
    miss_edges = _calls_between_stages(lambda: load_for_backend(artifact, "core", **request)(x))
    assert {("exporter.api", "exporter.request"), ("exporter.lowering.pipeline", "exporter.lowering.repair"),
            ("exporter.lowering.repair", "exporter.lowering.lower")} <= miss_edges, miss_edges
    assert not _backward(miss_edges)
    load_for_backend(artifact, "core")  # stored (a custom table is not cached)
    hit = []
    hit_edges = _calls_between_stages(lambda: hit.append(load_for_backend(artifact, "core")) or (
        hit[0](x), hit[0].explain("aten::gelu.default")))
    assert hit[0].from_cache and ("exporter.lowering.pipeline", "exporter.lowering.cache") in hit_edges
    assert not _backward(hit_edges)


def test_the_check_finds_a_call_backwards():
    """The check itself: a stage calling one before it is reported."""
    assert _backward({("exporter.lowering.lower", "exporter.api")}) == ["exporter.lowering.lower -> exporter.api"]
    assert not _backward({("exporter.api", "exporter.lowering.lower")})


def test_a_lowered_program_is_built_complete(artifact):
    lowered = load_for_backend(artifact, "core", cache=False)
    assert lowered.validation is not None and lowered.methods == {"forward": lowered}
    with pytest.raises(AttributeError, match="LoweredProgram.validation is set when the program is built, not after"):
        lowered.validation = None
    with pytest.raises(AttributeError, match="LoweredProgram.from_cache is set"):
        lowered.from_cache = True
    ep = torch.export.export(_WrongGelu(), (torch.randn(3, 4),))
    in_memory = lower_exported(ep, plan_lowering("core"))
    assert isinstance(in_memory, LoweredProgram) and in_memory.validation is None and not in_memory.from_cache


# names a LoweredProgram is built with: none is assigned outside the class's own methods
_BUILT = {"fingerprint", "lowered_for", "preset", "backend", "table", "keep", "supported", "description", "unknown_supported_ops",
          "outside_opset", "from_cache", "reused", "validation", "method", "dim_names", "_methods", "_built", "_ops",
          "_source", "_source_prog", "_accepts"}
# (file, expression): an attribute of that name on another object
_OTHER_OBJECTS = {("exporter/serialize/write/writer.py", "low.fingerprint")}  # a FlatBuffers LoweringT


def _assignments_to_built_names(text: str, where: str) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(text)):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(
            node, (ast.AugAssign, ast.AnnAssign)) else []
        for target in targets:
            for e in ast.walk(target):
                if (isinstance(e, ast.Attribute) and isinstance(e.ctx, ast.Store) and e.attr in _BUILT
                        and not (isinstance(e.value, ast.Name) and e.value.id == "self")
                        and (where, ast.unparse(e)) not in _OTHER_OBJECTS):
                    found.append(f"{where}:{node.lineno}: {ast.unparse(e)}")
    return found


def test_nothing_is_set_on_a_lowered_program_after_it_is_built():
    wrong = []
    for package in ("exporter", "runtime_ref", "tools", "bench"):
        for path in sorted((ROOT / package).rglob("*.py")):
            where = path.relative_to(ROOT).as_posix()
            wrong += _assignments_to_built_names(path.read_text(), where)
    assert not wrong, wrong
    planted = "def f(lowered):\n    lowered.validation = None\n    one.method, one._methods = 'a', {}\n"
    assert _assignments_to_built_names(planted, "x.py") == ["x.py:2: lowered.validation", "x.py:3: one.method",
                                                            "x.py:3: one._methods"]
