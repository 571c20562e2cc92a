"""Tensor-subclass weights as what the format stores (1.4): their inner tensors, to go into the weight
segments as TensorRecords of kind SUBCLASS_PART, and a TensorSubclass record naming the registered
class, the inner attributes, the flatten context and the outer size and stride."""

from __future__ import annotations

import numpy as np
import torch

from ... import tensor_subclasses
from ...errors import UnsupportedValueError
from ...layout.generated import pt2b_generated as G
from ..mapping import flatten_context

is_subclass = tensor_subclasses.is_subclass


def unstorable(name: str, t: torch.Tensor) -> str | None:
    """Why the subclass weight ``t`` cannot be stored (its class, or a nested one, unregistered or
    without torch's flatten protocol), or None."""
    stack = [(name, t, 0)]
    while stack:
        where, v, depth = stack.pop()
        cls = type(v)
        label = f"{cls.__module__}.{cls.__qualname__}"
        if not hasattr(v, "__tensor_flatten__") or not hasattr(cls, "__tensor_unflatten__"):
            return (f"{where!r} is a tensor subclass, {label}, without torch's __tensor_flatten__ / "
                    f"__tensor_unflatten__: .pt2b stores a subclass as its inner tensors, which such a class "
                    f"does not name.")
        attrs, _ = v.__tensor_flatten__()
        if tensor_subclasses.name_of(cls) is None:
            return (f"{where!r} is a tensor subclass, {label} (it wraps the tensors {', '.join(attrs)}), and no "
                    f"name is registered for it: call exporter.register_tensor_subclass({cls.__qualname__}) before "
                    f"writing (and in the process that loads the file), so that the file names the class by that "
                    f"name and the reader builds it with __tensor_unflatten__.")
        if depth >= tensor_subclasses.MAX_NESTING:
            return f"{where!r} nests tensor subclasses more than {tensor_subclasses.MAX_NESTING} deep."
        for a in attrs:
            inner = getattr(v, a)
            if is_subclass(inner):
                stack.append((f"{where}.{a}", inner, depth + 1))
    return None


def flatten(name: str, kind: int, t: torch.Tensor, out_tensors: list, out_records: list) -> None:
    """Append ``t``'s inner tensors (name, SUBCLASS_PART, tensor) to ``out_tensors`` and its
    TensorSubclass records (nested ones first) to ``out_records``."""
    attrs, ctx = t.__tensor_flatten__()
    record = G.TensorSubclassT()
    record.name = name
    record.kind = kind
    record.className = tensor_subclasses.name_of(type(t))
    record.attrs = list(attrs)
    record.parts = []
    for a in attrs:
        part, inner = f"{name}.{a}", getattr(t, a)
        if is_subclass(inner):
            flatten(part, G.TensorKind.SUBCLASS_PART, inner, out_tensors, out_records)
        else:
            out_tensors.append((part, G.TensorKind.SUBCLASS_PART, inner))
        record.parts.append(part)
    record.context = np.frombuffer(flatten_context.encode(ctx, f"tensor subclass {name!r}"), dtype=np.uint8)
    record.sizes = [int(s) for s in t.shape]
    record.strides = [int(s) for s in t.stride()]
    record.requiresGrad = bool(t.requires_grad)
    out_records.append(record)


def check_names(tensors: list, records: list) -> None:
    """Every stored name distinct: a part named like another weight would be ambiguous."""
    seen: set[str] = set()
    for name in [n for n, _, _ in tensors] + [r.name for r in records]:
        if name in seen:
            raise UnsupportedValueError(
                f"the name {name!r} is both a weight and an inner tensor of a tensor subclass (stored as "
                f"'<weight>.<attribute>'); rename the weight or the subclass's attribute.")
        seen.add(name)
