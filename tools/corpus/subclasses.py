"""Tensor-subclass weights for tests, the golden of format 1.4 and the docs' example: ``ScaledTensor``
(int8 data and a float scale, every op computing on the dequantized values and returning plain
tensors, the shape of torchao's weight-only quantization), registered with pt2b under a stable name,
and ``ScaledLinear`` that holds one. Export them with torch.export.export: export_model(module) would
unwrap the weight into plain tensors before capture."""

from __future__ import annotations

import torch
from torch.utils._python_dispatch import return_and_correct_aliasing
from torch.utils._pytree import tree_map

from exporter import register_tensor_subclass

__all__ = ["NAME", "ScaledLinear", "ScaledTensor"]

NAME = "pt2b.corpus.ScaledTensor"


class ScaledTensor(torch.Tensor):
    """``data_`` (any dtype) times ``scale``, seen as ``out_dtype``; the context holds a float and a dtype."""

    @staticmethod
    def __new__(cls, data, scale: float, out_dtype: torch.dtype):
        return torch.Tensor._make_wrapper_subclass(cls, data.shape, strides=data.stride(), dtype=out_dtype,
                                                   device=data.device)

    def __init__(self, data, scale: float, out_dtype: torch.dtype):
        self.data_ = data
        self.scale = scale
        self.out_dtype = out_dtype

    def __repr__(self):
        return f"ScaledTensor({self.dequantized()})"

    def __tensor_flatten__(self):
        return ["data_"], {"scale": self.scale, "dtype": self.out_dtype}

    @staticmethod
    def __tensor_unflatten__(inner, ctx, outer_size, outer_stride):
        return ScaledTensor(inner["data_"], ctx["scale"], ctx["dtype"])

    def dequantized(self) -> torch.Tensor:
        return self.data_.to(self.out_dtype) * self.scale

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in (torch.ops.aten.detach.default, torch.ops.aten.alias.default):
            s = args[0]
            return return_and_correct_aliasing(func, args, kwargs, ScaledTensor(func(s.data_), s.scale, s.out_dtype))
        plain = lambda v: v.dequantized() if isinstance(v, ScaledTensor) else v  # noqa: E731
        return func(*tree_map(plain, args), **tree_map(plain, kwargs))


register_tensor_subclass(ScaledTensor, name=NAME)


class ScaledLinear(torch.nn.Module):
    """A linear layer whose weight is a ScaledTensor of int8 values; plain input and output."""

    def __init__(self, in_features: int = 5, out_features: int = 4, seed: int = 1):
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        q = torch.randint(-8, 8, (out_features, in_features), dtype=torch.int8, generator=g)
        self.w = torch.nn.Parameter(ScaledTensor(q, 0.125, torch.float32), requires_grad=False)
        self.bias = torch.nn.Parameter(torch.randn(out_features, generator=g))

    def forward(self, x):
        return torch.nn.functional.linear(x, self.w, self.bias).relu()
