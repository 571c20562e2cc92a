"""The validate stage: a Lowering checked against its source (validate.py gives the verdict) and,
where a decomposition makes it wrong, that decomposition found and the lowering made again without it."""

from __future__ import annotations

import dataclasses
import time

from ..errors import OpsetError
from ..mutation import functional_variant
from ..ops import op_name
from .lower import Lowering, lower
from .validate import (SourceRuns, Validation, amplification_explains, applied_decompositions, bounds_for,
                       right_where_they_run, rounding_explains, validate, where_defined)

__all__ = ["validated"]


def validated(lowering: Lowering, source_ep, budget: float | None = None) -> Lowering:
    """``lowering`` (lower.Lowering of ``source_ep``) validated: a new Lowering with its validation,
    that of a repaired lowering where a decomposition is wrong. After a failure, each decomposition applied is
    checked where it runs (on the values its op receives in this program, one recording pass): the
    wrong ones are kept undecomposed where ``plan.accepts`` them, else OpsetError names the first; where
    all are right, the program amplifies their rounding and passes, naming them. Only where some
    cannot be recorded (in a subgraph) is the responsible one found by bisection. ``budget``: the
    seconds the lowering took, which the programs' runs should not exceed (validate.validate)."""
    plan = lowering.plan
    applied = applied_decompositions(source_ep, plan.table)
    runs = SourceRuns(source_ep, record=applied)
    verdict = validate(source_ep, lowering.exported_program(), plan.table, runs, budget=budget)
    if verdict.status == "failed" and verdict.scope == "ops" and not getattr(verdict, "culprits", None):
        verdict = validate(source_ep, lowering.exported_program(), plan.table, runs)  # (the programs tell what)
    if verdict.status != "failed":
        return dataclasses.replace(lowering, validation=verdict)
    failure = verdict
    t0 = time.perf_counter()
    if getattr(failure, "culprits", None):  # found op by op on the derived input: named already
        return _repaired(failure, failure.culprits, plan, source_ep, runs)
    failed_on, wanted = failure.failed_on
    # on the stored inputs, the run that gave the outputs recorded the calls already
    known = runs.recorded if failed_on is runs.inputs[0] else None
    local = right_where_they_run(source_ep, applied, plan.table, bounds_for(applied, source_ep), failed_on, known)
    culprits = [op for op in applied if op in local and local[op] is None]
    unexplained = OpsetError(f"lowering with {plan.label}: the lowered program does not compute what the program "
                             f"does ({failure.why}), and no single decomposition is responsible. Lower with fewer "
                             "decompositions (keep=[...]) or validate=False to accept it.")
    if not culprits and len(local) == len(applied):  # each right where it runs: rounding amplified, if they
        # are what differs: the lowered outputs as near a widened run as the unlowered ones are, else the
        # lowering that keeps them all validates on the input that failed
        if not rounding_explains(source_ep, failure) and not amplification_explains(source_ep, failure, local) and \
                not _validates_keeping(plan, source_ep, applied, SourceRuns(source_ep, [failed_on], [wanted])):
            raise unexplained
        worst = sorted((rel, op_name(op)) for op, rel in local.items() if rel > 0)[::-1][:3]
        passed = dataclasses.replace(failure, status="passed", verdict="lossy", why="",
                                     amplified={name: rel for rel, name in worst},
                                     seconds=failure.seconds + time.perf_counter() - t0)
        return dataclasses.replace(lowering, validation=passed)
    if not culprits:
        culprit = _responsible(plan, source_ep, runs)
        if culprit is None:
            raise unexplained
        culprits = [culprit]
    return _repaired(failure, culprits, plan, source_ep, runs)


def _repaired(failure: Validation, culprits: list, plan, source_ep, runs: SourceRuns) -> Lowering:
    """The lowering that keeps ``culprits`` (the decompositions found wrong) undecomposed, validated;
    OpsetError where the backend does not accept one of them (unless the plan falls back on the
    reference) or keeping them does not validate."""
    found = {}
    for op in culprits:
        fn = plan.table[op]
        where = where_defined(fn)
        node = next((n.name for n in source_ep.graph.nodes if n.target is op), "(in a subgraph)")
        measured = ("" if getattr(failure, "culprits", None)  # found op by op: the why holds the difference
                    else f" (largest relative difference {failure.max_rel:.3g}, wrong beyond {failure.bound:.3g})")
        found[op] = (where, node, f"lowering with {plan.label}: the decomposition of {op_name(op)} ({where}) makes "
                                  f"the program wrong at node {node}: {failure.why}{measured}.")
    for op in culprits:  # (with a fallback, an op the backend lacks stays for the reference to run)
        stays = functional_variant(op) or op  # (an in-place call is lowered as its functional variant)
        if not plan.accepts(stays) and plan.fallback is None:
            raise OpsetError(f"{found[op][2]} The backend does not accept {op_name(stays)} undecomposed; implement it "
                             "(add it to supported_ops or keep=[...]), give another decomposition "
                             "(decompositions={op: fn}), or lower with validate=False to accept the difference.")
    repaired = lower(source_ep, plan.without(culprits))
    check = validate(source_ep, repaired.exported_program(), repaired.plan.table, runs)
    names = ", ".join(op_name(op) for op in culprits)
    if check.status == "failed":
        raise OpsetError(f"{found[culprits[0]][2]} Keeping {names} undecomposed does not make the lowering validate "
                         f"({check.why}); lower with fewer decompositions (keep=[...]) or validate=False to accept "
                         "the difference.")
    check.kept = {op_name(op): f"its decomposition ({where}) made the program wrong at node {node}: {failure.why}"
                  for op, (where, node, _) in found.items()}
    return dataclasses.replace(repaired, validation=check)




def _validates_keeping(plan, source_ep, ops, runs: SourceRuns) -> bool:
    """Whether the lowering that keeps ``ops`` undecomposed validates on the input sets of ``runs``
    (kept ops outside the opset are fine here)."""
    try:
        again = lower(source_ep, plan.reporting().without(ops))
    except Exception:  # noqa: BLE001 -- keeping these ops does not lower
        return False
    return validate(source_ep, again.exported_program(), again.plan.table, runs).status != "failed"


def _responsible(plan, source_ep, runs):
    """The op whose decomposition makes the lowering fail validation: bisection over the ops of the
    program the table decomposes (one culprit assumed; None when keeping it alone does not help)."""
    candidates = applied_decompositions(source_ep, plan.table)

    def passes(kept) -> bool:
        return _validates_keeping(plan, source_ep, kept, runs)

    if not candidates or not passes(candidates):
        return None
    known = True  # whether keeping just ``candidates`` is known to pass (each check is a lowering)
    while len(candidates) > 1:
        half = len(candidates) // 2
        known = passes(candidates[:half])
        candidates = candidates[:half] if known else candidates[half:]
    return candidates[0] if known or passes(candidates) else None
