"""The numerical verdicts on a decomposition (exact, ulp, lossy, wrong, untested: a result against the
undecomposed op's and a float64 reference, bounded by ULP_LIMIT and WRONG_REL) and where they are
stored: the audit (schemas/opsets/audit@<torch>.json, measured by exporter/explorer/audit.py), read
here by lossless lowering and validation. What each means:
docs/lowering.md#decompositions-are-measured-the-audit-and-losslesstrue."""

from __future__ import annotations

import math

import torch

from .._torch.pytree import pytree

ULP_LIMIT = 4
WRONG_REL = {torch.float64: 1e-6, torch.float32: 1e-3, torch.float16: 2e-2, torch.bfloat16: 5e-2}
RANK = {"exact": 0, "untested": 0, "ulp": 1, "lossy": 2, "wrong": 3}


def _ulp(x: torch.Tensor) -> torch.Tensor:
    """Spacing of ``x``'s dtype at |x| (at least the smallest normal's spacing)."""
    ax = x.abs()
    tiny = torch.finfo(x.dtype).tiny
    return (torch.nextafter(ax, torch.full_like(ax, math.inf)) - ax).clamp_min(tiny)


def worse(entry: dict, worst: dict | None) -> bool:
    """Does sample record ``entry`` rank above ``worst``: a worse verdict, or more ulp at the same one?"""
    return worst is None or RANK[entry["verdict"]] > RANK[worst["verdict"]] or (
        entry["verdict"] == worst["verdict"] and entry.get("max_ulp", 0) > worst.get("max_ulp", 0))


def compare(got, ref, ref64, ulps: bool = True) -> dict:
    """One sample's verdict and its numbers. ``ulps=False``: a float output that differs only in finite
    values is "ulp" without its distance measured (for a caller that measures it its own way)."""
    g, r = pytree.tree_leaves(got), pytree.tree_leaves(ref)
    r64 = pytree.tree_leaves(ref64) if ref64 is not None else [None] * len(r)
    if len(g) != len(r):
        return {"verdict": "wrong", "why": f"{len(g)} outputs instead of {len(r)}"}
    worst = {"verdict": "exact", "max_ulp": 0.0}
    for a, b, c in zip(g, r, r64):
        if not isinstance(b, torch.Tensor):
            if a != b and not (isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b)):
                return {"verdict": "wrong", "why": f"returns {a!r} instead of {b!r}"}
            continue
        if not isinstance(a, torch.Tensor) or a.shape != b.shape or a.dtype != b.dtype:
            return {"verdict": "wrong", "why": f"returns {getattr(a, 'dtype', type(a).__name__)}"
                                                f"{list(getattr(a, 'shape', []))} instead of {b.dtype}{list(b.shape)}"}
        if b.is_complex():
            a, b = real_parts(a), real_parts(b)
            c = torch.view_as_real(c.to(torch.complex128)) if isinstance(c, torch.Tensor) and c.is_complex() else None
        if torch.equal(a, b):
            continue
        if not a.is_floating_point():
            return {"verdict": "wrong", "why": f"{(a != b).sum().item()} of {b.numel()} values differ"}
        a_nan, b_nan = a.isnan(), b.isnan()
        same_nan = torch.equal(a_nan, b_nan)
        if same_nan and a_nan.any() and torch.equal(a.masked_fill(a_nan, 0), b.masked_fill(b_nan, 0)):
            continue  # equal but for NaNs in the same places
        if not same_nan or not torch.equal(a.isfinite(), b.isfinite()):
            truth = c.to(b.dtype) if isinstance(c, torch.Tensor) else None
            if truth is None or not torch.equal(a.isfinite(), truth.isfinite()):
                return {"verdict": "wrong", "why": "nan/inf where the op has a number (or the reverse)"}
            entry = {"verdict": "ulp", "why": "finite where the op overflows, as the float64 reference is"}
            if worse(entry, worst):
                worst = entry
            continue
        if not ulps:
            worst = worst if worst["verdict"] != "exact" else {"verdict": "ulp", "max_ulp": 0.0}
            continue
        fin = b.isfinite()
        # a difference over an ulp (a power of two) is exact in float32 for every dtype but float64:
        # no float64 copies of large outputs (validation compares whole outputs with this)
        wide = torch.promote_types(b.dtype, torch.float32)
        diff = (a - b).abs()[fin].to(wide)
        ulps = (diff / _ulp(b)[fin].to(wide)).max().item() if fin.any() else 0.0
        entry = {"verdict": "ulp" if ulps <= ULP_LIMIT else "lossy", "max_ulp": ulps,
                 "max_abs": diff.max().item() if fin.any() else 0.0}
        if c is not None and entry["verdict"] == "lossy":
            c = c.to(torch.float64)
            scale = c.abs().clamp_min(1.0)
            err_dec = ((a.double() - c).abs() / scale)[fin].max().item()
            err_op = ((b.double() - c).abs() / scale)[fin].max().item()
            entry.update(err_vs_f64=err_dec, op_err_vs_f64=err_op)
            limit = WRONG_REL.get(b.dtype, 1e-3)
            if err_dec > limit and err_op <= limit:
                entry["verdict"] = "wrong"
                entry["why"] = f"relative error {err_dec:.3g} against float64 (the op: {err_op:.3g})"
            elif err_dec <= err_op:
                entry["verdict"] = "ulp"  # farther from the op, but no farther from the truth
        if worse(entry, worst):
            worst = entry
    return worst


def real_parts(x: torch.Tensor) -> torch.Tensor:
    """A complex tensor's real and imaginary parts (``view_as_real``, complex32 widened to complex64,
    which has one): complex outputs are compared part by part, within their parts' dtype's bound."""
    return torch.view_as_real((x.to(torch.complex64) if x.dtype == torch.complex32 else x).resolve_conj())


def relative_difference(got: torch.Tensor, want: torch.Tensor) -> float:
    """The largest difference of ``got`` from ``want`` (float tensors of one shape), relative to
    ``want``'s magnitude where it is above 1 and absolute below: the measure a whole output is judged by
    against WRONG_REL. Elements not finite in either are left out. Computed in float32 (float64 for
    float64 outputs): float32 holds a half-precision difference exactly."""
    wide = torch.promote_types(want.dtype, torch.float32)
    a, b = got.to(wide), want.to(wide)
    fin = b.isfinite() & a.isfinite()
    return torch.where(fin, (a - b).abs_().div_(b.abs().clamp_min_(1.0)), 0.0).max().item()


def data_path(torch_minor: str | None = None):
    from .presets import frozen_path, torch_minor as current

    return frozen_path("audit", torch_minor or current())


def read(torch_minor: str | None = None) -> dict | None:
    """The stored audit for a torch release ({"ops": {name: record}, "totals": ...}), or None."""
    from .. import package_data

    path = data_path(torch_minor)
    return package_data.read_json("opsets", path.name) if path.exists() else None


def worst_cases(results: dict, n: int = 10) -> list[tuple[str, dict]]:
    """The ``n`` worst decompositions: wrong first, then lossy by ulp."""
    bad = [(k, r) for k, r in results.items() if r["verdict"] in ("wrong", "lossy")]
    return sorted(bad, key=lambda kv: (-RANK[kv[1]["verdict"]], -kv[1].get("worst", {}).get("max_ulp", 0)))[:n]


def describe(rec: dict) -> str:
    """One line of a verdict record's numbers: why, ulp and absolute error, float64 errors, dtype."""
    w = rec.get("worst", {})
    parts = [w["why"]] if "why" in w else []
    if "max_ulp" in w:
        parts.append(f"{w['max_ulp']:.3g} ulp (abs {w.get('max_abs', 0):.3g})")
    if "err_vs_f64" in w:
        parts.append(f"error vs float64 {w['err_vs_f64']:.3g}, the op's {w['op_err_vs_f64']:.3g}")
    where = f", {w['layout']} layout" if "layout" in w else ""
    text = f"{', '.join(parts)} [{w.get('dtype', '?')}{where}, {rec['samples']} samples]"
    return text + (f"; hazards: {'; '.join(rec['hazards'])}" if rec.get("hazards") else "")


def totals(results: dict) -> dict[str, int]:
    counts = {v: 0 for v in ("exact", "ulp", "lossy", "wrong", "untested")}
    for r in results.values():
        counts[r["verdict"]] += 1
    return counts
