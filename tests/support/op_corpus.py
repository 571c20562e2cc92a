"""The op-level corpus: every OpInfo op torch can export, in its functional, in-place and out= forms,
in float32, float16, bfloat16, int8 and bool, with mixed-dtype inputs (type promotion), 0-d and empty
tensors and Python numbers in tensor positions.

A case is named by a Spec (op, form, dtype, other, kind, sample): ``sample`` indexes the seeded
OpInfo samples of ``op`` in ``dtype``; ``other`` is the dtype its second tensor is cast to (a mixed
case), ``kind`` the feature the sample was picked for. Which specs torch can run and capture depends
on the torch release, so they are found once by `python -m tools.op_corpus` and kept in
tests/op_corpus@<torch>.json; tests rebuild each case from its spec (tests/corpora/test_op_corpus.py).
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import functools
import io
import itertools
import json
import pathlib

import torch
import torch.utils._pytree as pytree

from .opinfo_cases import SKIP, _clone, _has_nan, _op_name, _outputs_equal, _plain_tensor, _quiet, _seeded

FORMS = ("functional", "inplace", "out")
KINDS = ("plain", "0-d", "empty", "number")  # number: a Python number where the op takes a tensor or scalar
SAMPLES_SEEN = 16  # samples generated per (op, dtype); kinds are looked for among them
TRIES = 3  # samples of one kind tried before the kind is given up for that (op, form, dtype)
BASE = torch.float32
EXTRA_DTYPES = (torch.float16, torch.bfloat16, torch.int8, torch.bool)
# (dtype of the sample, dtype its second tensor is cast to): each pair promotes
MIXED = ((torch.float32, torch.float64), (torch.bfloat16, torch.float16), (torch.int8, torch.float32),
         (torch.bool, torch.int8))
FALLBACK = (torch.float64, torch.int64, torch.int32, torch.float16, torch.bfloat16, torch.int16, torch.int8,
            torch.uint8, torch.bool)


@dataclasses.dataclass(frozen=True)
class Spec:
    op: str
    form: str
    dtype: str
    other: str | None
    kind: str
    sample: int

    @property
    def id(self) -> str:
        mix = f"+{self.other}" if self.other else ""
        return f"{self.op}/{self.form}/{self.dtype}{mix}/{self.kind}#{self.sample}"


@dataclasses.dataclass
class Case:
    spec: Spec
    module: torch.nn.Module
    args: tuple


def manifest_path(version: str | None = None) -> pathlib.Path:
    minor = ".".join((version or torch.__version__).split("+")[0].split(".")[:2])
    return pathlib.Path(__file__).parents[1] / f"op_corpus@{minor}.json"


def read_manifest(version: str | None = None) -> list[Spec]:
    path = manifest_path(version)
    if not path.exists():
        return []
    return [Spec(**d) for d in json.loads(path.read_text())["specs"]]


def _dtype(name: str) -> torch.dtype:
    return getattr(torch, name)


def _name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


@functools.cache
def opinfos() -> dict:
    from torch.testing._internal.common_methods_invocations import op_db

    return {_op_name(o): o for o in op_db if _op_name(o) not in SKIP}


@functools.cache
def samples(op: str, dtype: str) -> tuple:
    """The first SAMPLES_SEEN OpInfo samples of ``op`` in ``dtype``, seeded (the wrapper that torch's
    tests call seeds by the test's name, so call the function it wraps)."""
    info = opinfos()[op]
    with _quiet(), _seeded(0):
        gen = info.sample_inputs_func(info, "cpu", _dtype(dtype), False)
        try:
            return tuple(itertools.islice(gen, SAMPLES_SEEN))
        finally:
            getattr(gen, "close", lambda: None)()


def _leaves(sample):
    return pytree.tree_leaves((sample.input, tuple(sample.args), sample.kwargs))


def kind_of(sample) -> str:
    tensors = [x for x in _leaves(sample) if isinstance(x, torch.Tensor)]
    if any(t.numel() == 0 for t in tensors):
        return "empty"
    if any(t.dim() == 0 for t in tensors):
        return "0-d"
    if any(isinstance(a, (int, float, complex)) and not isinstance(a, bool) for a in pytree.tree_leaves(tuple(sample.args))):
        return "number"
    return "plain"


class OpModule(torch.nn.Module):
    """Calls one op in one form; tensors come in through forward (an out= buffer last), every other
    argument is baked in."""

    def __init__(self, fn, form, leaves, spec, slots, out_spec):
        super().__init__()
        self._fn, self._form, self._leaves, self._spec, self._slots = fn, form, leaves, spec, slots
        self._out_spec = out_spec

    def forward(self, *tensors):
        leaves = list(self._leaves)
        n = len(self._slots)
        for i, t in zip(self._slots, tensors[:n]):
            leaves[i] = t
        inp, args, kwargs = pytree.tree_unflatten(leaves, self._spec)
        if self._form == "out":
            out = pytree.tree_unflatten(list(tensors[n:]), self._out_spec)
            self._fn(inp, *args, **kwargs, out=out)
            return out
        return self._fn(inp, *args, **kwargs)


def _cast_second(leaves, slots, dtype, other):
    """Cast the second tensor of the sample's dtype to ``other``; False if it has none."""
    same = [i for i in slots if leaves[i].dtype == dtype]
    if len(same) < 2:
        return False
    leaves[same[1]] = leaves[same[1]].to(other)
    return True


def build(spec: Spec) -> Case | None:
    """The case a spec names (None if its sample cannot take that form or dtype mix)."""
    info = opinfos()[spec.op]
    sample = samples(spec.op, spec.dtype)[spec.sample]
    leaves, tspec = pytree.tree_flatten((sample.input, tuple(sample.args), dict(sample.kwargs)))
    leaves = [_clone(x) for x in leaves]
    slots = [i for i, x in enumerate(leaves) if isinstance(x, torch.Tensor)]
    if spec.other and not _cast_second(leaves, slots, _dtype(spec.dtype), _dtype(spec.other)):
        return None
    fn = {"functional": info.op, "inplace": info.inplace_variant, "out": info.op}[spec.form]
    if fn is None:
        return None
    args = tuple(leaves[i] for i in slots)
    consts = [None if isinstance(x, torch.Tensor) else x for x in leaves]
    out_spec = None
    if spec.form == "out":  # a zeroed buffer shaped like the functional result
        with torch.no_grad():
            ref = OpModule(info.op, "functional", consts, tspec, slots, None)(*[_clone(a) for a in args])
        ref_leaves, out_spec = pytree.tree_flatten(ref)
        if not ref_leaves or not all(isinstance(t, torch.Tensor) for t in ref_leaves):
            return None
        args = args + tuple(torch.zeros_like(t) for t in ref_leaves)
    return Case(spec, OpModule(fn, spec.form, consts, tspec, slots, out_spec), args)


def fresh(args):
    return tuple(_clone(a) for a in args)


def run_eager(case: Case):
    """(output, inputs after the call): the inputs of in-place and out= forms are written."""
    a = fresh(case.args)
    with _seeded(0):
        out = case.module(*a)
    return out, a


def eager_ok(case: Case) -> bool:
    """Plain dense tensors in and out, no NaN out, the same bits twice."""
    if not all(_plain_tensor(t) for t in case.args):
        return False
    out, after = run_eager(case)
    leaves = pytree.tree_leaves(out)
    if not leaves or not all(_plain_tensor(t) for t in leaves) or any(_has_nan(t) for t in leaves):
        return False
    if case.spec.form == "functional" and not _outputs_equal(after, case.args):
        return False  # a functional form that writes its inputs (running stats) belongs to the in-place form
    out2, after2 = run_eager(case)
    return _outputs_equal((out, after), (out2, after2))


def export(case: Case) -> torch.export.ExportedProgram:
    with contextlib.redirect_stderr(io.StringIO()):  # a failing export prints its partial graph there
        return torch.export.export(case.module, fresh(case.args), strict=False)


def captures(case: Case) -> bool:
    """torch runs it and torch.export captures it, the program giving eager's bits."""
    if not eager_ok(case):
        return False
    ep = export(case)
    a = fresh(case.args)
    out = ep.module()(*a)
    return _outputs_equal((out, a), run_eager(case))


def _wanted(info) -> list[tuple[str, torch.dtype, torch.dtype | None, tuple[str, ...]]]:
    """(form, dtype, other, kinds) to look for, for one OpInfo entry."""
    dtypes = info.supported_dtypes("cpu")
    base = BASE if BASE in dtypes else next((d for d in FALLBACK if d in dtypes), None)
    if base is None:
        return []
    forms = ["functional"] + (["inplace"] if info.inplace_variant is not None else []) + \
            (["out"] if info.supports_out else [])
    want = []
    for form in forms:
        want.append((form, base, None, KINDS if form == "functional" else ("plain", "0-d")))
        want += [(form, d, None, ("plain",)) for d in EXTRA_DTYPES if d in dtypes and d != base]
        want += [(form, d, o, ("plain",)) for d, o in MIXED if d in dtypes]
    return want


def specs_for(op: str) -> list[Spec]:
    """The specs of one OpInfo entry that torch runs and captures (what the manifest keeps)."""
    info = opinfos()[op]
    found = []
    with _quiet():
        for form, dtype, other, kinds in _wanted(info):
            try:
                pool = samples(op, _name(dtype))
            except Exception:  # noqa: BLE001 -- the op's sample generator fails in this dtype
                continue
            for kind in kinds:
                picked = [i for i, s in enumerate(pool) if kind_of(s) == kind][:TRIES]
                for i in picked:
                    spec = Spec(op, form, _name(dtype), other and _name(other), kind, i)
                    try:
                        case = build(spec)
                        if case is not None and captures(case):
                            found.append(spec)
                            break
                    except Exception:  # noqa: BLE001 -- eager or torch.export refuses this sample
                        continue
    return found


def tolerance(dtype: torch.dtype) -> tuple[float, float]:
    """(rtol, atol) for comparing a lowered program's output with eager's, by the output's dtype."""
    return {torch.float16: (1e-3, 1e-3), torch.bfloat16: (1.6e-2, 1e-2), torch.float64: (1e-7, 1e-7),
            torch.complex128: (1e-7, 1e-7), torch.float32: (1e-4, 1e-5),
            torch.complex64: (1e-4, 1e-5)}.get(dtype, (0.0, 0.0))


def close_to(out, expected) -> str | None:
    """None if ``out`` is ``expected`` within its dtype's tolerance (same structure, dtypes and shapes),
    else what differs."""
    lo, so = pytree.tree_flatten(out)
    le, se = pytree.tree_flatten(expected)
    if so != se:
        return f"structure {so} != {se}"
    for k, (x, y) in enumerate(zip(lo, le)):
        if not isinstance(x, torch.Tensor) or not isinstance(y, torch.Tensor):
            if x != y:
                return f"leaf {k}: {x!r} != {y!r}"
            continue
        if x.dtype != y.dtype or x.shape != y.shape:
            return f"leaf {k}: {x.dtype}{list(x.shape)} != {y.dtype}{list(y.shape)}"
        rtol, atol = tolerance(y.dtype)
        try:
            torch.testing.assert_close(x, y, rtol=rtol, atol=atol, equal_nan=True)
        except AssertionError as e:
            return f"leaf {k} ({y.dtype}): " + " ".join(str(e).split())[:300]
    return None


def copy_case(case: Case) -> Case:
    return Case(case.spec, copy.deepcopy(case.module), fresh(case.args))
