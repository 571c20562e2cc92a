"""A call of a loaded program with other inputs than it was exported with is a RuntimeInputError naming what
was expected and what was given, on every call path: load(path)(...), its module(), load_for_backend's
program, each method of a multi-method file, and runtime_ref. torch's own module raised a bare
`ValueError: Trying to flatten user inputs`, `Ran into a kwarg keyword mismatch`, an AttributeError or
`AssertionError: Guard failed`."""

from __future__ import annotations

import pytest
import torch
from torch.export import Dim

from exporter import export_model, load, load_for_backend
from exporter.errors import InputGuardError, MissingKernelError, RuntimeInputError
from runtime_ref import Runtime


class Model(torch.nn.Module):
    def forward(self, x, ys, scale):
        return x + ys[0] * ys[1] + scale


def _inputs(n=3):
    torch.manual_seed(0)
    return torch.randn(n, 4), [torch.randn(n, 4), torch.randn(n, 4)], torch.randn(4)


@pytest.fixture(scope="module")
def path(tmp_path_factory):
    p = tmp_path_factory.mktemp("calls") / "m.pt2b"
    x, ys, s = _inputs()
    b = Dim("b", max=64)
    export_model(Model(), (x, ys), p, kwargs={"scale": s}, dynamic_shapes={"x": {0: b}, "ys": [{0: b}, {0: b}],
                                                                           "scale": None})
    return p


@pytest.fixture(scope="module")
def paths(path):
    lowered = load_for_backend(path, cache=False)
    return {"load": load(path), "module": load(path).module(), "lowered": lowered,
            "runtime_ref": Runtime(load(path))}


def _bad_calls():
    x, ys, s = _inputs()
    return {  # case -> (args, kwargs, error type, what the message says)
        "too few args": ((x,), {"scale": s}, RuntimeInputError, "expected 2 positional argument(s) (x, ys) and keyword "
                         "argument(s) ['scale']; got 1 positional and keyword argument(s) ['scale']"),
        "too many args": ((x, ys, s), {"scale": s}, RuntimeInputError, "got 3 positional"),
        "dict for list": ((x, {"a": ys[0], "b": ys[1]}), {"scale": s}, RuntimeInputError,
                          "first difference: ys: expected a list of 2 item(s), got a dict with keys ['a', 'b']"),
        "tensor for list": ((x, ys[0]), {"scale": s}, RuntimeInputError,
                            "first difference: ys: expected a list of 2 item(s), got Tensor"),
        "missing kwarg": ((x, ys), {}, RuntimeInputError, "(missing ['scale'], unexpected [])"),
        "extra kwarg": ((x, ys), {"scale": s, "z": s}, RuntimeInputError, "(missing [], unexpected ['z'])"),
        "int for tensor": ((x, ys), {"scale": 3}, RuntimeInputError, "input 'scale' is not a tensor"),
        "wrong rank": ((x[None], ys), {"scale": s}, RuntimeInputError, "rank 3"),
        "static size": ((x[:, :3], ys), {"scale": s}, InputGuardError, "4"),
        "dims that must be equal": ((x[:2], ys), {"scale": s}, InputGuardError, "size()[0]"),
        "out of range": ((torch.randn(100, 4), [torch.randn(100, 4)] * 2), {"scale": s}, InputGuardError, "100"),
    }


@pytest.mark.parametrize("case", sorted(_bad_calls()))
@pytest.mark.parametrize("where", ["load", "module", "lowered", "runtime_ref"])
def test_a_wrong_call_is_a_runtime_input_error_naming_it(paths, case, where):
    args, kwargs, error, says = _bad_calls()[case]
    if where == "runtime_ref":  # its own checks, worded as its own: the class is what matters here
        error = RuntimeInputError
        says = {"int for tensor": 'input "scale" is not a tensor', "wrong rank": "wrong rank 3",
                "static size": "static and must be 4", "dims that must be equal": "must be equal",
                "out of range": "is 100, outside the range [0, 64]"}.get(case, says)
    with pytest.raises(error) as e:
        paths[where](*args, **kwargs)
    assert says in str(e.value), str(e.value)


@pytest.mark.parametrize("where", ["load", "module", "lowered"])
def test_the_error_names_the_program_and_is_also_what_torch_raised_for_guards(paths, path, where):
    x, ys, s = _inputs()
    with pytest.raises(RuntimeInputError) as e:
        paths[where](x, ys)
    head = str(path) if where != "lowered" else "the program lowered for core"
    assert str(e.value).startswith(f"{head}") and "Call it with the inputs it was exported with" in str(e.value)
    with pytest.raises(AssertionError):  # a guard: an AssertionError, as torch's module raised
        paths[where](x[:, :3], ys, scale=s)


@pytest.mark.parametrize("where", ["load", "module", "lowered", "runtime_ref"])
def test_a_right_call_still_computes_what_eager_does(paths, where):
    for n in (3, 7):
        x, ys, s = _inputs(n)
        torch.testing.assert_close(paths[where](x, ys, scale=s), Model()(x, ys, s), rtol=0, atol=0)


def test_each_method_of_a_file_names_itself(tmp_path):
    class Two(torch.nn.Module):
        def forward(self, x):
            return x * 2

        def half(self, x, y):
            return x / 2 + y

    m, p = Two(), tmp_path / "two.pt2b"
    export_model({"forward": (m, (torch.randn(2, 3),)), "half": (m.half, (torch.randn(2, 3), torch.randn(2, 3)))}, p)
    prog = load(p)
    with pytest.raises(RuntimeInputError, match=r"two\.pt2b \(method 'half'\): inputs do not match the program's "
                                                r"signature: expected 2 positional argument\(s\) \(x, y\)"):
        prog["half"](torch.randn(2, 3))
    with pytest.raises(RuntimeInputError, match=r"\(method 'forward'\): .* expected 1 positional argument\(s\) \(x\)"):
        prog(torch.randn(2, 3), torch.randn(2, 3))
    with pytest.raises(InputGuardError, match=r"\(method 'half'\): the inputs break a condition"):
        prog["half"].module()(torch.randn(3, 3), torch.randn(3, 3))
    assert torch.equal(prog["half"](torch.ones(2, 3), torch.ones(2, 3)), torch.full((2, 3), 1.5))


def test_an_op_without_a_kernel_for_the_device_is_named_not_a_dispatcher_trace():
    """A program captured where torch chose a device's own kernel (MPS's attention) called on the CPU: a
    MissingKernelError (a NotImplementedError too) naming the op, as runtime_ref names it at load."""
    import pathlib

    path = pathlib.Path(__file__).parents[1] / "golden" / "drift" / f"torch-{torch.__version__.split('+')[0]}" / \
        "sdpa_math_for_mps.pt2b"
    if not path.exists():
        pytest.skip(f"no drift golden for torch {torch.__version__}")
    prog = load(path)
    args, kwargs = prog.exported_program().example_inputs
    op = "aten::_scaled_dot_product_attention_math_for_mps.default"
    with pytest.raises(MissingKernelError) as e:
        prog(*args, **kwargs)
    assert isinstance(e.value, NotImplementedError)
    assert str(e.value).startswith(f"{path}: program calls 1 operator(s) this torch has no cpu kernel for, so torch "
                                   f"cannot run them on cpu:\n  {op}: no kernel on any device")
    assert "load_for_backend(..., decompositions={op: fn})" in str(e.value)
