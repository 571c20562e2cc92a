"""Programs that call torch.vmap or torch.func.jvp in model code (NeMo's ASR encoders vmap over a
batch of streams): torch.export leaves the region as calls of torch._functorch.predispatch
functions. pt2b writes them and reads them back bit for bit (the reader accepts exactly those
functions, nothing else under torch), keeps them in the artifact, and lowers each region below the
batching layer (exporter/lowering/engines/functorch_regions.py) for every preset, close to eager on runtime_ref."""

from __future__ import annotations

import functools

import pytest
import torch

import exporter
from exporter.errors import CorruptArtifactError
from exporter.lowering.engines.functorch_regions import MARKERS
from exporter.serialize.read import untrusted
from tests.support.helpers import assert_bitwise, assert_close_to_eager
from runtime_ref import Runtime


class VmapMatmul(torch.nn.Module):
    """A per-sample matmul under vmap: matmul has no batching rule and decomposes at that layer."""

    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(4, 3))

    def forward(self, x):
        return torch.vmap(lambda r: r @ self.w)(x) + 1


class NestedVmap(torch.nn.Module):
    """Two vmaps, the outer over dim 1, with a CompositeImplicit op (gelu) and a reduction inside."""

    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(4, 3))

    def forward(self, x):
        inner = lambda r: torch.nn.functional.gelu(r @ self.w).sum(-1)  # noqa: E731
        return torch.vmap(torch.vmap(inner), in_dims=1)(x) * 2


class Jvp(torch.nn.Module):
    """Forward-mode AD inside forward: value and directional derivative of tanh(linear(x))."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)

    def forward(self, x):
        out, tangent = torch.func.jvp(lambda a: torch.tanh(self.lin(a)), (x,), (torch.ones_like(x),))
        return out + tangent


class VmapBetweenOps(torch.nn.Module):
    """Plain ops before, between and after two separate vmap regions, with a dynamic batch."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)

    def forward(self, x):
        h = self.lin(x).relu()
        a = torch.vmap(lambda r: torch.outer(r, r).trace())(h)
        b = torch.vmap(lambda r: r.softmax(-1) * r)(h)
        return b.sum(-1) + a


MODELS = {"vmap_matmul": (VmapMatmul, (5, 2, 4)), "nested_vmap": (NestedVmap, (5, 2, 4)),
          "jvp": (Jvp, (3, 4)), "vmap_between_ops": (VmapBetweenOps, (6, 4))}
DYNAMIC = {"vmap_between_ops": ({0: torch.export.Dim("batch", min=2, max=64)},)}


def _model(name):
    torch.manual_seed(0)
    return MODELS[name][0]().eval()


def _input(name, batch=None):
    torch.manual_seed(1)
    shape = list(MODELS[name][1])
    if batch is not None:
        shape[0] = batch
    return torch.randn(*shape)


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    folder = tmp_path_factory.mktemp("functorch")

    @functools.lru_cache(maxsize=None)
    def get(name):
        path = folder / f"{name}.pt2b"
        ep = exporter.export_model(_model(name), (_input(name),), str(path), dynamic_shapes=DYNAMIC.get(name))
        return path, ep

    return get


def _region_calls(gm) -> list[str]:
    return [n.target.__name__ for n in gm.graph.nodes if n.op == "call_function" and n.target in MARKERS]


@pytest.mark.parametrize("name", sorted(MODELS))
def test_written_read_back_bitwise_with_the_region_kept(written, name):
    path, ep = written(name)
    program = exporter.load(str(path))
    loaded = program.exported_program()
    assert _region_calls(loaded.graph_module) == _region_calls(ep.graph_module) != []
    x = _input(name)
    assert_bitwise(loaded.module()(x), ep.module()(x))


@pytest.mark.parametrize("preset", ["none", "core", "max"])
@pytest.mark.parametrize("name", sorted(MODELS))
def test_lowered_without_regions_runs_close_to_eager(written, name, preset):
    path, _ = written(name)
    lowered = exporter.load_for_backend(str(path), preset, cache=False)
    assert _region_calls(lowered.exported_program().graph_module) == []
    assert lowered.validation.status == "passed"
    rt = Runtime(lowered)
    for batch in ([None, 9, 2] if name in DYNAMIC else [None]):
        x = _input(name, batch)
        assert_close_to_eager(rt(x), _model(name)(x), rtol=1e-5, atol=1e-5)


def test_core_lowering_matches_torch_run_decompositions(written):
    """The region is flattened as torch's own retrace flattens it: the same ops, same results."""
    path, ep = written("nested_vmap")
    lowered = exporter.load_for_backend(str(path), "core", cache=False).exported_program()
    torch_lowered = ep.run_decompositions()

    def ops(gm):
        return sorted(str(n.target) for n in gm.graph.nodes if n.op == "call_function")

    assert ops(lowered.graph_module) == ops(torch_lowered.graph_module)
    x = _input("nested_vmap")
    assert_bitwise(lowered.module()(x), torch_lowered.module()(x))


@pytest.mark.parametrize("target", sorted(untrusted.PREDISPATCH_TARGETS))
def test_each_predispatch_function_is_an_accepted_target(target):
    untrusted.check_target(target, "t")


@pytest.mark.parametrize("target", [
    "torch._functorch.predispatch.torch", "torch._functorch.predispatch._vmap_increment_nesting_impl",
    "torch._functorch.vmap.vmap_impl", "torch._C._functorch._add_batch_dim", "torch.func.vmap",
])
def test_other_functions_near_them_are_refused(target):
    with pytest.raises(CorruptArtifactError, match="nor a pre-dispatch region function"):
        untrusted.check_target(target, "t")
