"""Single-op export cases built from torch's OpInfo database (op_db), one per exportable entry.
Owns turning OpInfo samples into nn.Modules + inputs and checking torch can export/save/load them."""

from __future__ import annotations

import dataclasses
import io
import itertools
import math
import warnings

import torch
import torch.utils._pytree as pytree

MAX_SAMPLES = 3

# Skipped by name; everything else is filtered generically (see _case_for).
SKIP = {
    # random: output depends on the RNG state
    "bernoulli": "random",
    "cauchy": "random",
    "exponential": "random",
    "geometric": "random",
    "log_normal": "random",
    "multinomial": "random",
    "normal": "random",
    "normal.in_place": "random",
    "normal.number_mean": "random",
    "uniform": "random",
    "rand_like": "random",
    "randint": "random",
    "randint_like": "random",
    "randn": "random",
    "randn_like": "random",
    "nn.functional.alpha_dropout": "random",
    "nn.functional.dropout": "random",
    "nn.functional.dropout2d": "random",
    "nn.functional.dropout3d": "random",
    "nn.functional.feature_alpha_dropout.with_train": "random",
    "nn.functional.rrelu": "random (training=True samples)",
    # uninitialized memory: output is whatever was in the allocation
    "empty": "uninitialized output",
    "empty_like": "uninitialized output",
    "empty_permuted": "uninitialized output",
    "empty_strided": "uninitialized output",
    "new_empty": "uninitialized output",
    "new_empty_strided": "uninitialized output",
    # need CUDA kernels
    "torch.ops.aten._flash_attention_forward": "CUDA only",
    "torch.ops.aten._efficient_attention_forward": "CUDA only",
    # sparse layouts
    "to_sparse": "sparse output",
    "sparse.sampled_addmm": "sparse",
    "sparse.mm.reduce": "sparse",
}

_FALLBACK_DTYPES = (torch.float64, torch.int64, torch.int32, torch.bool, torch.float16, torch.bfloat16,
                    torch.int16, torch.int8, torch.uint8)


@dataclasses.dataclass
class OpCase:
    op_name: str
    module: torch.nn.Module
    args: tuple
    kwargs: dict


class _OpModule(torch.nn.Module):
    """Calls one op; tensors come in through forward, every other argument is baked in."""

    def __init__(self, op, leaves, spec, slots):
        super().__init__()
        self._op, self._leaves, self._spec, self._slots = op, leaves, spec, slots

    def forward(self, *tensors, **tensor_kwargs):
        leaves = list(self._leaves)
        for i, t in zip(self._slots, tensors):
            leaves[i] = t
        inp, args, kwargs = pytree.tree_unflatten(leaves, self._spec)
        return self._op(inp, *args, **kwargs, **tensor_kwargs)


def _op_name(opinfo) -> str:
    return opinfo.name + (f".{opinfo.variant_test_name}" if opinfo.variant_test_name else "")


def _dtype_for(opinfo):
    dtypes = opinfo.supported_dtypes("cpu")
    if torch.float32 in dtypes:
        return torch.float32
    return next((d for d in _FALLBACK_DTYPES if d in dtypes), None)


def _clone(x):
    return x.detach().clone() if isinstance(x, torch.Tensor) else x


def _build(opinfo, sample):
    """(module, args, kwargs) for one sample: tensors become inputs, the rest constants."""
    tensor_kwargs = {k: _clone(v) for k, v in sample.kwargs.items() if isinstance(v, torch.Tensor)}
    const_kwargs = {k: v for k, v in sample.kwargs.items() if not isinstance(v, torch.Tensor)}
    leaves, spec = pytree.tree_flatten((sample.input, tuple(sample.args), const_kwargs))
    slots = [i for i, leaf in enumerate(leaves) if isinstance(leaf, torch.Tensor)]
    args = tuple(_clone(leaves[i]) for i in slots)
    consts = [None if isinstance(leaf, torch.Tensor) else leaf for leaf in leaves]
    return _OpModule(opinfo.op, consts, spec, slots), args, tensor_kwargs


def _leaves_equal(a, b) -> bool:
    if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)):
        return False
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    if torch.equal(a, b):
        return True
    if not (a.is_floating_point() or a.is_complex()):
        return False
    nan_a, nan_b = torch.isnan(a), torch.isnan(b)
    return torch.equal(nan_a, nan_b) and torch.equal(a[~nan_a], b[~nan_b])


def _outputs_equal(a, b) -> bool:
    leaves_a, spec_a = pytree.tree_flatten(a)
    leaves_b, spec_b = pytree.tree_flatten(b)
    return spec_a == spec_b and all(_leaves_equal(x, y) for x, y in zip(leaves_a, leaves_b))


def _plain_tensor(t) -> bool:
    return (isinstance(t, torch.Tensor) and t.layout == torch.strided and not t.is_quantized
            and t.device.type == "cpu")


def _good_output(out) -> bool:
    """A (pytree of) plain dense CPU tensor(s) with no NaN."""
    leaves = pytree.tree_leaves(out)
    if not leaves or not all(_plain_tensor(t) for t in leaves):
        return False
    return not any((t.is_floating_point() or t.is_complex()) and torch.isnan(t).any() for t in leaves)


def _fresh(args, kwargs):
    return tuple(_clone(a) for a in args), {k: _clone(v) for k, v in kwargs.items()}


def _run(module, args, kwargs, seed):
    a, k = _fresh(args, kwargs)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        out = module(*a, **k)
    return out, a, k


def _eager_ok(module, args, kwargs):
    """The eager output if the op is deterministic, leaves its inputs alone and gives plain tensors."""
    out, a, k = _run(module, args, kwargs, 0)
    if not _good_output(out):
        return None
    if not (_outputs_equal((a, k), (args, kwargs))):  # mutated an input
        return None
    again, _, _ = _run(module, args, kwargs, 1)
    return out if _outputs_equal(out, again) else None


def _torch_roundtrips(ep) -> bool:
    buf = io.BytesIO()
    torch.export.save(ep, buf)
    buf.seek(0)
    torch.export.load(buf)
    return True


def _check(module, args, kwargs) -> bool:
    expected = _eager_ok(module, args, kwargs)
    if expected is None:
        return False
    ep = torch.export.export(module, args, kwargs, strict=False)
    got = ep.module()(*_fresh(args, kwargs)[0], **_fresh(args, kwargs)[1])
    return _outputs_equal(got, expected) and _torch_roundtrips(ep)


def _samples(opinfo, dtype):
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        return list(itertools.islice(opinfo.sample_inputs("cpu", dtype), MAX_SAMPLES))


def _case_for(opinfo) -> OpCase | None:
    dtype = _dtype_for(opinfo)
    if dtype is None:
        return None
    try:
        samples = _samples(opinfo, dtype)
    except Exception:
        return None
    for sample in samples:
        try:
            module, args, kwargs = _build(opinfo, sample)
            if _check(module, args, kwargs):
                return OpCase(_op_name(opinfo), module, args, kwargs)
        except Exception:
            continue
    return None


def _candidates():
    from torch.testing._internal.common_methods_invocations import op_db

    ops = [o for o in op_db if _op_name(o) not in SKIP]
    return sorted(ops, key=_op_name)


def opinfo_cases(limit: int | None = None) -> list[OpCase]:
    """One case per OpInfo entry that torch.export.export(case.module, case.args, case.kwargs) can export on CPU,
    deterministic order (sorted by op_name), deterministic inputs (seeded)."""
    cases = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for opinfo in _candidates():
            if limit is not None and len(cases) >= limit:
                break
            case = _case_for(opinfo)
            if case is not None:
                cases.append(case)
    return cases
