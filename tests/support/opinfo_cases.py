"""Single-op export cases built from torch's OpInfo database (op_db), one per exportable entry.
Owns turning OpInfo samples into nn.Modules + inputs and checking torch can export/save/load them."""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import functools
import io
import itertools
import logging
import random
import warnings

import numpy as np
import torch
import torch.utils._pytree as pytree

MAX_SAMPLES = 3
# torch warns through these while probing ops that end up dropped (data-dependent guards, unbacked symbols)
_NOISY_LOGGERS = ("torch.fx.experimental.symbolic_shapes", "torch._export.serde.serialize")

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
    "pca_lowrank": "random: seeded in eager by its wrapper; export does not trace manual_seed",
    "svd_lowrank": "random: seeded in eager by its wrapper; export does not trace manual_seed",
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
    "jiterator_2inputs_2outputs": "CUDA only",
    "jiterator_4inputs_with_extra_args": "CUDA only",
    "jiterator_binary": "CUDA only",
    "jiterator_binary_return_by_ref": "CUDA only",
    "jiterator_unary": "CUDA only",
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


@contextlib.contextmanager
def _seeded(seed: int):
    """torch, random and numpy seeded inside; their previous states restored after."""
    py_state, np_state = random.getstate(), np.random.get_state()
    try:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            random.seed(seed)
            np.random.seed(seed)
            yield
    finally:
        random.setstate(py_state)
        np.random.set_state(np_state)


def _leaves_equal(a, b) -> bool:
    """Bitwise equal, NaN matching NaN at the same positions."""
    if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)):
        return a is None and b is None
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    if a.dtype == torch.complex32:  # no equal kernel for it; complex64 holds it exactly
        a, b = a.to(torch.complex64), b.to(torch.complex64)
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


def _has_nan(t) -> bool:
    return (t.is_floating_point() or t.is_complex()) and bool(torch.isnan(t).any())


def _good_output(out) -> bool:
    """A (pytree of) plain dense CPU tensor(s) with no NaN."""
    leaves = pytree.tree_leaves(out)
    if not leaves or not all(_plain_tensor(t) for t in leaves):
        return False
    return not any(_has_nan(t) for t in leaves)


def _fresh(args, kwargs):
    return tuple(_clone(a) for a in args), {k: _clone(v) for k, v in kwargs.items()}


def _run(module, args, kwargs, seed):
    a, k = _fresh(args, kwargs)
    with _seeded(seed):
        out = module(*a, **k)
    return out, a, k


def _eager_ok(module, args, kwargs):
    """The eager output if the op takes and gives plain tensors, is deterministic and mutates nothing."""
    if not all(_plain_tensor(t) for t in pytree.tree_leaves((args, kwargs))):
        return None
    out, a, k = _run(module, args, kwargs, 0)
    if not _good_output(out):
        return None
    if not _outputs_equal((a, k), (args, kwargs)):  # mutated an input (e.g. running stats)
        return None
    again, _, _ = _run(module, args, kwargs, 1)
    return out if _outputs_equal(out, again) else None


def _torch_roundtrip(ep):
    """ep after torch.export.save and torch.export.load through memory."""
    buf = io.BytesIO()
    torch.export.save(ep, buf)
    buf.seek(0)
    return torch.export.load(buf)


def _matches(ep, args, kwargs, expected) -> bool:
    a, k = _fresh(args, kwargs)
    return _outputs_equal(ep.module()(*a, **k), expected)


def _returns_named_tuple(module, args, kwargs) -> bool:
    """Whether the sample returns a torch.return_types named tuple (svd, sort, linalg_inv_ex, ...).
    torch.export.save could not write those until pt2b named them in torch's pytree registry
    (exporter/serialize/mapping/return_types.py), so the corpus, fixed before that, leaves them out; they are
    tested in tests/format/test_roundtrip_values.py."""
    import torch.return_types as return_types

    from exporter.serialize.mapping.return_types import _classes

    named = tuple(_classes(return_types))
    try:
        with torch.no_grad():
            out = module(*copy.deepcopy(args), **copy.deepcopy(kwargs))
    except Exception:
        return False
    stack = [out]
    while stack:
        o = stack.pop()
        if isinstance(o, named):
            return True
        if isinstance(o, (list, tuple)):
            stack.extend(o)
        elif isinstance(o, dict):
            stack.extend(o.values())
    return False


def _check(module, args, kwargs) -> bool:
    """Eager is usable, and export (non-strict) and torch's own save/load both reproduce it bitwise."""
    expected = _eager_ok(module, args, kwargs)
    if expected is None or _returns_named_tuple(module, args, kwargs):
        return False
    with contextlib.redirect_stderr(io.StringIO()):  # a failing export prints its partial graph there
        ep = torch.export.export(module, args, kwargs, strict=False)
    return _matches(ep, args, kwargs, expected) and _matches(_torch_roundtrip(ep), args, kwargs, expected)


def _samples(opinfo, dtype):
    """The first MAX_SAMPLES of opinfo.sample_inputs("cpu", dtype), seeded here: that wrapper seeds by
    the calling unittest's name and keeps the generator out of reach, so call the function it wraps."""
    with _seeded(0):
        samples = opinfo.sample_inputs_func(opinfo, "cpu", dtype, False)
        try:
            return list(itertools.islice(samples, MAX_SAMPLES))
        finally:  # run the generator's cleanup now, not later inside some export trace
            getattr(samples, "close", lambda: None)()


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


@contextlib.contextmanager
def _quiet():
    loggers = [logging.getLogger(name) for name in _NOISY_LOGGERS]
    levels = [lg.level for lg in loggers]
    try:
        for lg in loggers:
            lg.setLevel(logging.ERROR)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        for lg, level in zip(loggers, levels):
            lg.setLevel(level)


@functools.cache
def opinfo_cases(limit: int | None = None) -> list[OpCase]:
    """One case per OpInfo entry that torch.export.export(case.module, case.args, case.kwargs) can export on CPU,
    deterministic order (sorted by op_name), deterministic inputs (seeded). Built once a process: two test
    modules collect over it (tests/lowering/test_lowering.py, tests/corpora/test_opinfo_roundtrip.py), and
    building it exports some 1,300 programs (most of a pytest worker's collection time). Callers share the
    cases: none may change a case's module or inputs."""
    cases = []
    with _quiet(), _seeded(0):  # also hands the caller's RNG states back untouched
        for opinfo in _candidates():
            if limit is not None and len(cases) >= limit:
                break
            case = _case_for(opinfo)
            if case is not None:
                cases.append(case)
    return cases
