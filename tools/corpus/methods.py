"""Models exported as several methods sharing one model object (multi-method artifacts: tests, the golden
of format 1.2, the bench): ``TinyKV`` (hand-written, a KV cache as buffers), ``decoder_case()`` (a tiny
Llama, prefill and decode) and ``seq2seq_case()`` (a tiny T5, encode and decode), built offline from
configs with seeded random weights. The format: docs/methods.md."""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Callable

import torch

from exporter.capture import BoundMethod
from exporter.hf_modules import Seq2Seq

__all__ = ["MethodsCase", "Seq2Seq", "TinyKV", "decoder_case", "seq2seq_case"]

CACHE_LEN = 16
PROMPT_LEN = 4


@dataclass
class MethodsCase:
    name: str
    model: torch.nn.Module  # the object every method belongs to
    methods: dict[str, tuple]  # name -> (module or bound method of model, args, kwargs or None)
    dynamic_shapes: dict[str, object]  # name -> dynamic_shapes for torch.export.export, or None
    strict: bool
    prompt: torch.Tensor  # [1, L] token ids
    n_new: int = 6
    kind: str = "decoder"  # "decoder": prefill/decode with a KV cache; "seq2seq": encode/decode
    start_token: int = 0  # the seq2seq decoder's first token

    def export(self, name: str) -> torch.export.ExportedProgram:
        """One method exported (a bound method through exporter.capture.BoundMethod)."""
        fn, args, kwargs = self.methods[name]
        mod = fn if isinstance(fn, torch.nn.Module) else BoundMethod(fn)
        return torch.export.export(mod, args, kwargs, dynamic_shapes=self.dynamic_shapes[name], strict=self.strict)

    def generate(self, call: Callable[[str, tuple, dict], torch.Tensor]) -> list[int]:
        """Greedy generation of n_new tokens, every model invocation as ``call(method_name, args, kwargs)``."""
        out = []
        if self.kind == "decoder":
            n = self.prompt.shape[1]
            logits = call("prefill", (), {"input_ids": self.prompt, "cache_position": torch.arange(n)})
            out.append(int(logits[0, -1].argmax()))
            for pos in range(n, n + self.n_new - 1):
                logits = call("decode", (), {"input_ids": torch.tensor([[out[-1]]]),
                                             "cache_position": torch.tensor([pos])})
                out.append(int(logits[0, -1].argmax()))
        else:
            enc = call("encode", (self.prompt,), {})
            dec = torch.tensor([[self.start_token]])
            for _ in range(self.n_new):
                tok = int(call("decode", (dec, enc), {})[0].argmax())
                out.append(tok)
                dec = torch.cat([dec, torch.tensor([[tok]])], dim=1)
        return out

    def eager_tokens(self) -> list[int]:
        """``generate`` run eagerly on a deep copy of the model, the eager reference (the case's own
        state, a zero KV cache, stays untouched)."""
        model = copy.deepcopy(self.model)

        def resolve(fn):
            if fn is self.model:
                return model
            if getattr(fn, "__self__", None) is self.model:  # a bound method of the model
                return getattr(model, fn.__func__.__name__)
            raise ValueError(f"{fn!r} does not belong to the case's model")

        fns = {name: resolve(entry[0]) for name, entry in self.methods.items()}
        with torch.no_grad():
            return self.generate(lambda name, args, kwargs: fns[name](*args, **(kwargs or {})))


def decoder_case(seed: int = 0, **sizes) -> MethodsCase:
    """Tiny Llama in transformers' static-cache wrapper: "prefill" [1, 4] and "decode" [1, 1]; ``sizes``
    override the config's (vocab_size, hidden_size, intermediate_size, num_hidden_layers, ...).

    The wrapper is exporter.hf's static_cache_decoder (`pt2b export --hf --task text-generation` exports
    the same, its prefill's length dynamic), the KV cache held as non-persistent buffers
    key_cache_0, ... "prefill" has 4 tokens (cache_position arange(4)), "decode" 1 token: both are the
    wrapper's forward, so an entry is the module itself. The cache is state the methods share: decode
    reads what prefill wrote. Exported strict (docs/methods.md#writing says why)."""
    import transformers

    from exporter.hf import static_cache_decoder

    cfg = transformers.LlamaConfig(**{**dict(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                             num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64),
                                      **sizes, "use_cache": True})
    torch.manual_seed(seed)
    model = transformers.LlamaForCausalLM(cfg).eval()
    wrapper = static_cache_decoder(model, batch_size=1, max_cache_len=CACHE_LEN)
    prompt = torch.randint(0, cfg.vocab_size, (1, PROMPT_LEN), generator=torch.Generator().manual_seed(seed))
    methods = {"prefill": (wrapper, (), {"input_ids": prompt, "cache_position": torch.arange(PROMPT_LEN)}),
               "decode": (wrapper, (), {"input_ids": prompt[:, :1], "cache_position": torch.tensor([PROMPT_LEN])})}
    return MethodsCase(name="llama_static_cache", model=wrapper, methods=methods,
                       dynamic_shapes={"prefill": None, "decode": None}, strict=True, prompt=prompt)


def seq2seq_case(seed: int = 0) -> MethodsCase:
    """Tiny T5 in ``Seq2Seq``: "encode" [1, 6] and "decode" (decoder length dynamic, 1..15). There is
    no KV cache: each step re-reads the whole decoder prefix, so decode's length is dynamic. Entries
    are bound methods of the wrapper."""
    import transformers

    cfg = transformers.T5Config(vocab_size=64, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_decoder_layers=2,
                                num_heads=4, decoder_start_token_id=0, use_cache=False)
    torch.manual_seed(seed)
    model = transformers.T5ForConditionalGeneration(cfg).eval()
    # T5 ties its embeddings (always, in transformers 5): with its default init the input token's embedding
    # dominates the residual stream and greedy decoding just repeats the start token. Damp the embedding and
    # boost the other matrices so that generation varies (deterministic; no random numbers drawn).
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() >= 2 and "shared" not in name and "relative_attention_bias" not in name:
                p.mul_(2.0)
        model.shared.weight.mul_(0.1)
    wrapper = Seq2Seq(model).eval()
    prompt = torch.randint(0, cfg.vocab_size, (1, 6), generator=torch.Generator().manual_seed(seed))
    with torch.no_grad():
        enc = wrapper.encode(prompt)
    dec = torch.tensor([[cfg.decoder_start_token_id, 1, 2]])
    methods = {"encode": (wrapper.encode, (prompt,), None), "decode": (wrapper.decode, (dec, enc), None)}
    dyn = {"encode": None, "decode": ({1: torch.export.Dim("dec_len", min=1, max=15)}, None)}
    return MethodsCase(name="t5_encode_decode", model=wrapper, methods=methods, dynamic_shapes=dyn, strict=True,
                       prompt=prompt, kind="seq2seq", start_token=cfg.decoder_start_token_id)


MAX_LEN = 12


class TinyKV(torch.nn.Module):
    """A one-layer attention decoder over a KV cache held as buffers (what transformers' static cache
    export does): ``forward(ids, pos)`` writes the keys and values of ``pos`` and attends over the
    positions up to each; the output projection is tied to the embedding."""

    def __init__(self, vocab: int = 50, d: int = 16):
        super().__init__()
        torch.manual_seed(0)
        self.emb = torch.nn.Embedding(vocab, d)
        self.k = torch.nn.Linear(d, d)
        self.v = torch.nn.Linear(d, d)
        self.register_buffer("k_cache", torch.zeros(MAX_LEN, d))
        self.register_buffer("v_cache", torch.zeros(MAX_LEN, d))

    def forward(self, ids, pos):
        h = self.emb(ids)
        self.k_cache.index_copy_(0, pos, self.k(h))
        self.v_cache.index_copy_(0, pos, self.v(h))
        scores = (h @ self.k_cache.T) / 4.0
        visible = torch.arange(MAX_LEN)[None, :] <= pos[:, None]
        scores = scores.masked_fill(~visible, float("-inf"))
        out = torch.softmax(scores, -1) @ self.v_cache
        return out @ self.emb.weight.T

    def embed(self, ids):
        return self.emb(ids)
