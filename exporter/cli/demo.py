"""`pt2b demo`, the built-in demo: export a small transformer (demo_model.py), load it, lower it with
two presets, run each with the reference runtime, and report what happened."""

from __future__ import annotations

import os
import time

import torch


def run_demo(path: str = "demo_transformer.pt2b") -> None:
    from .progress import torch_internals_quiet

    with torch_internals_quiet():  # torch's warnings about its own internals are not the demo's story
        _run_demo(path)


def run(ns) -> int:
    run_demo(ns.output)
    return 0


def _run_demo(path: str) -> None:
    from runtime_ref import Runtime

    from .. import export_model, load, load_for_backend
    from .demo_model import demo_model

    model, args = demo_model()
    with torch.no_grad():
        eager = model(*args)
    t0 = time.perf_counter()
    ep = export_model(model, args, path)
    t1 = time.perf_counter()
    prog = load(path)
    t2 = time.perf_counter()
    out = prog(*args)
    n_params = sum(p.numel() for p in model.parameters())
    print(f"1. exported {type(model).__name__} ({n_params} parameters) to {path}: "
          f"{os.path.getsize(path)} bytes in {t1 - t0:.2f} s")
    print(f"2. loaded in {(t2 - t1) * 1000:.1f} ms: {prog}")
    print(f"   undecomposed ops: {', '.join(f'{k} x{v}' for k, v in prog.ops().items())}")
    print(f"   output bitwise equal to torch.export's ep.module(): {torch.equal(out, ep.module()(*args))}")
    for step, preset in enumerate(("none", "core"), start=3):
        t = time.perf_counter()
        lowered = load_for_backend(path, preset)
        dt = time.perf_counter() - t
        rt = Runtime(lowered, device="cpu")
        res = rt(*args)
        print(f"{step}. load_for_backend(preset={preset!r}) in {dt:.2f} s -> {len(lowered.ops())} ops to implement:")
        print(f"   {', '.join(sorted(lowered.ops()))}")
        if lowered.outside_opset:
            print(f"   outside the core opset (torch's table lets them through): {', '.join(lowered.outside_opset)}")
        print(f"   runtime_ref output {tuple(res.shape)}, max |diff| vs eager: {(res - eager).abs().max().item():.3g}")
    print(f"   why is aten::addmm.default there? {load_for_backend(path, 'core').explain('aten::addmm.default').splitlines()[-1].strip()}")
