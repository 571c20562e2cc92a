"""`pt2b opset audit`: the measured numerics of every decomposition a preset applies, on torch's OpInfo
samples against the undecomposed op and a float64 reference, classed by the rules of
exporter/lowering/verdicts.py. The result is data (schemas/opsets/audit@<torch>.json). Why and how:
docs/lowering.md#decompositions-are-measured-the-audit-and-losslesstrue."""

from __future__ import annotations

import functools
import warnings

import torch

from .._torch import testing
from .._torch.dispatch import TorchDispatchMode
from .._torch.pytree import pytree
from ..lowering.verdicts import RANK, ULP_LIMIT, WRONG_REL, compare, totals, worse
from ..ops import op_name

DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int64, torch.int32, torch.bool)
SAMPLES_PER_DTYPE = 4


@functools.cache
def _opinfos_by_aten_name() -> dict:
    out: dict[str, list] = {}
    for info in testing.op_db():
        for key in {info.aten_name or info.name, info.name}:
            out.setdefault(key, []).append(info)
    return out


class _Record(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.seen = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.seen.add(func)
        return func(*args, **(kwargs or {}))


@functools.cache
def _opinfos_reaching() -> dict:
    """OpOverload -> the OpInfos whose first float32 sample dispatches it (finds samples for ops
    no OpInfo is named after, such as _softmax under softmax)."""
    out: dict = {}
    for info in testing.op_db():
        try:
            torch.manual_seed(0)
            s = testing.samples(info, torch.float32, 1)[0]
            with warnings.catch_warnings(), _Record() as rec:
                warnings.simplefilter("ignore")
                info.op(s.input, *s.args, **s.kwargs)
        except Exception:  # noqa: BLE001 - an OpInfo without a runnable float32 sample here
            continue
        for func in rec.seen:
            out.setdefault(func, []).append(info)
    return out


def _samples(op):
    """(dtype, call) for OpInfo samples of the OpInfos named like ``op``'s packet: ``call()`` runs
    the OpInfo's own function (torch.var_mean, F.layer_norm...) on that sample."""
    packet = op._schema.name.split("::", 1)[1]
    seen = set()
    for info in _opinfos_by_aten_name().get(packet, []) + _opinfos_reaching().get(op, []):
        if id(info) in seen:
            continue
        seen.add(id(info))
        supported = info.supported_dtypes("cpu")
        for dtype in DTYPES:
            if dtype not in supported:
                continue
            try:
                torch.manual_seed(0)  # samples are random tensors: the same ones on every run
                samples = testing.samples(info, dtype, SAMPLES_PER_DTYPE)
            except Exception:  # noqa: BLE001 - a sample generator torch cannot run here: no samples
                continue
            for s in samples:
                yield dtype, info.op, (s.input, *s.args), dict(s.kwargs)


class _Swap(TorchDispatchMode):
    """Runs ``fn`` wherever ``op`` is dispatched (one level: inside ``fn`` the mode is off), and
    counts the calls. With ``fn=None`` it only counts."""

    def __init__(self, op, fn=None):
        super().__init__()
        self.op, self.fn, self.hits = op, fn, 0
        self.emitted: set = set()  # ops the decomposition called

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is self.op:
            if self.fn is not None:
                with _Record() as rec:
                    out = self.fn(*args, **kwargs)
                self.emitted |= rec.seen
                if out is not NotImplemented:  # a decomposition may decline an input: the op runs
                    self.hits += 1
                    return out
            else:
                self.hits += 1
        return func(*args, **kwargs)


def _to64(x):
    return x.to(torch.float64) if isinstance(x, torch.Tensor) and x.is_floating_point() else x


def _is_composite(op) -> bool:
    return torch._C._dispatch_has_kernel_for_dispatch_key(op.name(), "CompositeImplicitAutograd")


LAYOUTS = ("transposed", "permuted", "channels_last", "strided", "expanded")


def _layout_variant(t, layout: str):
    """``t`` laid out otherwise (same values; "expanded": its first row broadcast, a stride-0 input), or
    None where the layout does not apply to it."""
    if not isinstance(t, torch.Tensor) or t.layout != torch.strided or t.numel() < 2:
        return None
    if layout == "transposed" and t.dim() >= 2:
        return t.mT.contiguous().mT
    if layout == "permuted" and t.dim() >= 3:
        rev = tuple(reversed(range(t.dim())))
        return t.permute(rev).contiguous().permute(rev)
    if layout == "channels_last" and t.dim() in (4, 5):
        return t.contiguous(memory_format=torch.channels_last if t.dim() == 4 else torch.channels_last_3d)
    if layout == "strided" and t.dim() >= 1:
        # the gaps are zeros, not uninitialized memory: as_strided reads them, and two fresh copies of
        # the sample must read the same values
        wide = t.new_zeros(*t.shape[:-1], 2 * t.shape[-1])[..., ::2]
        return wide.copy_(t)
    if layout == "expanded" and t.dim() >= 1 and t.shape[0] > 1:
        return t[:1].clone().expand(t.shape)
    return None


def _layouts(args, kwargs):
    """("contiguous", make) for the sample as given, then (layout, make) for each layout (LAYOUTS) that
    applies to one of its tensors: ``make()`` builds fresh arguments each call (an op may write them)."""
    yield "contiguous", lambda: (args, kwargs)
    for layout in LAYOUTS:
        if not any(_layout_variant(x, layout) is not None for x in pytree.tree_leaves((args, kwargs))):
            continue

        def make(layout=layout):
            def one(x):
                v = _layout_variant(x, layout)
                return v if v is not None else x.clone() if isinstance(x, torch.Tensor) else x

            return pytree.tree_map(one, (args, kwargs))

        yield layout, make


def _audit_sample(op, fn, func, make, dtype, emitted: set, found: set) -> dict | None:
    """One sample's verdict entry (None where it does not reach ``op``, torch refuses it, or the
    decomposition declines it), adding what the decomposition called to ``emitted`` and its hazards
    to ``found``."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            torch.manual_seed(0)
            a, k = make()
            with _Swap(op) as probe:
                ref = func(*a, **k)
        except Exception:  # noqa: BLE001 - a sample torch itself refuses
            return None
        if probe.hits == 0:
            return None  # the sample reaches another overload
        try:
            torch.manual_seed(0)
            a, k = make()
            with _Swap(op, fn) as swap:
                got = func(*a, **k)
        except Exception as e:  # noqa: BLE001 - the decomposition fails where the op works
            return {"verdict": "wrong", "why": f"raises {type(e).__name__}: {str(e)[:120]}"}
        if swap.hits == 0:
            return None  # the decomposition declined every call of this sample
        emitted |= swap.emitted
        found.update(hazards(op, swap.emitted))  # per sample: a reduction= argument picks one path
        ref64 = None
        if dtype.is_floating_point and dtype != torch.float64:
            try:
                a, k = make()
                ref64 = func(*pytree.tree_map(_to64, a), **pytree.tree_map(_to64, k))
            except Exception:  # noqa: BLE001 - no float64 reference for this sample
                ref64 = None
        try:
            return compare(got, ref, ref64)
        except (RuntimeError, NotImplementedError, TypeError):  # outputs torch cannot compare (sparse...)
            return None


def audit_op(op, fn) -> dict:
    """The verdict of decomposition ``fn`` of ``op`` over OpInfo samples: each sample runs through
    the OpInfo's function plainly, with ``fn`` swapped in where ``op`` is dispatched, and (floating
    dtypes) in float64."""
    if torch.Tag.nondeterministic_seeded in op.tags or torch.Tag.nondeterministic_bitwise in op.tags \
            or "empty" in op._schema.name:
        return {"verdict": "untested", "samples": 0, "dtypes": [],
                "worst": {"why": "random or uninitialized output: nothing to compare"}}
    if _is_composite(op):
        # eager runs the CompositeImplicitAutograd kernel, which is this decomposition: there is no
        # other reference to measure against (dispatch modes never see the op); what it calls is recorded
        rec = {"verdict": "exact", "samples": 0, "dtypes": [], "worst": {"why": "composite: eager runs this decomposition"}}
        emitted: set = set()
        for _, _, args, kwargs in _samples(op):
            try:
                with warnings.catch_warnings(), _Record() as seen:
                    warnings.simplefilter("ignore")
                    fn(*args, **kwargs)
            except Exception:  # noqa: BLE001 - the sample does not fit this overload
                continue
            rec["samples"] += 1
            emitted |= seen.seen
        if emitted:
            rec["emits"] = sorted(op_name(f) for f in emitted)
        return rec
    result = {"verdict": "untested", "samples": 0, "dtypes": []}
    worst = None
    emitted: set = set()
    found: set = set()
    by_layout: dict = {}
    for dtype, func, args, kwargs in _samples(op):
        for layout, make in _layouts(args, kwargs):
            entry = _audit_sample(op, fn, func, make, dtype, emitted, found)
            if entry is None:
                continue
            result["samples"] += layout == "contiguous"
            name = str(dtype).removeprefix("torch.")
            if name not in result["dtypes"]:
                result["dtypes"].append(name)
            entry["dtype"] = name
            if layout != "contiguous":
                entry["layout"] = layout
            if RANK[entry["verdict"]] > RANK.get(by_layout.get(layout), -1):
                by_layout[layout] = entry["verdict"]
            if worse(entry, worst):
                worst = entry
    if len(by_layout) > 1:
        result["layouts"] = dict(sorted(by_layout.items()))
    if worst is not None:
        result["verdict"] = worst["verdict"]
        result["worst"] = {k: v for k, v in worst.items() if k != "verdict"}
    if emitted:
        result["emits"] = sorted(op_name(f) for f in emitted)
        result["hazards"] = sorted(found)
    return result


_GATHERS = ("index.", "_unsafe_index", "gather.", "index_select.", "scatter", "index_put", "take.", "_index_put")
_DATA_DEPENDENT = ("_local_scalar_dense.", "nonzero.", "masked_select.", "unique", "item.")
_REDUCTIONS = ("sum.", "mean.", "var.", "var_mean.", "std.", "amax.", "amin.", "max.dim", "min.dim", "prod.",
               "cumsum.", "cumprod.", "logsumexp.", "argmax.", "argmin.", "norm.", "linalg_vector_norm.")


def hazards(op, emitted) -> list[str]:
    """Performance hazards of a decomposition from the ops it called: index gathers, data-dependent
    values (a host sync, a guard when traced), and more reduction passes than the op makes."""
    names = [op_name(f).split("::", 1)[1] for f in emitted]
    out = []
    gathers = sorted(n for n in names if n.startswith(_GATHERS))
    if gathers:
        out.append(f"index gathers ({', '.join(gathers)})")
    dependent = sorted(n for n in names if n.startswith(_DATA_DEPENDENT))
    if dependent:
        out.append(f"data-dependent ({', '.join(dependent)})")
    reductions = sorted(n for n in names if n.startswith(_REDUCTIONS))
    own = 1 if op_name(op).split("::", 1)[1].startswith(_REDUCTIONS) else 0
    if len(reductions) > max(own, 1):
        out.append(f"extra passes ({len(reductions)} reductions: {', '.join(reductions)})")
    return out


def audited_ops(preset_names=None) -> dict:
    """op name -> OpOverload of every op some preset (default: every one of presets.PRESETS) decomposes."""
    from ..lowering import presets
    from ..lowering.tables import available_names

    names = available_names()
    out = {}
    for p in preset_names or presets.PRESETS:
        for name in presets.load(p).decompose:
            if name in names:
                out[name] = names[name]
    return dict(sorted(out.items()))


def run_audit(only: list[str] | None = None, progress=None, track=None) -> dict:
    """{op name: verdict record} for every decomposed op (or the ``only`` ones). ``progress(i, n, name,
    record)`` is called after each op; ``track`` (exporter.cli.progress.tracker) reports each op."""
    from ..lowering.decompose import applied
    from ..lowering.tables import available_decompositions

    table = available_decompositions()
    ops = audited_ops()
    if only:
        ops = {k: v for k, v in ops.items() if k in only}
    out = {}
    items = ops.items()
    for i, (name, op) in enumerate(track(items, label=lambda kv: kv[0]) if track is not None else items):
        torch.manual_seed(0)
        out[name] = audit_op(op, applied(op, table[op]))
        if progress:
            progress(i + 1, len(ops), name, out[name])
    return out


def write(results: dict, path) -> str:
    """Store ``results`` at ``path`` (atomically), as schemas/opsets/audit@<torch major.minor>.json is."""
    import json

    from ..util.atomic import atomic_write
    from ..lowering.presets import torch_minor

    doc = {"torch_version": torch_minor(), "ulp_limit": ULP_LIMIT, "wrong_rel": {str(k).removeprefix("torch."): v
           for k, v in WRONG_REL.items()}, "totals": totals(results), "ops": results}
    with atomic_write(path) as f:
        f.write((json.dumps(doc, indent=1, sort_keys=True) + "\n").encode())
    return str(path)


__all__ = ["audit_op", "audited_ops", "run_audit", "totals", "op_name"]
