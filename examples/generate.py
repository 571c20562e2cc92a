"""Greedy generation from a .pt2b artifact: a transformers decoder exported once with two methods,
"prefill" (the prompt) and "decode" (one token), over a static KV cache the methods share; loaded,
lowered for a backend (preset "core"), and run token by token on pt2b's reference runtime. The tokens
are checked against transformers' own generate(). docs/generation.md explains each step.

    python examples/generate.py [--out decoder.pt2b] [--new-tokens 8]
"""

from __future__ import annotations

import argparse
import tempfile

import torch
import transformers
from transformers.integrations.executorch import TorchExportableModuleForDecoderOnlyLM

from exporter import export_model, load_for_backend
from runtime_ref import runtimes

PROMPT_LEN, CACHE_LEN = 4, 32


def build_model(seed: int = 0) -> transformers.LlamaForCausalLM:
    """A small Llama built offline from a config, with seeded random weights (a real checkpoint loads
    with from_pretrained the same way)."""
    cfg = transformers.LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    torch.manual_seed(seed)
    model = transformers.LlamaForCausalLM(cfg).eval()
    with torch.no_grad():  # random weights at their default scale repeat one token; larger ones vary
        for name, p in model.named_parameters():
            if p.dim() == 2 and "embed" not in name:
                p.mul_(4.0)
    # the static cache: fixed-size key/value buffers the exported methods read and write
    model.generation_config.use_cache = True
    model.generation_config.cache_implementation = "static"
    return model


def export(model, path: str) -> None:
    """transformers' export wrapper holds the cache as buffers; both methods are its forward, with a
    prompt of PROMPT_LEN tokens and one token. strict=True: non-strict export would lift the cache as
    constants (docs/methods.md)."""
    wrapper = TorchExportableModuleForDecoderOnlyLM(model, batch_size=1, max_cache_len=CACHE_LEN).model.eval()
    prompt = torch.zeros(1, PROMPT_LEN, dtype=torch.long)
    export_model({
        "prefill": (wrapper, (), {"input_ids": prompt, "cache_position": torch.arange(PROMPT_LEN)}),
        "decode": (wrapper, (), {"input_ids": prompt[:, :1], "cache_position": torch.tensor([PROMPT_LEN])}),
    }, path, strict=True)


def generate(lowered, prompt: torch.Tensor, new_tokens: int) -> list[int]:
    """Greedy decoding on runtime_ref. runtimes() builds one Runtime per method over ONE copy of the
    artifact's state: the cache prefill fills is the cache decode reads. A new runtimes() starts from
    the artifact's own state again (an empty cache): that is the reset between sequences."""
    rt = runtimes(lowered)
    logits = rt["prefill"](input_ids=prompt, cache_position=torch.arange(prompt.shape[1]))
    tokens = [int(logits[0, -1].argmax())]
    for pos in range(prompt.shape[1], prompt.shape[1] + new_tokens - 1):
        logits = rt["decode"](input_ids=torch.tensor([[tokens[-1]]]), cache_position=torch.tensor([pos]))
        tokens.append(int(logits[0, -1].argmax()))
    return tokens


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", help="where to write the artifact (default: a temporary folder)")
    ap.add_argument("--new-tokens", type=int, default=8)
    args = ap.parse_args(argv)
    path = args.out or f"{tempfile.mkdtemp()}/decoder.pt2b"

    model = build_model()
    export(model, path)
    lowered = load_for_backend(path, "core")  # every method, lowered and validated
    print(f"{path}: methods {sorted(lowered.methods)}, {len(lowered['decode'].ops())} ops after lowering")

    ok = True
    for seed in (1, 2):  # two sequences, each from an empty cache
        prompt = torch.randint(0, model.config.vocab_size, (1, PROMPT_LEN), generator=torch.Generator().manual_seed(seed))
        ours = generate(lowered, prompt, args.new_tokens)
        with torch.no_grad():
            theirs = model.generate(prompt, max_new_tokens=args.new_tokens, do_sample=False,
                                    cache_implementation="static")[0, PROMPT_LEN:].tolist()
        ok &= ours == theirs
        print(f"prompt {prompt[0].tolist()}: pt2b {ours} {'==' if ours == theirs else '!='} transformers {theirs}")
    print("tokens match transformers' generate()" if ok else "MISMATCH")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
