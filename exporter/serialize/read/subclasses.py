"""Tensor-subclass weights rebuilt from a file (format 1.4): each TensorSubclass record checked
against the stored tensors, its class found only in the registry (exporter.tensor_subclasses),
then built with the class's own __tensor_unflatten__."""

from __future__ import annotations

import torch

from ... import names, tensor_subclasses
from ...errors import CorruptArtifactError, MissingTensorSubclassError
from ...layout.generated import pt2b_generated as G
from ..mapping import flatten_context
from . import untrusted

_OUTER = (G.TensorKind.PARAMETER, G.TensorKind.BUFFER, G.TensorKind.CONSTANT)
_PART = G.TensorKind.SUBCLASS_PART


def _text(b) -> str:
    return b.decode("utf-8", "replace") if isinstance(b, bytes) else str(b)


def rebuild(records, tensors: dict, where: str) -> dict:
    """name -> (kind, subclass tensor, requires_grad) for every record; ``tensors`` is load_tensors'
    result (its SUBCLASS_PART entries are the inner tensors). Every part is used by exactly one
    record, records refer only to parts stored before them (no cycle), nesting is bounded:
    CorruptArtifactError otherwise; a class the process did not register: MissingTensorSubclassError."""
    records = list(records or [])
    if not records:
        return {}
    parts_left = {n for n, (kind, _, _) in tensors.items() if kind == _PART}
    if len(records) > len(parts_left):  # each record uses at least one part of its own
        raise CorruptArtifactError(f"{where}: {len(records)} tensor-subclass records for {len(parts_left)} parts.")
    built: dict[str, tuple[int, torch.Tensor, bool, int]] = {}  # name -> (kind, tensor, requires_grad, depth)
    plans = [_checked(r, tensors, where) for r in records]
    for name, kind, class_name, attrs, parts, r in plans:
        if name in tensors or name in built:
            raise CorruptArtifactError(f"{where}: tensor subclass {name!r} is stored twice.")
        inner, depth = {}, 0
        for attr, part in zip(attrs, parts):
            if part in parts_left:
                parts_left.discard(part)
                inner[attr] = tensors[part][1]
            elif part in built and built[part][0] == _PART:
                _, t, _, d = built.pop(part)
                inner[attr], depth = t, max(depth, d + 1)
            else:
                raise CorruptArtifactError(f"{where}: tensor subclass {name!r} names the part {part!r}, which is no "
                                           f"unused inner tensor or inner subclass stored before it.")
        if depth > tensor_subclasses.MAX_NESTING:
            raise CorruptArtifactError(f"{where}: tensor subclasses nest more than {tensor_subclasses.MAX_NESTING} deep.")
        t = _unflatten(name, class_name, inner, r, where)
        built[name] = (kind, t, bool(r.requiresGrad), depth)
    unused = sorted(parts_left) + sorted(n for n, (kind, *_) in built.items() if kind == _PART)
    if unused:
        raise CorruptArtifactError(f"{where}: the tensor-subclass parts {', '.join(map(repr, unused[:4]))} belong "
                                   f"to no tensor subclass.")
    return {n: (kind, t, rg) for n, (kind, t, rg, _) in built.items()}


def _checked(r, tensors: dict, where: str):
    name = _text(r.name) if r.name is not None else ""
    untrusted.check_name(name, untrusted.FQN, where, "tensor-subclass name")
    name = names.safe_path(name)
    if r.kind not in (*_OUTER, _PART):
        raise CorruptArtifactError(f"{where}: tensor subclass {name!r} has unknown kind {r.kind}.")
    class_name = _text(r.className) if r.className is not None else ""
    untrusted.check_name(class_name, untrusted.CLASS, where, f"the class name of tensor subclass {name!r}")
    attrs = [_text(a) for a in r.attrs or []]
    parts = [_text(p) for p in r.parts or []]
    if not attrs or len(attrs) != len(parts) or len(set(attrs)) != len(attrs):
        raise CorruptArtifactError(f"{where}: tensor subclass {name!r} lists {len(attrs)} attributes for "
                                   f"{len(parts)} parts.")
    for a in attrs:
        untrusted.check_name(a, untrusted.IDENT, where, f"an attribute of tensor subclass {name!r}")
    for p in parts:
        untrusted.check_name(p, untrusted.FQN, where, f"a part of tensor subclass {name!r}")
    return name, r.kind, class_name, attrs, [names.safe_path(p) for p in parts], r


def _unflatten(name: str, class_name: str, inner: dict, r, where: str) -> torch.Tensor:
    cls = tensor_subclasses.class_named(class_name)
    if cls is None:
        raise MissingTensorSubclassError(
            f"{where}: the weight {name!r} is a tensor subclass stored as {class_name!r}, and no class is registered "
            f"under that name in this process: import the class and call exporter.register_tensor_subclass(cls) "
            f"(which registers '<module>.<qualname>') or register_tensor_subclass(cls, name={class_name!r}) before "
            f"loading (from the command line: pt2b --import MODULE, where MODULE registers it). pt2b never "
            f"imports a class named by a file.")
    sizes = [int(s) for s in r.sizes] if r.sizes is not None else []
    strides = [int(s) for s in r.strides] if r.strides is not None else []
    if len(sizes) != len(strides) or any(s < 0 for s in sizes) or any(s < 0 for s in strides):
        raise CorruptArtifactError(f"{where}: tensor subclass {name!r} has the invalid size {sizes[:8]} / "
                                   f"stride {strides[:8]}.")
    raw = bytes(r.context) if r.context is not None else b""
    ctx = flatten_context.decode(raw, f"{where}: tensor subclass {name!r}") if raw else None
    try:
        t = cls.__tensor_unflatten__(inner, ctx, torch.Size(sizes), tuple(strides))
    except Exception as e:  # noqa: BLE001 -- the registered class's own code on the file's data
        raise CorruptArtifactError(f"{where}: {cls.__qualname__}.__tensor_unflatten__ could not rebuild the weight "
                                   f"{name!r} from what the file stores: {type(e).__name__}: {str(e)[:200]}") from None
    if type(t) is not cls or list(t.shape) != sizes:
        raise CorruptArtifactError(f"{where}: {cls.__qualname__}.__tensor_unflatten__ rebuilt {name!r} as a "
                                   f"{type(t).__qualname__} of size {list(getattr(t, 'shape', []))}, not the stored "
                                   f"{class_name} of size {sizes}.")
    return t
