"""runtime_ref.Runtime on programs with grad-mode and autocast regions (no_grad / enable_grad /
autocast in model code, e.g. a falcon-style rotary embedding): every preset is accepted and runs as
torch's lowered GraphModule does (bit for bit, same grad mode and autocast per op), close to eager;
the caller's grad mode and autocast state survive every call, also one that raises midway; an
unknown Python callable is still refused with OpsetError."""

from __future__ import annotations

import copy
import functools

import pytest
import torch
import torch.fx
from torch.utils._python_dispatch import TorchDispatchMode

import exporter
from exporter.errors import OpsetError
from tests.support.helpers import assert_bitwise, assert_close_to_eager
from runtime_ref import Runtime
from runtime_ref.regions import RegionGuard, retarget_autocast

CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
PRESETS = ["none", "core", "max"]
MARKERS = {"torch._C._set_grad_enabled", "torch.amp.autocast_mode._enter_autocast",
           "torch.amp.autocast_mode._exit_autocast", "higher_order::wrap_with_set_grad_enabled",
           "higher_order::wrap_with_autocast"}


# ---- models ----

class NoGradRegion(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(8, 8)

    def forward(self, x):
        y = self.lin(x)
        with torch.no_grad():
            z = torch.tanh(y * 2)
        return z + y


class EnableGradRegion(torch.nn.Module):
    """enable_grad nested in no_grad, over the parameters: the region records autograd history.
    Exported under no_grad (EXPORT_GRAD): captured with grad on, export turns the enable_grad part into
    plain ops and the no_grad part after it into a region with no outputs, which torch cannot load back."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(8, 8)

    def forward(self, x):
        with torch.no_grad():
            h = x.relu()
            with torch.enable_grad():
                y = torch.sigmoid(self.lin(h)) * 3
        return y - h


class AutocastRegion(torch.nn.Module):
    """A bf16 autocast region (linear, matmul, elementwise ops that could run in place), then a
    tensor-metadata assertion (`.float()`) and the same elementwise ops in float32."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(8, 8)

    def forward(self, x):
        with torch.autocast(x.device.type, dtype=torch.bfloat16):
            y = self.lin(x)
            z = torch.relu(((y @ y.transpose(-1, -2)) * 0.1).exp() - 1.0)
        return torch.relu(((z.float() + x.sum()) * 0.1).exp() - 1.0)


class _Rotary(torch.nn.Module):
    """A rotary embedding as falcon/llama had it: `@torch.no_grad()` forward with autocast turned off."""

    def __init__(self, dim=8):
        super().__init__()
        inv_freq = 1.0 / (10000 ** (torch.arange(0, dim, 2).float() / dim))
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    @torch.no_grad()
    def forward(self, x, position_ids):
        inv = self.inv_freq[None, :, None].float().expand(position_ids.shape[0], -1, 1)
        with torch.autocast(device_type=x.device.type, enabled=False):
            freqs = (inv @ position_ids[:, None, :].float()).transpose(1, 2)
            emb = torch.cat((freqs, freqs), dim=-1)
            cos, sin = emb.cos(), emb.sin()
        return cos.to(x.dtype), sin.to(x.dtype)


class FalconStyleRotary(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.q = torch.nn.Linear(8, 8)
        self.rotary = _Rotary()

    def forward(self, x):
        pos = torch.arange(x.shape[1], device=x.device)[None].expand(x.shape[0], -1)
        cos, sin = self.rotary(x, pos)
        q = self.q(x)
        q1, q2 = q.chunk(2, dim=-1)
        return q * cos + torch.cat((-q2, q1), dim=-1) * sin


MODELS = {"no_grad": NoGradRegion, "enable_grad": EnableGradRegion, "autocast": AutocastRegion,
          "falcon_rotary": FalconStyleRotary}
EXPORT_GRAD = {"enable_grad": False}  # grad mode export_model runs under (default: on)
# close to eager, not bit for bit: max decomposes ops into prims (all models), and the bf16 region's
# rounding then differs more
TOL = {"autocast": (2e-2, 2e-2)}


# ---- helpers ----

def _model(name):
    torch.manual_seed(0)
    return MODELS[name]().eval()


def _input(name):
    torch.manual_seed(1)
    return torch.randn(2, 5, 8)


@pytest.fixture(scope="module")
def lowered(tmp_path_factory):
    folder = tmp_path_factory.mktemp("regions")

    @functools.lru_cache(maxsize=None)
    def get(name, preset):
        path = folder / f"{name}.pt2b"
        if not path.exists():
            with torch.set_grad_enabled(EXPORT_GRAD.get(name, True)):
                exporter.export_model(_model(name), (_input(name),), str(path))
        return exporter.load_for_backend(str(path), preset, cache=False)

    return get


def _nesting() -> int:
    torch.autocast_increment_nesting()
    return torch.autocast_decrement_nesting()


def _global_state():
    return (torch.is_grad_enabled(), torch.is_autocast_enabled("cpu"), torch.get_autocast_dtype("cpu"),
            torch.is_autocast_cache_enabled(), _nesting())


def _torch_module(program, x):
    """What torch's own lowered GraphModule gives; it leaves grad mode as its graph last set it, so the
    caller's is put back here."""
    with torch.set_grad_enabled(torch.is_grad_enabled()):
        return program.exported_program().module()(x)


class _Modes(TorchDispatchMode):
    """Records, for every op reaching the dispatcher (but detach), the grad mode it ran under and the
    dtype of its result (autocast shows there: bf16 out of float32 inputs)."""

    def __init__(self):
        super().__init__()
        self.seen = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func is not torch.ops.aten.detach.default:
            self.seen.append((torch.is_grad_enabled(), out.dtype if isinstance(out, torch.Tensor) else None))
        return out


def _base_name(func) -> str:
    """'cos' for aten::cos.default and prims::cos.default."""
    return func._schema.name.split("::", 1)[1]


class _RaiseOn(TorchDispatchMode):
    """Raises when an op named one of `names` (aten or prims) is dispatched: a run failing midway."""

    def __init__(self, names):
        super().__init__()
        self.names = names

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if _base_name(func) in self.names:
            raise RuntimeError(f"boom in {func}")
        return func(*args, **(kwargs or {}))


# ---- the regions are accepted and run as torch runs them ----

@pytest.mark.parametrize("preset", PRESETS)
@pytest.mark.parametrize("name", sorted(MODELS))
def test_regions_match_torch_module_and_eager(lowered, name, preset):
    program = lowered(name, preset)
    rt = Runtime(program)
    assert MARKERS & set(rt.ops()), f"{name}/{preset}: the program lost its regions: {sorted(rt.ops())}"
    x = _input(name)
    for grad in (True, False):
        with torch.set_grad_enabled(grad):
            before = _global_state()
            out = rt(x)
            assert _global_state() == before
            assert out.grad_fn is None and not out.requires_grad
            assert_bitwise(out, _torch_module(program, x).detach())
            eager = _model(name)(x).detach()
            if preset == "max" or name in TOL:
                assert_close_to_eager(out, eager, *TOL.get(name, (1e-5, 1e-5)))
            else:
                assert_bitwise(out, eager)
    assert_bitwise(rt(x), out)  # a second call on the same Runtime


@pytest.mark.parametrize("preset", PRESETS)
@pytest.mark.parametrize("name", ["enable_grad", "autocast", "falcon_rotary"])
def test_each_op_runs_under_the_grad_mode_and_autocast_torch_gives_it(lowered, name, preset):
    program, x = lowered(name, preset), _input(name)
    rt = Runtime(program)
    with torch.no_grad():
        with _Modes() as theirs:
            _torch_module(program, x)
        with _Modes() as ours:
            rt(x)
    assert len(ours.seen) > 5 and ours.seen == theirs.seen
    if name == "enable_grad":
        assert {grad for grad, _ in ours.seen} == {True, False}
    if name == "autocast":
        assert {dtype for _, dtype in ours.seen} >= {torch.bfloat16, torch.float32}


def test_autocast_region_runs_in_low_precision_and_never_in_place(lowered):
    program, x = lowered("autocast", "core"), _input("autocast")
    rt = Runtime(program)
    names = rt.plan.step_names
    inside = names[names.index("_enter_autocast") + 1:names.index("_exit_autocast")]
    nodes = {n.name: n for n in program.exported_program().graph.nodes}
    assert nodes[inside[-1]].meta["val"].dtype == torch.bfloat16  # the region's result
    # exp, sub, relu: in place outside the region (float32), not inside it (autocast may cast the
    # functional op's inputs, never the in-place variant's)
    assert {"exp", "sub", "relu"} <= set(inside) and not set(inside) & set(rt.plan.in_place_steps)
    assert {"exp_1", "sub_1", "relu_1"} <= set(rt.plan.in_place_steps)
    assert_bitwise(rt(x), _torch_module(program, x))


# ---- the caller's state is given back ----

@pytest.mark.parametrize("preset", PRESETS)
def test_callers_autocast_and_grad_state_survive_a_call(lowered, preset):
    rt, x = Runtime(lowered("autocast", preset)), _input("autocast")
    with torch.autocast("cpu", dtype=torch.float16, cache_enabled=False):
        before = _global_state()
        rt(x)
        assert _global_state() == before
    with torch.enable_grad():
        before = _global_state()
        rt(x)
        assert _global_state() == before


@pytest.mark.parametrize("preset", PRESETS)
@pytest.mark.parametrize("name, ops", [("autocast", {"bmm"}), ("enable_grad", {"addmm", "mm"}),
                                       ("falcon_rotary", {"cos"})])
def test_state_is_restored_when_a_run_raises_inside_a_region(lowered, name, ops, preset):
    rt, x = Runtime(lowered(name, preset)), _input(name)
    for grad in (True, False):
        with torch.set_grad_enabled(grad):
            before = _global_state()
            with _RaiseOn(ops), pytest.raises(RuntimeError, match="boom"):
                rt(x)
            assert _global_state() == before
    assert_bitwise(rt(x), _torch_module(lowered(name, preset), x))  # and the next run is unaffected


def test_guard_undoes_an_autocast_region_left_open():
    """What the flat markers leave behind when a run raises between _enter_autocast and _exit_autocast."""
    def run(leaves):
        torch.amp.autocast_mode._enter_autocast("cpu", torch.bfloat16, True, False)
        torch._C._set_grad_enabled(True)
        raise RuntimeError("midway")

    before = _global_state()
    with torch.enable_grad():
        with pytest.raises(RuntimeError, match="midway"):
            RegionGuard({"cpu"}).wrap(run)(())
        # autocast as the caller had it; grad left off (Runtime.__call__ restores the caller's)
        assert _global_state() == (False, *before[1:])
    assert _global_state() == before


# ---- the opset check ----

def _set_grad_enabled(flag):
    """A lookalike of torch._C._set_grad_enabled: same name, not the same target."""
    torch._C._set_grad_enabled(flag)


@pytest.mark.parametrize("preset", ["core", "max"])
def test_regions_are_accepted_whatever_the_opset_and_lookalikes_are_refused(lowered, preset):
    program = lowered("no_grad", preset)
    ops = Runtime(program).ops()
    assert ops["torch._C._set_grad_enabled"] == 2
    Runtime(program, opset=[k for k in ops if "::" in k and not k.startswith("higher_order")])

    ep = copy.deepcopy(program.exported_program())
    for node in ep.graph.nodes:
        if node.target is torch._C._set_grad_enabled:
            node.target = _set_grad_enabled
    ep.graph_module.recompile()
    with pytest.raises(OpsetError, match=r"test_runtime_grad_modes\._set_grad_enabled: used by "
                                         r"_set_grad_enabled, _set_grad_enabled_1\n"):
        Runtime(ep)


def test_region_hops_are_accepted_and_counted(lowered):
    ops = Runtime(lowered("falcon_rotary", "none")).ops()
    assert ops["higher_order::wrap_with_set_grad_enabled"] == 1
    assert ops["higher_order::wrap_with_autocast"] == 1


# ---- devices: an autocast region follows the runtime's device ----

def test_autocast_device_type_follows_the_runtime_device():
    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    args = ("cpu", torch.bfloat16, True, False)
    assert retarget_autocast(args, frozenset({"cpu"}), cuda) == ("cuda", torch.bfloat16, True, False)
    assert retarget_autocast(args, frozenset({"cpu"}), cpu) == args
    # a region for a device type the program does not run on is left alone (it changes nothing there)
    assert retarget_autocast(("cuda", torch.float16, False, None), frozenset({"cpu"}), cpu)[0] == "cuda"


@CUDA
@pytest.mark.parametrize("preset", PRESETS)
@pytest.mark.parametrize("name", ["autocast", "falcon_rotary"])
def test_cpu_recorded_regions_run_on_cuda(lowered, name, preset):
    """Recorded on cpu with `torch.autocast(x.device.type, ...)`: on cuda the region autocasts cuda, as
    the model run eagerly on cuda does."""
    x = _input(name).cuda()
    before = (torch.is_grad_enabled(), torch.is_autocast_enabled("cuda"), torch.get_autocast_dtype("cuda"))
    out = Runtime(lowered(name, preset), device="cuda")(x)
    assert (torch.is_grad_enabled(), torch.is_autocast_enabled("cuda"), torch.get_autocast_dtype("cuda")) == before
    with torch.no_grad():
        eager = _model(name).cuda()(x)
    assert_close_to_eager(out, eager, *TOL.get(name, (1e-4, 1e-4)))
