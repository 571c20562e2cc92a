"""runtime_ref on a device (CUDA where present) against torch on the same device, one process per run.

Each model is captured and lowered (`core`) on the CPU, as pt2b's users do, and run on the device:
- steady state, medians of interleaved calls, each synchronized: `Runtime(lowered, device=...)` against
  torch running the same lowered program (its `.module().to(device)`: the target, <= 1.0x on large inputs
  and <= 0.6x on chain100, as on the CPU), against torch's own lowering of the model captured on the
  device (device-specific kernels, such as fused attention), and against eager;
- runtime_ref on the same artifact lowered for the device (`load_for_backend(..., device=...)`: the graph
  moved there before it is lowered, so decompositions pick the device's kernels, as a capture there does)
  against torch's lowering of the model captured on the device;
- each output's largest error against the model run in float64 on the device, with eager's beside it;
- peak device memory of one call of each, over what was allocated before it;
- ready to run: the lowered .pt2b file to its first output on the device (load + Runtime + call) against
  torch's .pt2 of the same program (torch.export.load + .module().to(device) + call).

Usage: python bench/bench_device.py [--device cuda] [--models mlp,encoder_6x512,chain100,encoder_6x512_bf16,
                                     gpt_350m,gpt_350m_bf16] [--repeat 20]
A model name ending in _bf16 is the model and its floating inputs cast to bfloat16.
"""

from __future__ import annotations

import argparse
import copy
import os
import sys
import tempfile

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench_pt2b import instance_norm_large, interleaved, print_rows, tiny_case  # noqa: E402

from exporter import export_model, load, load_for_backend  # noqa: E402
from exporter.cli import progress  # noqa: E402
from tools.corpus.zoo import encoder_6x512, gpt_350m, make_case  # noqa: E402
from runtime_ref import Runtime  # noqa: E402

FACTORIES = {"mlp": lambda: make_case("mlp"), "encoder_6x512": encoder_6x512, "chain100": tiny_case,
             "gpt_350m": gpt_350m, "instance_norm_large": instance_norm_large}
TARGETS = {"runtime_large": 1.0, "runtime_tiny": 0.6}


def build(name: str):
    """(model, args) of ``name`` on the CPU, in eval mode; ``NAME_bf16`` casts both to bfloat16."""
    base, bf16 = (name[:-5], True) if name.endswith("_bf16") else (name, False)
    if base not in FACTORIES:
        raise SystemExit(f"unknown model {name!r}; known: {', '.join(FACTORIES)} (each also as NAME_bf16)")
    case = FACTORIES[base]()
    model, args = case.model.eval(), tuple(case.args)
    if bf16:
        model = model.to(torch.bfloat16)
        args = tuple(a.to(torch.bfloat16) if a.is_floating_point() else a for a in args)
    return model, args


def bench(name: str, device: torch.device, repeat: int, tmp: str) -> list[tuple[str, float, float, str]]:
    model, args = build(name)
    pt2b, low_b, low_t = (os.path.join(tmp, f"{name}.{s}") for s in ("pt2b", "core.pt2b", "core.pt2"))
    export_model(model, args, pt2b)
    lowered = load_for_backend(pt2b, "core")
    export_model(lowered, path=low_b)  # the lowered artifact a device would be sent
    torch.export.save(lowered.exported_program(), low_t)
    dev_args = tuple(a.to(device) for a in args)
    dev_model = copy.deepcopy(model).to(device)
    rt = Runtime(load(low_b), device=device)
    # torch's two ways: the same lowered program's module moved to the device (None where torch cannot
    # run it there), and the model captured on the device and lowered there (device-specific kernels)
    same = _moved_module(lowered, device, dev_args)
    on_device = torch.export.export(dev_model, dev_args).run_decompositions()
    # pt2b's way to the device's kernels: the same artifact lowered for the device (its graph moved there first)
    for_device = _lowered_for(pt2b, device, dev_args)

    def synced(fn):
        def call():
            out = fn(*dev_args)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            return out
        return call

    calls = {"runtime_ref": synced(rt), "same": synced(same) if same else None,
             "for_device": synced(for_device[1]) if for_device else None,
             "on_device": synced(on_device.module()), "eager": synced(dev_model)}
    calls = {k: v for k, v in calls.items() if v is not None}
    rows = []
    with torch.no_grad():
        errors = output_errors(calls, model, args, device)
        times = dict(zip(calls, interleaved(list(calls.values()), max(repeat, 5))))
        kind = "runtime_tiny" if name.startswith("chain100") else "runtime_large"
        if "same" in times:
            rows.append(("steady call, vs torch running the same lowered program (`.module().to(device)`)",
                         times["runtime_ref"], times["same"], kind))
        else:
            rows.append(("steady call, vs torch running the same lowered program: torch cannot run it there",
                         times["runtime_ref"], float("nan"), ""))
        rows += [("steady call, vs torch's lowering of the model captured on the device",
                  times["runtime_ref"], times["on_device"], "" if "same" in times else kind),
                 ("steady call, vs eager on the device", times["runtime_ref"], times["eager"], "")]
        if "for_device" in times:
            rows.append(("steady call, runtime_ref on the artifact lowered for the device (`load_for_backend(..., "
                         "device=)`), vs torch's lowering of the model captured on the device",
                         times["for_device"], times["on_device"], ""))
            rows.append(("graph calls, the artifact lowered for the device vs the on-device lowering's",
                         _calls(for_device[0].exported_program()), _calls(on_device), ""))
        said = {"runtime_ref": "runtime_ref", "same": "torch's same program", "on_device": "torch's on-device lowering",
                "for_device": "runtime_ref lowered for the device"}
        for who, err in errors.items():
            if who != "eager":
                rows.append((f"max abs error against float64, {said[who]} vs eager's", err, errors["eager"], ""))
        rows.append(("graph calls, runtime_ref's program vs the on-device lowering's",
                     _calls(lowered.exported_program()), _calls(on_device), ""))
        if device.type == "cuda":
            peak = {who: peak_bytes(call, device) / 2**20 for who, call in calls.items()}
            rows += [(f"peak device memory of a call (MB), vs {who}", peak["runtime_ref"], peak[who], "")
                     for who in peak if who != "runtime_ref"]

        def ready_pt2b():
            return synced(Runtime(load(low_b), device=device))()

        def ready_torch():
            module = torch.export.load(low_t).module().to(device)
            return synced(module)()

        if same is not None:
            o_ready, t_ready = interleaved([ready_pt2b, ready_torch], max(2, min(repeat, 5)))
            rows.append(("ready to run: lowered artifact to first output on the device, vs torch's .pt2 of it",
                         o_ready, t_ready, ""))
    return rows


def _lowered_for(path: str, device: torch.device, dev_args):
    """(``load_for_backend(path, "core", device=...)``, its Runtime on the device), or None (printed) where
    that lowering or its first call fails."""
    try:
        lowered = load_for_backend(path, "core", device=str(device))
        rt = Runtime(lowered, device=device)
        with torch.no_grad():
            rt(*dev_args)
    except Exception as e:  # noqa: BLE001 (reported, not raised: the other rows still stand)
        print(f"  lowering for {device} and running it failed: {type(e).__name__}: {str(e).splitlines()[0][:160]}")
        return None
    return lowered, rt


def _calls(ep: torch.export.ExportedProgram) -> int:
    return sum(n.op == "call_function" for n in ep.graph.nodes)


def _moved_module(lowered, device: torch.device, dev_args):
    """torch's way of running a CPU-recorded program elsewhere: its module moved with `.to(device)`; None
    where that does not run (a constant left on the CPU, a factory's device=cpu, a view of another layout)."""
    module = lowered.exported_program().module().to(device)
    try:
        module(*dev_args)
    except Exception as e:  # noqa: BLE001 (any failure means torch cannot run it: reported, not raised)
        print(f"  torch's module of the lowered program does not run on {device}: {type(e).__name__}: "
              f"{str(e).splitlines()[0][:160]}")
        return None
    return module


def output_errors(calls: dict, model, args, device: torch.device) -> dict[str, float]:
    """Each call's largest absolute error against the model run in float64 on the device; a warning where
    a lowered program's error exceeds four times eager's plus 1e-4 (float32) or 1e-2 (half precision) of
    the output's largest magnitude."""
    exact = copy.deepcopy(model).to(device).double()(*(a.to(device).double() if a.is_floating_point()
                                                        else a.to(device) for a in args))
    errors = {}
    for who, call in calls.items():
        out = call()
        assert out.device == exact.device, f"{who}: output on {out.device}"
        errors[who] = (out.double() - exact).abs().max().item()
    floor = (1e-2 if out.dtype in (torch.float16, torch.bfloat16) else 1e-4) * exact.abs().max().item()
    for who, err in errors.items():
        if err > 4 * errors["eager"] + floor:
            print(f"  WARNING: {who}'s output is {err:.3g} off float64 (eager {errors['eager']:.3g})")
    return errors


def peak_bytes(call, device: torch.device) -> int:
    """Device memory one call of ``call`` takes at its peak over what was allocated before it."""
    torch.cuda.synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    base = torch.cuda.memory_allocated(device)
    out = call()
    del out
    return torch.cuda.max_memory_allocated(device) - base


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--models", default="mlp,encoder_6x512,chain100,encoder_6x512_bf16,gpt_350m,gpt_350m_bf16")
    ap.add_argument("--repeat", type=int, default=20)
    ns = ap.parse_args(argv)
    device = torch.device(ns.device)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise SystemExit("--device cuda: CUDA is not available in this process")
        device = torch.device("cuda", torch.cuda.current_device())
        torch.ones(8, 8, device=device) @ torch.ones(8, 8, device=device)  # the context and cuBLAS, once, before any timing
        print(f"device: {torch.cuda.get_device_name(device)}, torch {torch.__version__}, CUDA {torch.version.cuda}")
    else:
        print(f"device: {device}, torch {torch.__version__}")
    progress.set_quiet(True)
    with tempfile.TemporaryDirectory() as tmp, progress.torch_internals_quiet():
        os.environ["PT2B_CACHE"] = "0"
        for name in [n for n in ns.models.split(",") if n]:
            rows = bench(name, device, ns.repeat, tmp)
            print(f"\n## {name} on {device}  (medians of {max(ns.repeat, 5)}; ratio = runtime_ref / anchor)")
            print_rows(rows, TARGETS, "runtime_ref")
    return 0


if __name__ == "__main__":
    sys.exit(main())
