"""Decode time per token of a prefill/decode Llama (static KV cache) handed over by pt2b against the same
model exported by transformers' own exporters (transformers.exporters), on ONNX Runtime and OpenVINO.

pt2b: the artifact's two methods lowered per backend and handed over on one state (`to_backend_methods`):
onnx stateful (its default: the cache held by ONNX Runtime as its own values between calls) and onnx
lifted (`stateful=False`: the cache passed through torch every call) and onnx fused (`fusions="cpu"`:
ONNX Runtime's own fused ops), openvino stateful (its default:
the cache in the infer request's variables) and openvino lifted (`stateful=False`), these two with
PERFORMANCE_HINT=LATENCY as transformers' OpenVINO runner compiles. transformers: `export_for_generation`
with a static cache of the same length (ONNX also with `ort_fusions="cpu"`), its prefill and decode components run as its docs run them: an
onnxruntime InferenceSession fed the cache (its decode takes and returns it), an OpenVINO compiled model
(its runner's settings: the CPU's own inference precision, bfloat16 where it has it; and again in float32,
as pt2b's hand-off compiles) whose decode holds the cache in its own state, seeded from the prefill's
outputs.
Same weights (one model object), same prompt; each runtime's greedy tokens are compared with eager's
(how many agree before the first that differs).

Per-token time: the median over the decode calls of every round after the first (warm-up); the runtimes
run interleaved, a whole sequence each in turn, so the ratios pt2b / transformers come from the same
moments of a shared, noisy machine (compare ratios within one run only).

Usage: python bench/bench_decode.py [--tokens N] [--rounds R] [--models tiny,llama512]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import logging
import os
import statistics
import sys
import tempfile
import time
import warnings

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from exporter import backends, export_model, load_for_backend  # noqa: E402

PROMPT_LEN = 4
# name -> (LlamaConfig sizes, static cache length)
MODELS = {
    "tiny": (dict(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2), 16),  # tools.corpus.methods.decoder_case's
    "llama512": (dict(vocab_size=2048, hidden_size=512, intermediate_size=1408, num_hidden_layers=4,
                      num_attention_heads=8, num_key_value_heads=4), 256),
}


def llama(sizes: dict, cache_len: int):
    """(the LlamaForCausalLM, pt2b's static-cache wrapper of it, the prompt), seeded random weights."""
    import transformers

    from exporter.hf import static_cache_decoder

    cfg = transformers.LlamaConfig(**sizes, max_position_embeddings=cache_len, use_cache=True)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(cfg).eval()
    prompt = torch.randint(0, cfg.vocab_size, (1, PROMPT_LEN), generator=torch.Generator().manual_seed(0))
    return model, static_cache_decoder(model, batch_size=1, max_cache_len=cache_len), prompt


class Pt2b:
    """pt2b's hand-off: the artifact's prefill and decode methods on one state."""

    def __init__(self, path: str, backend: str, **options):
        self.methods = backends.to_backend_methods(load_for_backend(path, backend=backend, cache=False), **options)

    def prefill(self, ids: torch.Tensor) -> torch.Tensor:
        return self.methods["prefill"](input_ids=ids, cache_position=torch.arange(ids.shape[1]))[0, -1]

    def decode(self, token: int, pos: int) -> torch.Tensor:
        return self.methods["decode"](input_ids=torch.tensor([[token]]), cache_position=torch.tensor([pos]))[0, -1]

    def reset(self) -> None:
        self.methods["decode"].reset_state()


def _causal_mask(pos: int, cache_len: int) -> np.ndarray:
    """The decode step's [1, 1, 1, cache] boolean mask: the positions up to ``pos`` attended."""
    return (np.arange(cache_len) <= pos).reshape(1, 1, 1, cache_len)


class TransformersOnnx:
    """transformers.exporters' ONNX export run by onnxruntime: the cache fed and returned by name."""

    def __init__(self, exported, cache_len: int):
        import onnx_ir
        import onnxruntime as ort

        self.sessions = {name: ort.InferenceSession(onnx_ir.to_proto(c.program).SerializeToString(),
                                                    providers=["CPUExecutionProvider"])
                         for name, c in exported.components.items()}
        self.cache_len, self.cache = cache_len, {}

    def _run(self, name: str, feed: dict) -> np.ndarray:
        session = self.sessions[name]
        wanted = {i.name for i in session.get_inputs()}
        outputs = [o.name for o in session.get_outputs()]
        values = session.run(None, {k: v for k, v in {**feed, **self.cache}.items() if k in wanted})
        # each new cache tensor is the next call's input of the same path ("input." + its path)
        self.cache = {"input." + n.removeprefix("output."): v for n, v in zip(outputs[1:], values[1:])}
        return values[0]

    def prefill(self, ids: torch.Tensor) -> torch.Tensor:
        self.cache = {f"input.{i.name.removeprefix('input.')}": np.zeros((), np.int64)
                      for i in self.sessions["prefill"].get_inputs() if i.name.endswith("cumulative_length")}
        n = ids.shape[1]
        logits = self._run("prefill", {"input_ids": ids.numpy(), "position_ids": np.arange(n)[None]})
        return torch.from_numpy(logits[0, -1])

    def decode(self, token: int, pos: int) -> torch.Tensor:
        feed = {"input_ids": np.array([[token]]), "attention_mask": _causal_mask(pos, self.cache_len),
                "position_ids": np.array([[pos]])}
        return torch.from_numpy(self._run("decode", feed)[0, -1])

    def reset(self) -> None:
        self.cache = {}


class TransformersOpenVINO:
    """transformers.exporters' OpenVINO export, compiled by its runner: the decode model holds the cache
    in its state variables, seeded from the prefill model's cache outputs."""

    def __init__(self, exported, cache_len: int, config: dict | None = None):
        exported.to("cpu", config=config)
        self.prefill_model = exported.runners["prefill"].compiled_model
        self.request = exported.runners["decode"].request
        self.cache_len = cache_len

    def prefill(self, ids: torch.Tensor) -> torch.Tensor:
        import openvino

        n = ids.shape[1]
        out = self.prefill_model({"input_ids": ids.numpy(), "position_ids": np.arange(n)[None]})
        by_path = {o.get_any_name().removeprefix("output."): out[o] for o in self.prefill_model.outputs}
        self.request.reset_state()
        for state in self.request.query_state():  # its variable: "input.<path>output.<path>"
            rest = state.name.removeprefix("input.")
            path = rest[:(len(rest) - len("output.")) // 2]
            state.state = openvino.Tensor(np.ascontiguousarray(by_path[path]))
        return torch.from_numpy(out[0][0, -1].copy())

    def decode(self, token: int, pos: int) -> torch.Tensor:
        out = self.request.infer({"input_ids": np.array([[token]]), "attention_mask": _causal_mask(pos, self.cache_len),
                                  "position_ids": np.array([[pos]]), "beam_idx": np.array([0], np.int32)})
        return torch.from_numpy(out[0][0, -1].copy())

    def reset(self) -> None:
        self.request.reset_state()


def transformers_exports(model, prompt: torch.Tensor, cache_len: int) -> dict:
    from transformers import GenerationConfig
    from transformers.exporters import OnnxConfig, OnnxExporter, OpenVINOConfig, OpenVINOExporter

    generation = GenerationConfig(cache_implementation="static", max_cache_len=cache_len, do_sample=False)
    inputs = {"input_ids": prompt, "attention_mask": torch.ones_like(prompt)}
    with contextlib.redirect_stdout(io.StringIO()):
        onnx = OnnxExporter().export_for_generation(model, inputs, OnnxConfig(), generation_config=generation)
        fused = OnnxExporter().export_for_generation(model, inputs, OnnxConfig(ort_fusions="cpu"),
                                                     generation_config=generation)
        ov = OpenVINOExporter().export_for_generation(model, inputs, OpenVINOConfig(), generation_config=generation)
        ov_f32 = OpenVINOExporter().export_for_generation(model, inputs, OpenVINOConfig(), generation_config=generation)
    # its runner compiles in the CPU's own inference precision (bfloat16 where the CPU has it); pt2b's
    # hand-off compiles in float32, the program's: both are run, the second compiled as pt2b's is
    return {"transformers onnx": TransformersOnnx(onnx, cache_len),
            "transformers onnx fused": TransformersOnnx(fused, cache_len),
            "transformers openvino": TransformersOpenVINO(ov, cache_len),
            "transformers openvino f32": TransformersOpenVINO(ov_f32, cache_len, {"INFERENCE_PRECISION_HINT": "f32"})}


def greedy(runtime, prompt: torch.Tensor, steps: int) -> tuple[list[int], list[float]]:
    """(the greedy tokens, each decode call's seconds) from an empty cache."""
    runtime.reset()
    tokens, times = [int(runtime.prefill(prompt).argmax())], []
    for pos in range(prompt.shape[1], prompt.shape[1] + steps):
        start = time.perf_counter()
        logits = runtime.decode(tokens[-1], pos)
        times.append(time.perf_counter() - start)
        tokens.append(int(logits.argmax()))
    return tokens, times


def eager_tokens(model, prompt: torch.Tensor, steps: int, cache_len: int) -> list[int]:
    with torch.no_grad():
        out = model.generate(prompt, max_new_tokens=steps + 1, do_sample=False, cache_implementation="static",
                             max_cache_len=cache_len)
    return out[0, prompt.shape[1]:].tolist()


def bench(name: str, tokens: int, rounds: int) -> None:
    sizes, cache_len = MODELS[name]
    steps = min(tokens, cache_len - PROMPT_LEN)
    model, wrapper, prompt = llama(sizes, cache_len)
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "llama.pt2b")
        methods = {"prefill": (wrapper, (), {"input_ids": prompt, "cache_position": torch.arange(PROMPT_LEN)}),
                   "decode": (wrapper, (), {"input_ids": prompt[:, :1], "cache_position": torch.tensor([PROMPT_LEN])})}
        export_model({m: torch.export.export(w, a, k, strict=True) for m, (w, a, k) in methods.items()}, path)
        latency = {"config": {"PERFORMANCE_HINT": "LATENCY"}}  # (transformers' OpenVINO runner's CPU setting)
        runtimes = {"pt2b onnx": Pt2b(path, "onnx"), "pt2b onnx lifted": Pt2b(path, "onnx", stateful=False),
                    "pt2b onnx fused": Pt2b(path, "onnx", fusions="cpu"),
                    "pt2b openvino": Pt2b(path, "openvino", **latency),
                    "pt2b openvino lifted": Pt2b(path, "openvino", stateful=False, **latency)}
        runtimes.update(transformers_exports(model, prompt, cache_len))
        want = eager_tokens(model, prompt, steps, cache_len)
        times: dict[str, list[float]] = {r: [] for r in runtimes}
        right: dict[str, int] = {}
        for round_ in range(rounds + 1):
            for r, runtime in runtimes.items():
                got, took = greedy(runtime, prompt, steps)
                right[r] = next((i for i, (g, w) in enumerate(zip(got, want)) if g != w), len(want))
                if round_:  # the first round warms up
                    times[r] += took
    ms = {r: 1e3 * statistics.median(t) for r, t in times.items()}
    print(f"\n{name} (cache {cache_len}, {steps} decode steps x {rounds} rounds)")
    for r, v in ms.items():
        print(f"  {r:24s} {v:8.3f} ms/token   greedy tokens equal to eager's: first {right[r]}/{len(want)}")
    for theirs in (r for r in ms if r.startswith("transformers ")):
        backend = theirs.split()[1]
        for r in (r for r in ms if r.startswith(f"pt2b {backend}")):
            print(f"  {r} / {theirs}: {ms[r] / ms[theirs]:.2f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", type=int, default=32, help="decode steps per round (at most the cache allows)")
    parser.add_argument("--rounds", type=int, default=5, help="timed rounds after one warm-up round")
    parser.add_argument("--models", default=",".join(MODELS))
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    logging.disable(logging.WARNING)
    for name in args.models.split(","):
        bench(name, args.tokens, args.rounds)


if __name__ == "__main__":
    main()
