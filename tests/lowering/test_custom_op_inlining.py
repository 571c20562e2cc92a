"""A custom op a backend does not list is lowered through the kernel its author registered for every
device: the backend gets the ATen ops that kernel calls, the result is validated like any other
decomposition, keep= forbids it, and a kernel that does not trace on the program's values leaves the op."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from exporter import export_model, load_for_backend
from exporter._torch.custom_kernels import composite_kernel
from exporter.lowering.presets import load as load_preset
from tests.support import segment_ops

NS = "pt2b_inline_test"


@torch.library.custom_op(f"{NS}::gated", mutates_args=())
def gated(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return nn.functional.gelu(x) * torch.sigmoid(x @ w)


@gated.register_fake
def _(x, w):
    return x @ w


@torch.library.custom_op(f"{NS}::scale_", mutates_args=("x",))
def scale_(x: torch.Tensor) -> None:
    x.mul_(2)


# an op whose kernel for every device is not what its CPU kernel computes: inlining it would change the result
_LIB = torch.library.Library(NS, "DEF")
_LIB.define("twice(Tensor x) -> Tensor")
_LIB.impl("twice", lambda x: x * 2, "CompositeExplicitAutograd")
_LIB.impl("twice", lambda x: x * 3, "CPU")


class Gated(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(8, 8))

    def forward(self, x):
        return torch.ops.pt2b_inline_test.gated(x, self.w) + 1


class Segmented(nn.Module):
    def __init__(self, op):
        super().__init__()
        self.op = op

    def forward(self, x, offs):
        return self.op(x, offs).relu()


class Twice(nn.Module):
    def forward(self, x):
        return torch.ops.pt2b_inline_test.twice(x) + 1


CORE = sorted(load_preset("core").opset)


@pytest.fixture(scope="module")
def gated_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("inline") / "gated.pt2b"
    torch.manual_seed(0)
    model = Gated().eval()
    export_model(model, (torch.randn(3, 8),), path)
    return path, model


def test_a_custom_op_the_list_lacks_is_lowered_through_its_own_kernel(gated_file):
    path, model = gated_file
    lowered = load_for_backend(path, supported_ops=CORE, cache=False)
    name = f"{NS}::gated.default"
    assert name not in lowered.ops() and {"aten::gelu.default", "aten::sigmoid.default"} <= set(lowered.ops())
    assert set(lowered.inlined_custom_ops()) == {name}
    assert lowered.inlined_custom_ops()[name].endswith(f"{__file__.rsplit('/', 1)[-1]}:{gated._init_fn.__code__.co_firstlineno}")
    assert lowered.explain(name).startswith(f"{name}: inlined for supported_ops, which does not list it: lowered "
                                            f"through its own kernel")
    assert lowered.validation.status == "passed"
    assert f"lowered through their own kernels (1): {name}" in lowered.report()
    x = torch.randn(3, 8)
    torch.testing.assert_close(lowered(x), model(x), rtol=1e-6, atol=1e-6)


def test_keep_forbids_inlining_and_the_op_stays(gated_file):
    path, _ = gated_file
    for keep in ([f"{NS}::gated"], [f"{NS}::*"]):
        lowered = load_for_backend(path, supported_ops=CORE, keep=keep, cache=False)
        assert lowered.ops()[f"{NS}::gated.default"] == 1 and lowered.inlined_custom_ops() == {}


def test_a_preset_leaves_custom_ops_whole(gated_file):
    """core ATen IR holds a program's custom ops as they are (a backend registers its own kernels)."""
    path, _ = gated_file
    lowered = load_for_backend(path, cache=False)
    assert lowered.ops()[f"{NS}::gated.default"] == 1 and lowered.inlined_custom_ops() == {}


def test_the_cache_serves_the_inlined_lowering_as_it_was_made(gated_file, tmp_path, monkeypatch):
    path, model = gated_file
    monkeypatch.setenv("PT2B_CACHE_DIR", str(tmp_path / "cache"))
    made = load_for_backend(path, supported_ops=CORE, cache=True)
    served = load_for_backend(path, supported_ops=CORE, cache=True)
    assert (made.from_cache, served.from_cache) == (False, True)
    assert served.ops() == made.ops() and served.inlined_custom_ops() == made.inlined_custom_ops()
    assert served.explain(f"{NS}::gated").startswith(f"{NS}::gated.default: inlined")
    x = torch.randn(3, 8)
    torch.testing.assert_close(served(x), model(x), rtol=1e-6, atol=1e-6)


def test_a_kernel_that_reads_data_but_does_not_branch_on_it_is_inlined(tmp_path):
    model = Segmented(torch.ops.pt2b_segment_test.segments)
    x = torch.randn(6, 4)
    export_model(model, (x, torch.tensor([2, 6])), tmp_path / "seg.pt2b")
    lowered = load_for_backend(tmp_path / "seg.pt2b", supported_ops=CORE, cache=False)
    assert f"{segment_ops.NS}::segments.default" in lowered.inlined_custom_ops()
    assert not any(name.startswith(segment_ops.NS) for name in lowered.ops())
    for offs in ([2, 6], [0, 6], [3, 3], [6, 6]):
        offs = torch.tensor(offs)
        assert torch.equal(lowered(x, offs), model(x, offs))


def test_a_kernel_that_branches_on_data_leaves_the_op_and_says_why(tmp_path):
    model = Segmented(torch.ops.pt2b_segment_test.branchy)
    x = torch.randn(6, 4)
    export_model(model, (x, torch.tensor([2, 6])), tmp_path / "branchy.pt2b")
    lowered = load_for_backend(tmp_path / "branchy.pt2b", supported_ops=CORE, cache=False)
    name = f"{segment_ops.NS}::branchy.default"
    assert lowered.ops()[name] == 1 and lowered.inlined_custom_ops() == {}
    assert "does not trace on this program's values (it decides its control flow from data)" in lowered.explain(name)
    for offs in ([2, 6], [0, 6]):
        offs = torch.tensor(offs)
        assert torch.equal(lowered(x, offs), model(x, offs))


def test_a_kernel_that_differs_from_what_the_device_runs_fails_validation_and_the_op_stays(tmp_path):
    """Inlining is a decomposition like any other: the lowering is compared with the program's own run
    (its CPU kernel), and a kernel for every device that computes something else is not applied."""
    x = torch.randn(4, 3)
    export_model(Twice(), (x,), tmp_path / "twice.pt2b")
    lowered = load_for_backend(tmp_path / "twice.pt2b", supported_ops=CORE, cache=False)
    name = f"{NS}::twice.default"
    assert lowered.ops()[name] == 1 and lowered.inlined_custom_ops() == {}
    assert name in lowered.validation.kept and lowered.explain(name).startswith(f"{name}: kept: its decomposition failed")
    torch.testing.assert_close(lowered(x), x * 3 + 1)


def test_only_a_functional_op_with_a_kernel_for_every_device_has_one_to_inline():
    assert composite_kernel(torch.ops.pt2b_inline_test.gated.default) is not None
    assert composite_kernel(torch.ops.pt2b_inline_test.scale_.default) is None  # it writes its argument
    assert composite_kernel(torch.ops.aten.add.Tensor) is None  # no kernel for every device


def test_an_inlined_op_hands_over_to_a_backend_that_lacks_it(gated_file):
    pytest.importorskip("onnxscript")
    pytest.importorskip("onnxruntime")
    from exporter.backends import to_backend
    from exporter.errors import BackendHandOffError

    path, model = gated_file
    compiled = to_backend(load_for_backend(path, backend="onnx", cache=False))
    assert compiled.validation.status == "passed"
    x = torch.randn(3, 8)
    torch.testing.assert_close(compiled(x), model(x), rtol=1e-5, atol=1e-5)
    with pytest.raises(BackendHandOffError, match=f"No ONNX function found for .*{NS}.gated"):
        to_backend(load_for_backend(path, backend="onnx", keep=[f"{NS}::gated"], cache=False))
