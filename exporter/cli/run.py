"""`pt2b run ART.pt2b`: lower an artifact and run it with the reference runtime (runtime_ref)."""

from __future__ import annotations

from ..errors import ExportError
from . import json_out, progress
from .lower import hand_off_options, lower_from_args, validation_facts


def _read_inputs(paths, lowered):
    import numpy as np
    import torch

    if not paths:
        example = lowered.exported_program().example_inputs
        if example is None:
            raise ExportError("the artifact stores no example inputs; pass --inputs a.npy b.npy ...")
        return example
    args = []
    for p in paths:
        try:
            args.append(torch.from_numpy(np.load(p, allow_pickle=False)))
        except (OSError, ValueError) as e:
            raise ExportError(f"cannot read input {p!r} (a .npy file is expected): {e}") from None
    return tuple(args), {}


def _stats(leaf) -> dict:
    """A tensor's dtype and shape and, for a float (a complex: its magnitude), the range and mean of its
    finite values and its non-finite count; for an integer one, its range; anything else, its repr."""
    import torch

    if not isinstance(leaf, torch.Tensor):
        return {"repr": repr(leaf)}
    out = {"dtype": str(leaf.dtype).removeprefix("torch."), "shape": list(leaf.shape)}
    if leaf.numel() and (leaf.is_floating_point() or leaf.is_complex()):
        x = leaf.detach().abs() if leaf.is_complex() else leaf.detach()
        finite = x[x.isfinite()].double()
        if finite.numel():
            out.update(min=finite.min().item(), max=finite.max().item(), mean=finite.mean().item())
        out["non_finite"] = x.numel() - finite.numel()
    elif leaf.numel() and leaf.dtype != torch.bool:
        out.update(min=leaf.min().item(), max=leaf.max().item())
    return out


def _summary(s: dict) -> str:
    """dtype[shape] and, for a float tensor, its range, mean and non-finite count (``s``: _stats)."""
    if "repr" in s:
        return s["repr"]
    desc = f"{s['dtype']}{s['shape']}"
    if "mean" in s:
        desc += f"  min {s['min']:.4g}  max {s['max']:.4g}  mean {s['mean']:.4g}"
    elif "min" in s:
        desc += f"  min {s['min']}  max {s['max']}"
    if s.get("non_finite"):
        desc += f"  {s['non_finite']} non-finite"
    return desc


def _runner(ns, lowered):
    """(what runs the program, its name): runtime_ref, or the --backend's own compiled program."""
    if ns.backend:
        from .. import backends

        with progress.status(f"handing {ns.artifact} to {ns.backend}"):
            compiled = backends.to_backend(ns.backend, lowered, validate=not ns.no_validate,
                                           frozen_state=ns.frozen_state, fallback=ns.fallback, **hand_off_options(ns))
        return compiled, compiled.backend.key
    from runtime_ref import Runtime

    return Runtime(lowered, device=ns.device, extra_ops=ns.extra_ops), f"runtime_ref ({ns.device})"


def run(ns) -> int:
    import statistics
    import time

    from .._torch.pytree import pytree

    if ns.backend:
        from .. import backends

        backends.get(ns.backend)  # known and installed, before any lowering
    t0 = time.perf_counter()
    # lowered to the backend's own op list (leaving to the reference what --fallback lets it), unless
    # --preset names another lowering to hand it
    own = ns.backend if ns.preset == "core" else None
    lowered = lower_from_args(ns, backend=own, fallback=ns.fallback if own else None)
    lowered_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    runner, where = _runner(ns, lowered)
    prepared_s = time.perf_counter() - t0
    args, kwargs = _read_inputs(ns.inputs, lowered)
    with progress.status(f"running {ns.artifact} on {where}"):
        t0 = time.perf_counter()
        out = runner(*args, **kwargs)
        first_s = time.perf_counter() - t0
        times = []
        for _ in range(max(ns.repeat, 0)):
            t0 = time.perf_counter()
            runner(*args, **kwargs)
            times.append(time.perf_counter() - t0)
    outputs = [_stats(leaf) for leaf in pytree.tree_leaves(out)]
    if json_out.wanted(ns):
        json_out.emit({"file": ns.artifact, "runs_on": where, "outputs": outputs,
                       "lowered_for": lowered.lowered_for, "from_cache": lowered.from_cache,
                       "seconds": {"lowering": lowered_s, "preparing": prepared_s, "first_run": first_s,
                                   "median_run": statistics.median(times) if times else None, "runs_timed": len(times)},
                       "validation": validation_facts(lowered.validation),
                       "hand_off_validation": validation_facts(getattr(runner, "validation", None)),
                       "share": None if getattr(runner, "share", None) is None else
                       {**json_out.plain(runner.share), "node_share": runner.share.node_share,
                        "flop_share": runner.share.flop_share, "text": runner.share.describe()}})
        return 0
    for i, s in enumerate(outputs):
        print(f"output {i}: {_summary(s)}")
    timing = f"lowered in {lowered_s:.2f} s ({lowered.lowered_for}{', from the cache' if lowered.from_cache else ''}); " \
             f"{where}: prepared in {prepared_s:.2f} s, first run {first_s * 1e3:.1f} ms"
    if times:
        timing += f", median of {len(times)} more {statistics.median(times) * 1e3:.1f} ms"
    print(timing)
    print(lowered.validation.describe() if lowered.validation is not None else "not validated")
    if getattr(runner, "validation", None) is not None:  # the backend's outputs against the lowered program's
        print(runner.validation.describe())
    if getattr(runner, "share", None) is not None:  # a program split with the reference (--fallback)
        print(runner.share.describe())
    if getattr(runner, "state", None) is not None:  # the buffers it writes, carried from call to call
        holder = getattr(getattr(runner, "plan", None), "holder", None)  # (the backend's runtime holding some)
        held = sorted(holder.names) if holder is not None else []
        lifted = [name for name in runner.state if name not in held]
        if held:
            print(f"state held by {runner.backend.name}'s runtime from call to call: {', '.join(held)}")
        if lifted:
            print(f"state carried from call to call as inputs and outputs: {', '.join(lifted)}")
    return 0
