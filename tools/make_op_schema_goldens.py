"""Write the op-schema drift goldens into tests/golden/ops/: artifacts whose op table holds REAL
schema strings of earlier torch releases (docs/op-schema-history.md) and whose
nodes are shaped the way that torch took the op's arguments.

Each case exports a small model with the running torch, then tests/support/artifact_surgery.py replaces
the op-table record with the historical schema, rewrites the node's inputs/outputs to the old
form and sets the producing torch version. <name>.io.npz holds the float32 inputs and the
expected outputs (numpy, no pickle; same layout as tools/make_goldens.py).
Goldens are added once and never regenerated: existing files are never overwritten.
Usage: python -m tools.make_op_schema_goldens [OUT_DIR (default tests/golden/ops)]
"""

from __future__ import annotations

import copy
import pathlib
import sys
import tempfile

import torch
import torch.nn.functional as F

from torch._export.serde import schema as S

from exporter import export_model
from tests.support.artifact_surgery import drop_inputs, find_nodes, rewrite_artifact
from tools.make_goldens import GOLDEN, save_io

OUT = GOLDEN / "ops"
PROVENANCE = "tools/make_op_schema_goldens.py: exported by torch {now}, op table and nodes rewritten to torch {old}"

# Verbatim OLD schema strings (rows of docs/op-schema-history.md in brackets).
OLD = {
    # [7] torch 2.0 (scale added in 2.1, enable_gqa in 2.5)
    "sdpa": "aten::scaled_dot_product_attention(Tensor query, Tensor key, Tensor value, Tensor? attn_mask=None, "
            "float dropout_p=0.0, bool is_causal=False) -> Tensor",
    # [5] torch <= 1.11
    "gelu": "aten::gelu(Tensor self) -> Tensor",
    # [3] torch <= 1.10, None meant 100
    "linspace": "aten::linspace(Scalar start, Scalar end, int? steps=None, *, ScalarType? dtype=None, "
                "Layout? layout=None, Device? device=None, bool? pin_memory=None) -> Tensor",
    # [4] torch <= 1.10
    "logspace": "aten::logspace(Scalar start, Scalar end, int? steps=None, float base=10.0, *, "
                "ScalarType? dtype=None, Layout? layout=None, Device? device=None, bool? pin_memory=None) -> Tensor",
    # [12] torch 2.0
    "var_correction": "aten::var.correction(Tensor self, int[1]? dim=None, *, int? correction=None, "
                      "bool keepdim=False) -> Tensor",
    # [13] read in 1.12, unchanged until align_to_window (2.7)
    "stft": "aten::stft(Tensor self, int n_fft, int? hop_length=None, int? win_length=None, Tensor? window=None, "
            "bool normalized=False, bool? onesided=None, bool? return_complex=None) -> Tensor",
    # [6] torch 1.11
    "gelu_backward": "aten::gelu_backward(Tensor grad, Tensor self) -> Tensor",
    # [9] torch 2.0 (CUDA-only op: stored, upgraded and deserialized in tests, run only with CUDA)
    "sdpa_efficient": "aten::_scaled_dot_product_efficient_attention(Tensor query, Tensor key, Tensor value, "
                      "bool compute_log_sumexp, bool is_causal=False) -> (Tensor, Tensor)",
}


class Sdpa(torch.nn.Module):
    def forward(self, q, k, v, mask):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=0.0)


class Gelu(torch.nn.Module):
    def forward(self, x):
        return F.gelu(x) * 2.0


class Linspace(torch.nn.Module):
    def forward(self, x):
        return x * torch.linspace(-1.0, 1.0, 100)


class Logspace(torch.nn.Module):
    def forward(self, x):
        return x + torch.logspace(0.0, 1.0, 100)


class VarCorrection(torch.nn.Module):
    def forward(self, x):
        return torch.var(x, dim=1, correction=0) + torch.var(x, dim=0, correction=2)


class Stft(torch.nn.Module):
    def forward(self, x):
        window = torch.hann_window(16)
        spec = torch.stft(x, 16, hop_length=4, window=window, center=False, return_complex=True)
        return spec.abs()


class GeluBackward(torch.nn.Module):
    def forward(self, g, x):
        return torch.ops.aten.gelu_backward(g, x)


class EfficientAttention(torch.nn.Module):
    def forward(self, q, k, v):
        return torch.ops.aten._scaled_dot_product_efficient_attention(q, k, v, None, False)[0]


def _old_sdpa_nodes(ep, prog):
    for n in find_nodes(ep, "torch.ops.aten.scaled_dot_product_attention.default"):
        drop_inputs(n, "scale", "enable_gqa")


def _old_gelu_nodes(ep, prog):
    for n in find_nodes(ep, "torch.ops.aten.gelu.default"):
        drop_inputs(n, "approximate")


def _linspace_steps_omitted(ep, prog):   # as written by linspace(-1, 1): steps left to its default
    for n in find_nodes(ep, "torch.ops.aten.linspace.default"):
        drop_inputs(n, "steps")


def _logspace_steps_none(ep, prog):      # as written by logspace(0, 1, None)
    for n in find_nodes(ep, "torch.ops.aten.logspace.default"):
        for i in n.inputs:
            if i.name == "steps":
                i.arg = S.Argument.create(as_none=True)


def _var_int_correction(ep, prog):
    for n in find_nodes(ep, "torch.ops.aten.var.correction"):
        assert [i.arg.type for i in n.inputs if i.name == "correction"] == ["as_int"]


def _old_stft_nodes(ep, prog):
    for n in find_nodes(ep, "torch.ops.aten.stft.default"):
        drop_inputs(n, "align_to_window")


def _gelu_backward_grad(ep, prog):
    for n in find_nodes(ep, "torch.ops.aten.gelu_backward.default"):
        drop_inputs(n, "approximate")
        for i in n.inputs:
            if i.name == "grad_output":
                i.name = "grad"


def _efficient_attention_2_0(ep, prog):
    graph = ep.graph_module.graph
    for n in find_nodes(ep, "torch.ops.aten._scaled_dot_product_efficient_attention.default"):
        drop_inputs(n, "attn_bias", "dropout_p", "scale")
        for o in n.outputs[2:]:
            graph.tensor_values.pop(o.as_tensor.name)
        n.outputs = n.outputs[:2]


def _r(*shape, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g, dtype=torch.float32)


def cases():
    q, k, v = _r(2, 3, 5, 8, seed=1), _r(2, 3, 7, 8, seed=2), _r(2, 3, 7, 8, seed=3)
    mask = _r(5, 7, seed=4)
    eq, ek, ev = _r(1, 2, 6, 8, seed=5), _r(1, 2, 6, 8, seed=6), _r(1, 2, 6, 8, seed=7)
    return {
        # name: (model, args, old schema key, (qualified, overload), edit, simulated torch, expected or None)
        "sdpa_2_0": (Sdpa(), (q, k, v, mask), "sdpa", ("aten::scaled_dot_product_attention", "default"),
                     _old_sdpa_nodes, "2.0.1", None),
        "gelu_1_11": (Gelu(), (_r(4, 9, seed=8),), "gelu", ("aten::gelu", "default"), _old_gelu_nodes,
                      "1.11.0", None),
        "linspace_1_10": (Linspace(), (_r(3, 100, seed=9),), "linspace", ("aten::linspace", "default"),
                          _linspace_steps_omitted, "1.10.2", None),
        "logspace_1_10": (Logspace(), (_r(2, 100, seed=10),), "logspace", ("aten::logspace", "default"),
                          _logspace_steps_none, "1.10.2", None),
        "var_correction_2_0": (VarCorrection(), (_r(6, 6, seed=11),), "var_correction",
                               ("aten::var", "correction"), _var_int_correction, "2.0.1", None),
        "stft_1_12": (Stft(), (_r(64, seed=12),), "stft", ("aten::stft", "default"), _old_stft_nodes,
                      "1.12.1", None),
        "gelu_backward_1_11": (GeluBackward(), (_r(4, 9, seed=13), _r(4, 9, seed=14)), "gelu_backward",
                               ("aten::gelu_backward", "default"), _gelu_backward_grad, "1.11.0", None),
        # CUDA-only kernel: the expected output is sdpa's math result on CPU (same semantics).
        "sdpa_efficient_2_0": (EfficientAttention(), (eq, ek, ev), "sdpa_efficient",
                               ("aten::_scaled_dot_product_efficient_attention", "default"),
                               _efficient_attention_2_0, "2.0.1",
                               F.scaled_dot_product_attention(eq, ek, ev)),
    }


def main(out: pathlib.Path = OUT) -> int:
    out.mkdir(exist_ok=True)
    wrote = 0
    for name, (model, args, key, record, edit, old_torch, expected) in cases().items():
        dst, io = out / f"{name}.pt2b", out / f"{name}.io.npz"
        if dst.exists() or io.exists():
            print(f"{dst} exists: goldens are never regenerated (add a new case instead)")
            continue
        with tempfile.TemporaryDirectory() as tmp:
            src = pathlib.Path(tmp) / "src.pt2b"
            ep = export_model(copy.deepcopy(model), args, src,
                              metadata={"golden": name, "schema_change": OLD[key], "simulated_torch": old_torch})
            if expected is None:
                expected = ep.module()(*copy.deepcopy(args))
            rewrite_artifact(src, dst, edit=edit, ops={record: OLD[key]}, torch_version=old_torch,
                             provenance={"simulated_by": PROVENANCE.format(now=torch.__version__, old=old_torch)})
        save_io(io, (args, {}), expected)
        wrote += 1
        print(f"wrote {name}")
    return 0 if wrote or any(out.glob("*.pt2b")) else 1


if __name__ == "__main__":
    sys.exit(main(pathlib.Path(sys.argv[1]) if len(sys.argv) > 1 else OUT))
