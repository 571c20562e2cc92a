"""The lower stage: an undecomposed ExportedProgram and a LoweringPlan in, a complete Lowering out
(the lowered program functionalized and decomposed, what fell outside the opset, how it was made)."""

from __future__ import annotations

import dataclasses

from ..errors import OpsetError
from .._torch.compat import as_aten_dialect, with_guards_of
from .._torch.dispatch import drop_cached_dispatches
from ..functionalize import program_fake_mode
from ..graph_walk import op_nodes
from ..lazy import Lazy
from ..util.process_state import preserved
from .._torch.deferred_codegen import compiled, deferred
from .engines import lower_program
from .fold import fixed_values_folded
from .opset_check import outside, route_lines, support_hint
from .plan import LoweringPlan
from .subclass_weights import unwrapped


@dataclasses.dataclass(frozen=True)
class Lowering:
    """One method's lowering, complete: the plan it was lowered with, the lowered program (or a Lazy
    building it, for a cache entry opened without its graph), what fell outside the plan's opset
    (op -> call sites), its op counts where known without the graph, the repeated layers it was
    made from (engines.Reused, or None), its validation (validate.Validation, or None: not run),
    and whether the cache served it."""

    plan: LoweringPlan
    program: object
    outside: dict
    ops: dict | None = None
    reused: object = None
    validation: object = None
    from_cache: bool = False

    def exported_program(self):
        return self.program.get() if isinstance(self.program, Lazy) else self.program


@preserved()
def lower(source_ep, plan: LoweringPlan) -> Lowering:
    """``source_ep`` lowered with ``plan``; OpsetError where the result holds ops the plan's closed
    opset refuses (each with the route that brought it there). A custom op the backend lacks is
    lowered through its own kernel (LoweringPlan.with_kernels_for; the result's plan names it)."""
    source_ep = unwrapped(source_ep)  # tensor-subclass weights as their inner tensors (subclass_weights.py)
    plan = plan.with_kernels_for({node.target for node in op_nodes(source_ep.graph_module)})
    with deferred():  # the programs made on the way generate no code (_torch/deferred_codegen.py)
        lowered, reused = lower_program(source_ep, plan.table)  # (lowering/engines/)
    if lowered is not source_ep:  # (nothing to do leaves the program as it was captured)
        lowered = with_guards_of(lowered, source_ep)  # the relations its inputs must keep, checked at each call
        lowered = as_aten_dialect(lowered)  # what it is, as torch's run_decompositions output says it
        if plan.closed_opset:  # (a refused op of constants computed now: fold.py)
            lowered = fixed_values_folded(lowered, plan.accepts)
    # what the lowering's traces cached is not for the backend's own retrace (another config)
    drop_cached_dispatches(program_fake_mode(lowered.graph_module))
    compiled(lowered)
    result = Lowering(plan, lowered, outside(lowered.graph_module, plan.accepts), reused=reused)
    check_opset(plan, result, source_ep)
    return result


def check_opset(plan: LoweringPlan, lowering: Lowering, source_ep) -> None:
    """OpsetError where ``lowering`` holds an op the plan withheld a lossy decomposition of and the
    backend does not accept, or (a closed opset) any op outside it; none where the plan has a fallback
    (such ops stay, reported, for it to run). ``source_ep`` may be a Lazy: the undecomposed program is
    loaded only to trace an error's routes."""
    bad = lowering.outside
    if plan.fallback is not None:
        return
    # a lowering for a backend may leave such ops to the reference instead (to_backend runs them there)
    leave = ("" if plan.backend is None and plan.supported is None else
             "; or lower with fallback='reference' to leave them to the reference runtime beside the backend "
             "(to_backend(..., fallback='reference') runs them there, the rest on the backend)")
    untrusted = {name: why for name, why in plan.withheld.items() if name in bad}
    if untrusted:
        raise OpsetError(
            f"lowering with {plan.label}: {len(untrusted)} op(s) would need a decomposition that lossless=True "
            f"does not apply, and the backend does not support them:\n"
            + "\n".join(f"  {name} ({bad[name]} call sites): {why}" for name, why in untrusted.items())
            + "\nImplement them in the backend (add them to supported_ops), or lower without lossless=True "
              "to accept the measured error" + leave + ".")
    if bad and plan.closed_opset:
        source_ep = source_ep.get() if isinstance(source_ep, Lazy) else source_ep
        stop = lambda op: op not in plan.table
        lowered_gm = lowering.exported_program().graph_module
        lines = []
        for name, count in bad.items():
            lines.append(f"  {name} ({count} call sites): no decomposition reaches the accepted set")
            lines += ["      route: " + r for r in route_lines(name, lowered_gm, source_ep.graph_module,
                                                               plan.table, stop)]
        raise OpsetError(
            f"lowering with {plan.label}: {len(bad)} op(s) cannot reach the accepted op set:\n" + "\n".join(lines)
            + "\n" + (support_hint(bad, lowered_gm, source_ep.graph_module, plan.table, stop) if plan.backend is None
                      else f"The installed {plan.backend} converts none of them (its list is read from the package: "
                           f"a release that converts them lowers them)")
            + ", give a decomposition for them (decompositions={op: fn}), or keep them"
            + leave + "."
        )


def lowering_record(label: str, fingerprint: str | None, outside: dict) -> dict:
    """What a .pt2b written from a lowered program records about its lowering (format 1.1+)."""
    import hashlib

    import torch

    digest = hashlib.sha256(fingerprint.encode()).hexdigest() if fingerprint else ""
    return {"request": label, "fingerprint": digest, "torch_version": torch.__version__, "outside_opset": dict(outside)}
