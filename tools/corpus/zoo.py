"""Model zoo: small seeded torch.nn models plus example inputs that torch.export can capture.
Owns ZooCase, the case registry (zoo_names/make_case), the pt2b_zoo::scaled_add op, encoder_6x512."""

from __future__ import annotations

import dataclasses
from typing import Callable

import torch
import torch.nn as nn
import torch.nn.functional as F

from exporter._torch.tracing import hop_map, while_loop

__all__ = [
    "ZooCase",
    "zoo_names",
    "make_case",
    "encoder_6x512",
]


@dataclasses.dataclass
class ZooCase:
    name: str
    model: torch.nn.Module  # in eval mode unless the case is about training-mode behaviour
    args: tuple
    kwargs: dict | None = None
    dynamic_shapes: object = None  # as torch.export expects, or None
    strict: bool = False
    rtol: float = 1e-5  # tolerance for comparing against eager
    atol: float = 1e-5
    notes: str = ""


# --------------------------------------------------------------------------------------------
# Custom op, registered once per process (re-importing zoo.py, e.g. via importlib.reload or under a
# second module name, must not try to define it again: torch.library refuses a duplicate).
# --------------------------------------------------------------------------------------------

CUSTOM_OP_NAME = "pt2b_zoo::scaled_add"


def _custom_op_registered() -> bool:
    try:
        torch.ops.pt2b_zoo.scaled_add  # noqa: B018 -- attribute lookup raises if absent
    except (AttributeError, RuntimeError):
        return False
    return True


if not _custom_op_registered():

    @torch.library.custom_op(CUSTOM_OP_NAME, mutates_args=())
    def _scaled_add(x: torch.Tensor, y: torch.Tensor, alpha: float) -> torch.Tensor:
        return x + alpha * y

    @_scaled_add.register_fake
    def _scaled_add_fake(x: torch.Tensor, y: torch.Tensor, alpha: float) -> torch.Tensor:
        return torch.empty_like(x)


# --------------------------------------------------------------------------------------------
# Models
# --------------------------------------------------------------------------------------------


class MLP(nn.Module):
    def __init__(self, d_in=16, d_hidden=32, d_out=8):
        super().__init__()
        self.fc1 = nn.Linear(d_in, d_hidden)
        self.fc2 = nn.Linear(d_hidden, d_out)

    def forward(self, x):
        return F.gelu(self.fc2(F.relu(self.fc1(x))))


class ConvBN(nn.Module):
    def __init__(self, c_in=3, c_mid=8, n_classes=10):
        super().__init__()
        self.conv = nn.Conv2d(c_in, c_mid, 3, padding=1)
        self.bn = nn.BatchNorm2d(c_mid)
        self.pool = nn.MaxPool2d(2)
        self.gap = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(c_mid, n_classes)

    def forward(self, x):
        x = self.pool(F.relu(self.bn(self.conv(x))))
        return self.fc(torch.flatten(self.gap(x), 1))


class LSTMHead(nn.Module):
    def __init__(self, d_in=8, hidden=16, d_out=4):
        super().__init__()
        self.lstm = nn.LSTM(d_in, hidden, num_layers=2, batch_first=True)
        self.head = nn.Linear(hidden, d_out)

    def forward(self, x):
        out, (h, c) = self.lstm(x)
        return self.head(out), (h, c)


class BiGRU(nn.Module):
    def __init__(self, d_in=8, hidden=16):
        super().__init__()
        self.gru = nn.GRU(d_in, hidden, num_layers=1, batch_first=True, bidirectional=True)

    def forward(self, x):
        out, h = self.gru(x)
        return out, h


class BufferMutation(nn.Module):
    def __init__(self, d=8):
        super().__init__()
        self.lin = nn.Linear(d, d)
        self.register_buffer("count", torch.zeros((), dtype=torch.int64))
        self.register_buffer("ema", torch.zeros(d))
        self.register_buffer("scale", torch.full((d,), 0.5), persistent=False)
        # A plain tensor attribute: neither parameter nor buffer -> a lifted tensor constant.
        self.offset = torch.linspace(-1.0, 1.0, d)

    def forward(self, x):
        self.count.add_(1)
        self.ema.mul_(0.9).add_(x.mean(0) * 0.1)
        return self.lin(x) * self.scale + self.offset + self.ema


class PytreeIO(nn.Module):
    def __init__(self, d=4):
        super().__init__()
        self.lin = nn.Linear(d, d)

    def forward(self, inputs, maybe, pair):
        a = inputs["a"]
        b0, b1 = inputs["b"]
        assert maybe is None
        p, q = pair
        s = self.lin(a) + b0
        return {
            "tup": (s, b1 * 2.0),
            "lst": [p + q, p - q, s.sum()],
            "none": None,
        }


class _OneLinear(nn.Module):
    """A model holding one Linear(d, d) (``self.lin``); subclasses say how forward uses it."""

    def __init__(self, d=8):
        super().__init__()
        self.lin = nn.Linear(d, d)


class KwargsOnly(_OneLinear):
    def forward(self, x, *, scale, bias=None):
        y = self.lin(x) * scale
        if bias is not None:
            y = y + bias
        return y


class DynamicShapes(nn.Module):
    """x: (B, N, 4), y: (B, 8); B shared, N dynamic too."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.proj = nn.Linear(8, 4)

    def forward(self, x, y):
        b, n, d = x.shape
        h = self.lin(x.reshape(b * n, d)).view(b, n, d)  # flatten/unflatten with symbolic sizes
        h = h + self.proj(y).unsqueeze(1)  # broadcast over the shared batch dim
        doubled = torch.cat([h, h], dim=0).view(x.shape[0] * 2, n * d)  # (2B, N*4)
        flat = h.transpose(0, 1).contiguous().view(n, -1)  # (N, B*4)
        return doubled.sum(-1), flat.mean(0), h.new_ones(b, n) * d


class Cond(nn.Module):
    def __init__(self, d=8):
        super().__init__()
        self.pos = nn.Linear(d, d)
        self.neg = nn.Linear(d, d)

    def forward(self, x):
        def true_fn(t):
            return torch.relu(self.pos(t))

        def false_fn(t):
            return torch.tanh(self.neg(t)) - 1.0

        return torch.cond(x.sum() > 0, true_fn, false_fn, (x,))


class MapModel(_OneLinear):
    def forward(self, xs, y):
        def body(x, y):
            return self.lin(x) + y

        return hop_map(body, xs, y)


class WhileLoop(_OneLinear):
    def forward(self, n, x):
        def cond_fn(i, h):
            return i < n

        def body_fn(i, h):
            return i + 1, torch.tanh(self.lin(h))

        i0 = torch.zeros((), dtype=torch.int64)
        return while_loop(cond_fn, body_fn, (i0, x))


class CustomOpModel(_OneLinear):
    def forward(self, x, y):
        return torch.ops.pt2b_zoo.scaled_add(self.lin(x), y, 0.5)


class TiedWeights(nn.Module):
    def __init__(self, vocab=50, d=16):
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.norm = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)
        self.head.weight = self.emb.weight  # same Parameter object: one storage, two names

    def forward(self, tokens):
        return self.head(self.norm(self.emb(tokens)))


class Dtypes(nn.Module):
    def __init__(self, d=4):
        super().__init__()
        self.p_f16 = nn.Parameter(torch.randn(d).to(torch.float16))
        self.p_bf16 = nn.Parameter(torch.randn(d).to(torch.bfloat16))
        self.p_f64 = nn.Parameter(torch.randn(d, dtype=torch.float64))
        self.register_buffer("b_i64", torch.arange(d, dtype=torch.int64))
        self.register_buffer("b_i8", torch.tensor([-3, -1, 2, 5][:d], dtype=torch.int8))
        self.register_buffer("b_u8", torch.tensor([0, 7, 200, 255][:d], dtype=torch.uint8))
        self.register_buffer("b_bool", torch.tensor([True, False, True, False][:d]))
        self.register_buffer("b_c64", torch.randn(d, dtype=torch.complex64))
        self.register_buffer("b_f8", torch.randn(d).to(torch.float8_e4m3fn))
        self.register_buffer("b_noncontig", torch.randn(d, 3).t())  # (3, d), strides (1, 3)
        self.register_buffer("b_scalar", torch.tensor(1.5))  # 0-d
        self.register_buffer("b_empty", torch.zeros(0))  # 0 elements

    def forward(self, x):
        y = x * self.p_f16.float() + self.p_bf16.float() + self.p_f64.float()
        y = y + self.b_i64.float() * 0.1 + self.b_i8.float() * 0.01 + self.b_u8.float() * 0.001
        y = torch.where(self.b_bool, y, -y)
        y = y + self.b_c64.abs() + self.b_f8.float()
        y = y + self.b_noncontig.sum(0) * self.b_scalar + self.b_empty.sum()
        return y


class InplaceOps(nn.Module):
    def __init__(self, d=6):
        super().__init__()
        self.lin = nn.Linear(d, d)
        self.register_buffer("idx", torch.tensor([0, 2], dtype=torch.int64))

    def forward(self, x):
        y = self.lin(x).clone().add_(1).mul_(2)
        torch.relu_(y)
        y.index_put_((self.idx,), torch.ones(2, y.shape[1]) * 3.0, accumulate=True)
        y[:, 0] = 0
        z = torch.empty_like(y)
        z.copy_(y)
        z.sub_(0.5)
        return z


class CausalDecoder(nn.Module):
    """nn.TransformerDecoder applying tgt_mask as given. tgt_is_causal=False is passed explicitly: left
    as None, torch compares tgt_mask's values with a generated causal mask, a data-dependent guard
    that export rejects; True would make attention ignore tgt_mask and use SDPA's is_causal instead."""

    def __init__(self, d_model=64, nhead=4, dim_feedforward=128, num_layers=2):
        super().__init__()
        layer = nn.TransformerDecoderLayer(
            d_model, nhead, dim_feedforward=dim_feedforward, dropout=0.1, batch_first=True
        )
        self.decoder = nn.TransformerDecoder(layer, num_layers=num_layers)

    def forward(self, tgt, memory, *, tgt_mask):
        return self.decoder(tgt, memory, tgt_mask=tgt_mask, tgt_is_causal=False)


class MHA(nn.Module):
    def __init__(self, d=32, heads=4):
        super().__init__()
        self.attn = nn.MultiheadAttention(d, heads, batch_first=True)

    def forward(self, q, kv):
        out, weights = self.attn(q, kv, kv, need_weights=True)
        return out, weights


# --------------------------------------------------------------------------------------------
# Case builders (called after torch.manual_seed(0))
# --------------------------------------------------------------------------------------------


def _mlp() -> ZooCase:
    batch = torch.export.Dim("batch", min=1, max=64)
    return ZooCase(
        name="mlp",
        model=MLP().eval(),
        args=(torch.randn(4, 16),),
        dynamic_shapes={"x": {0: batch}},
        notes="Linear/ReLU/Linear/GELU with a dynamic batch dim (1..64).",
    )


def _mlp_strict() -> ZooCase:
    case = _mlp()
    case.name = "mlp_strict"
    case.strict = True
    case.notes = "The mlp case exported with strict=True (TorchDynamo front end)."
    return case


def _build_encoder(num_layers, d_model, nhead, dim_feedforward) -> nn.Module:
    layer = nn.TransformerEncoderLayer(
        d_model, nhead, dim_feedforward=dim_feedforward, dropout=0.1, batch_first=True
    )
    return nn.TransformerEncoder(layer, num_layers=num_layers, enable_nested_tensor=False).eval()


def _pytree_io() -> ZooCase:
    inputs = {"a": torch.randn(3, 4), "b": [torch.randn(3, 4), torch.randn(2)]}
    return ZooCase(
        name="pytree_io",
        model=PytreeIO().eval(),
        args=(inputs, None, (torch.randn(5), torch.randn(5))),
        notes="Nested dict/list/tuple inputs with a None arg; output dict holds a tuple, a list and a None.",
    )


def _dynamic_shapes() -> ZooCase:
    batch = torch.export.Dim("batch", min=2, max=32)
    seq = torch.export.Dim("seq", min=2, max=64)
    return ZooCase(
        name="dynamic_shapes",
        model=DynamicShapes().eval(),
        args=(torch.randn(3, 5, 4), torch.randn(3, 8)),
        dynamic_shapes={"x": {0: batch, 1: seq}, "y": {0: batch}},
        notes="x (batch, seq, 4) and y (batch, 8) share the batch Dim; reshapes/views use symbolic sizes.",
    )


def _case(name: str, model: Callable[[], nn.Module], args: Callable[[], tuple],
          kwargs: Callable[[], dict] | None = None, *, train: bool = False, **fields) -> Callable[[], ZooCase]:
    """The builder of a case that calls a new ``model()`` (in eval mode; train mode with ``train``) on
    ``args()`` and ``kwargs()``, drawn in that order after the model's parameters; ``fields``: the rest."""
    return lambda: ZooCase(name=name, model=model().train(train), args=args(), kwargs=kwargs and kwargs(), **fields)


_BUILDERS: dict[str, Callable[[], ZooCase]] = {
    "mlp": _mlp,
    "mlp_strict": _mlp_strict,
    "cnn_bn": _case("cnn_bn", ConvBN, lambda: (torch.randn(2, 3, 16, 16),),
                    notes="Conv2d+BatchNorm2d(eval, running stats)+ReLU+MaxPool+AdaptiveAvgPool+Linear."),
    "cnn_bn_train": _case("cnn_bn_train", ConvBN, lambda: (torch.randn(2, 3, 16, 16),), train=True, notes=(
        "train() mode: BatchNorm uses batch statistics and updates its buffers in place. The training-IR graph "
        "shows aten.add_.Tensor on num_batches_tracked, but running_mean/var are updated inside "
        "aten.batch_norm.default, whose schema carries no mutation annotation; graph_signature.buffers_to_mutate "
        "is empty.")),
    "lstm": _case("lstm", LSTMHead, lambda: (torch.randn(2, 5, 8),),
                  notes="2-layer batch_first LSTM + Linear head; returns (head(out), (h, c))."),
    "gru": _case("gru", BiGRU, lambda: (torch.randn(2, 5, 8),),
                 notes="Bidirectional batch_first GRU; returns (out, h)."),
    "transformer_encoder": _case(
        "transformer_encoder", lambda: _build_encoder(2, 64, 4, 128), lambda: (torch.randn(2, 10, 64),),
        rtol=1e-4, atol=1e-4, notes="2-layer nn.TransformerEncoder, d_model=64, nhead=4, batch_first, eval. Eager "
        "under no_grad may take the fused fast path, hence the looser tolerance."),
    "transformer_decoder": _case(
        "transformer_decoder", CausalDecoder, lambda: (torch.randn(2, 6, 64), torch.randn(2, 9, 64)),
        lambda: {"tgt_mask": nn.Transformer.generate_square_subsequent_mask(6)}, rtol=1e-4, atol=1e-4,
        notes="2-layer nn.TransformerDecoder(tgt, memory) with a causal float tgt_mask passed as a kwarg (the "
        "wrapper passes tgt_is_causal=False so torch uses the mask without testing its values)."),
    "buffer_mutation": _case("buffer_mutation", BufferMutation, lambda: (torch.randn(4, 8),), notes=(
        "In-place buffer updates (count.add_, ema.mul_().add_()), a non-persistent buffer (scale) and a lifted "
        "tensor constant (offset). Graph keeps add_/mul_ on the buffers; ep.module() shares buffer storage with "
        "ep.state_dict (and the exported model), so running it changes what torch.export.save would write.")),
    "pytree_io": _pytree_io,
    "kwargs_only": _case("kwargs_only", KwargsOnly, lambda: (torch.randn(3, 8),),
                         lambda: {"scale": torch.randn(8), "bias": torch.randn(8)},
                         notes="forward(x, *, scale, bias=None) with keyword-only tensor inputs."),
    "dynamic_shapes": _dynamic_shapes,
    "cond": _case("cond", Cond, lambda: (torch.randn(3, 8),),
                  notes="torch.cond on x.sum() > 0; both branches close over their own Linear's parameters."),
    "map": _case("map", MapModel, lambda: (torch.randn(4, 3, 8), torch.randn(8)),
                 notes="torch._higher_order_ops.map over the leading dim of xs, y passed through to every step."),
    "while_loop": _case("while_loop", WhileLoop, lambda: (torch.tensor(3, dtype=torch.int64), torch.randn(2, 8)),
                        notes="while_loop with an int64 counter tensor i < n; body applies tanh(Linear(h)). "
                        "torch.export.load logs 'Symbol u0 did not appear in the graph' (harmless)."),
    "custom_op": _case("custom_op", CustomOpModel, lambda: (torch.randn(3, 8), torch.randn(3, 8)),
                       notes="Calls torch.ops.pt2b_zoo.scaled_add (torch.library.custom_op + register_fake)."),
    "tied_weights": _case("tied_weights", TiedWeights, lambda: (torch.randint(0, 50, (2, 7)),),
                          notes="head.weight is emb.weight: one Parameter, two state_dict names."),
    "dtypes": _case("dtypes", Dtypes, lambda: (torch.randn(2, 4),), notes=(
        "Parameters in f16/bf16/f64; buffers in i64/i8/u8/bool/complex64/float8_e4m3fn, a non-contiguous "
        "(transposed view) buffer, a 0-d buffer and a 0-element buffer. torch.export.save warns 'No complete "
        "tensor found in the group' for the view buffer; save/load round-trips every dtype, shape and stride "
        "exactly.")),
    "inplace_ops": _case("inplace_ops", InplaceOps, lambda: (torch.randn(4, 6),),
                         notes="clone().add_().mul_(), torch.relu_, index_put_(accumulate), y[:, 0] = 0, copy_, sub_."),
    "multihead_attention": _case(
        "multihead_attention", MHA, lambda: (torch.randn(2, 5, 32), torch.randn(2, 7, 32)), rtol=1e-4, atol=1e-5,
        notes="nn.MultiheadAttention (batch_first) returning output and averaged attention weights."),
}


# --------------------------------------------------------------------------------------------
# Public API
# --------------------------------------------------------------------------------------------


def zoo_names() -> list[str]:
    """Names of the unit-test-sized cases, in a stable order."""
    return list(_BUILDERS)


def make_case(name: str) -> ZooCase:
    """Build a fresh case (new model, new inputs) deterministically: seeds torch with 0 first."""
    try:
        builder = _BUILDERS[name]
    except KeyError:
        raise KeyError(f"unknown zoo case {name!r}; known cases: {', '.join(zoo_names())}") from None
    torch.manual_seed(0)
    return builder()


def encoder_6x512(num_layers: int = 6) -> ZooCase:
    """Benchmark-sized nn.TransformerEncoder: 6 layers, d_model=512, nhead=8, dim_feedforward=2048
    (~19M params), batch_first, eval, input (1, 128, 512).

    Not in zoo_names(): too big for unit tests.
    """
    torch.manual_seed(0)
    return ZooCase(
        name="encoder_6x512" if num_layers == 6 else f"encoder_{num_layers}x512",
        model=_build_encoder(num_layers, 512, 8, 2048),
        args=(torch.randn(1, 128, 512),),
        rtol=1e-4,
        atol=1e-4,
        notes=(
            f"{num_layers}-layer nn.TransformerEncoder, d_model=512, nhead=8, dim_feedforward=2048, "
            "batch_first, eval."
        ),
    )


class GPT(nn.Module):
    """A GPT-2-style decoder-only language model from torch.nn parts: token and position embeddings,
    pre-norm causal self-attention blocks (nn.TransformerEncoderLayer, GELU), a final LayerNorm and
    an LM head tied to the token embedding."""

    def __init__(self, vocab=50257, context=1024, d_model=1024, nhead=16, num_layers=24):
        super().__init__()
        self.tok = nn.Embedding(vocab, d_model)
        self.pos = nn.Embedding(context, d_model)
        layer = nn.TransformerEncoderLayer(d_model, nhead, dim_feedforward=4 * d_model, dropout=0.0,
                                           activation="gelu", batch_first=True, norm_first=True)
        self.blocks = nn.TransformerEncoder(layer, num_layers=num_layers, enable_nested_tensor=False)
        self.ln_f = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, vocab, bias=False)
        self.head.weight = self.tok.weight
        self.register_buffer("causal", nn.Transformer.generate_square_subsequent_mask(context), persistent=False)

    def forward(self, idx):
        t = idx.shape[1]
        x = self.tok(idx) + self.pos(torch.arange(t, device=idx.device))
        x = self.blocks(x, mask=self.causal[:t, :t], is_causal=True)
        return self.head(self.ln_f(x))


def gpt_350m(num_layers: int = 24) -> ZooCase:
    """Benchmark-sized GPT-2-medium-like decoder: 24 layers, d_model=1024, 16 heads, vocab 50257,
    context 1024: ~355M parameters (1.4 GB in float32), eval, input token ids (1, 128).

    Not in zoo_names(): too big for unit tests.
    """
    torch.manual_seed(0)
    return ZooCase(
        name="gpt_350m" if num_layers == 24 else f"gpt_{num_layers}x1024",
        model=GPT(num_layers=num_layers).eval(),
        args=(torch.randint(0, 50257, (1, 128)),),
        rtol=1e-3,
        atol=1e-3,
        notes=f"GPT-2-medium-like decoder, {num_layers} pre-norm blocks of width 1024, tied LM head, eval.",
    )
