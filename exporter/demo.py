"""The built-in demo behind `pt2b demo`: export a small transformer, load it, run it, report."""

from __future__ import annotations

import os
import time

import torch


def run_demo(path: str = "demo_transformer.pt2b") -> None:
    from . import export_model, load
    from .zoo import small_transformer

    case = small_transformer()
    t0 = time.perf_counter()
    ep = export_model(case.model, case.args, path, kwargs=case.kwargs, dynamic_shapes=case.dynamic_shapes)
    t1 = time.perf_counter()
    prog = load(path)
    t2 = time.perf_counter()
    out = prog(*case.args, **(case.kwargs or {}))
    ref = ep.module()(*case.args, **(case.kwargs or {}))
    with torch.no_grad():
        eager = case.model(*case.args, **(case.kwargs or {}))
    n_params = sum(p.numel() for p in case.model.parameters())
    print(f"exported {type(case.model).__name__} ({n_params} parameters) to {path}: "
          f"{os.path.getsize(path)} bytes in {t1 - t0:.2f} s")
    print(f"loaded in {(t2 - t1) * 1000:.1f} ms: {prog}")
    print("operators (undecomposed, in-place ops kept):")
    for name, count in sorted(prog.ops().items()):
        print(f"  {count:4d}  {name}")
    print(f"output {tuple(out.shape)}; bitwise equal to torch.export's ep.module(): {torch.equal(out, ref)}; "
          f"max |diff| vs eager: {(out - eager).abs().max().item():.3g}")
