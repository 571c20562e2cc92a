"""pt2b's write and verify on one model each against what a user would compare them with, in the same run:
export_model(ep, path) against torch.export.save and a plain write + fsync of as many bytes to the same folder;
`pt2b verify` (the command) against reading the file and hashing it with sha256 (and, beside it, a fresh
`python -c "import torch"`: the checks against the running torch need it).

Models: ``llama06b-bf16`` (a Llama decoder of 0.6B parameters built by transformers from a config, random
weights, bfloat16: hidden 2048, 8 layers, intermediate 8192, vocabulary 32000), and two small ones:
``encoder_6x512`` (tools/corpus) and ``llama-tiny`` (4 layers, hidden 256, float32). Medians of --repeat
runs taken in turns (bench_pt2b.interleaved); the anchors are bench_limits' (raw_write, raw_read_hash).

Usage: python bench/bench_write.py [--models llama06b-bf16,encoder_6x512,llama-tiny] [--repeat 5] [--dir D]
       [--profile] (a cProfile of one export_model write, top functions by cumulative time)
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import subprocess
import sys
import tempfile

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.bench_limits import drop_page_cache, raw_read_hash, raw_write, write_steps  # noqa: E402
from bench.bench_pt2b import installed_env, interleaved  # noqa: E402
from exporter import export_model  # noqa: E402
from exporter.serialize.write import direct  # noqa: E402

TARGETS = {"write": 1.2, "save": 0.5, "verify": 1.2}


def _llama(hidden: int, layers: int, intermediate: int, heads: int, kv_heads: int, dtype: torch.dtype):
    from transformers import LlamaConfig, LlamaModel

    cfg = LlamaConfig(hidden_size=hidden, intermediate_size=intermediate, num_hidden_layers=layers,
                      num_attention_heads=heads, num_key_value_heads=kv_heads, vocab_size=32000,
                      max_position_embeddings=2048, use_cache=False)
    torch.manual_seed(0)
    model = LlamaModel(cfg).to(dtype).eval()
    ids = torch.randint(0, cfg.vocab_size, (1, 32), generator=torch.Generator().manual_seed(0))
    return torch.export.export(model, (ids,))


def _encoder():
    from tools.corpus.zoo import encoder_6x512

    case = encoder_6x512()
    return torch.export.export(case.model, case.args)


MODELS = {
    "llama06b-bf16": lambda: _llama(2048, 8, 8192, 32, 8, torch.bfloat16),
    "encoder_6x512": _encoder,
    "llama-tiny": lambda: _llama(256, 4, 688, 4, 2, torch.float32),
}


def bench(name: str, repeat: int, tmp: str, profile: bool) -> None:
    ep = MODELS[name]()
    n_params = sum(v.numel() for v in ep.state_dict.values())
    pt2b, pt2, raw = (os.path.join(tmp, f"{name}.{ext}") for ext in ("pt2b", "pt2", "raw"))
    export_model(ep, pt2b)
    size = os.path.getsize(pt2b)
    print(f"{name}: {n_params / 1e6:.1f}M parameters, {size / 1e6:.1f} MB; O_DIRECT taken by this folder: "
          f"{direct.folder_takes_direct_writes(tmp)}", flush=True)

    def row(what, ours, anchor, anchor_name, kind):
        target = TARGETS[kind]
        print(f"  {what:<28} {ours:7.3f} s  {anchor_name:<34} {anchor:7.3f} s  {ours / anchor:5.2f}x  "
              f"(target <= {target}x: {'met' if ours / anchor <= target else 'MISSED'})", flush=True)

    steps: list[dict] = []
    with write_steps(steps):
        o_write, t_save, t_raw = interleaved([lambda: export_model(ep, pt2b), lambda: torch.export.save(ep, pt2),
                                              lambda: raw_write(raw, size)], repeat)
    row("export_model(ep, path)", o_write, t_raw, "write + fsync of as many bytes", "write")
    row("export_model(ep, path)", o_write, t_save, "torch.export.save", "save")
    st = sorted(steps, key=lambda s: s["total"])[len(steps) // 2]
    print(f"    (a median write: weights written and hashed {st['weights']:.3f} s on their own thread, read-back "
          f"check {st['read_back']:.3f} s, outside both {st['rest']:.3f} s)", flush=True)
    os.remove(raw)

    cmd = [sys.executable, "-m", "exporter", "--quiet", "verify", pt2b]
    env = installed_env(tmp, cmd)

    def cold(fn):
        def run():
            drop_page_cache(pt2b)
            return fn()
        return run

    o_verify, t_hash = interleaved([cold(lambda: subprocess.run(cmd, check=True, capture_output=True, env=env)),
                                    cold(lambda: raw_read_hash(pt2b))], repeat)
    row("`pt2b verify` (cold cache)", o_verify, t_hash, "read + sha256 (cold cache)", "verify")
    imp = [sys.executable, "-c", "import torch"]
    o_verify, t_hash, t_import = interleaved([lambda: subprocess.run(cmd, check=True, capture_output=True, env=env),
                                              lambda: raw_read_hash(pt2b),
                                              lambda: subprocess.run(imp, check=True, capture_output=True, env=env)],
                                             repeat)
    row("`pt2b verify` (warm cache)", o_verify, t_hash, "read + sha256 (warm cache)", "verify")
    # the checks against the running torch need torch: its import is verify's floor beside the hashing
    print(f"    (a fresh `python -c \"import torch\"` beside it: {t_import:.3f} s)", flush=True)
    if profile:
        prof = cProfile.Profile()
        prof.runcall(export_model, ep, pt2b)
        pstats.Stats(prof).sort_stats("cumulative").print_stats(30)
    for p in (pt2b, pt2):
        os.remove(p)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--dir", default=None, help="where the files are written (default: a temporary folder)")
    ap.add_argument("--profile", action="store_true")
    ns = ap.parse_args(argv)
    torch.set_num_threads(os.cpu_count() or 1)
    with tempfile.TemporaryDirectory(dir=ns.dir) as tmp:
        for name in [m for m in ns.models.split(",") if m]:
            if name not in MODELS:
                ap.error(f"unknown model {name!r}; known: {', '.join(MODELS)}")
            bench(name, ns.repeat, tmp, ns.profile)
    return 0


if __name__ == "__main__":
    sys.exit(main())
