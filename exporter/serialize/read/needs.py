"""What a file needs of the process that loads and runs it beyond torch: the Python types its inputs and outputs
name, its custom ops, its tensor-subclass classes, and its ops with kernels for some devices only."""

from __future__ import annotations

import dataclasses
import os

from ... import tensor_subclasses
from ...layout.generated import pt2b_generated as G
from ...ops import resolve_op
from ...shared.kernels import kernel_devices
from ..._torch.pytree import pytree
from . import pytree_types

__all__ = ["Needs", "needs_to_load"]

_TORCHS_OWN = ("builtins.", "collections.", "torch.")  # types torch registers itself


@dataclasses.dataclass(frozen=True)
class Needs:
    """Each need by name, with where this process finds it or, where it does not, what to do (``missing``):
    ``pytree_types`` (the types of the inputs and outputs that torch does not register itself),
    ``custom_ops``, ``tensor_subclasses`` (class names); ``device_ops``: op -> the device types torch
    has kernels of it for, for each op that has no kernel on cpu."""

    pytree_types: dict[str, str]
    custom_ops: dict[str, str]
    tensor_subclasses: dict[str, str]
    device_ops: dict[str, list[str]]
    missing: dict[str, str]

    def lines(self) -> list[str]:
        """The needs in words, one a line (none: the file needs torch alone)."""
        out = [f"  pytree type {n}: {how}" for n, how in self.pytree_types.items()]
        out += [f"  custom op {n}: {how}" for n, how in self.custom_ops.items()]
        out += [f"  tensor subclass {n}: {how}" for n, how in self.tensor_subclasses.items()]
        out += [f"  device-specific op {n}: " + (f"kernels for {', '.join(d)} only" if d else
                                                  "no kernel on any device of this torch build")
                for n, d in self.device_ops.items()]
        return out


def _type_needs(serialized_methods, where: str) -> tuple[dict, dict]:
    from .reader import spec_texts

    names = set()
    for m, serialized in serialized_methods:
        names |= pytree_types.named_types(spec_texts(m, serialized), where)
    found, missing = {}, {}
    unfindable = set(pytree_types.unfindable(names))  # (nothing imported: a load imports the library's module)
    for name in sorted(names):
        cls, library = pytree.SERIALIZED_TYPE_TO_PYTHON_TYPE.get(name), pytree_types.library_module(name)
        if name in unfindable:
            found[name] = missing[name] = f"not registered: {pytree_types.advice(name)}"
        elif library is not None:
            found[name] = f"registered by {library[1]} (pt2b imports it where {library[0]} is installed)"
        elif not name.startswith(_TORCHS_OWN):
            found[name] = f"registered by {cls.__module__}"
    return found, missing


def needs_to_load(art, serialized: list | None = None) -> Needs:
    """The needs of the artifact ``art`` (reader.open_artifact), every method's (``serialized``: (method's
    artifact, its decoded program) of each, where the caller has them: reader.check's; else decoded here);
    imports nothing (a well-known library's output types are found by their module's source)."""
    from .reader import decode_graph, method, operator_records, text

    if serialized is None:
        serialized = [(m, decode_graph(m)) for m in (method(art, n) for n in art.method_names)]
    types, missing = _type_needs(serialized, os.fspath(art.path))
    custom, device = {}, {}
    for q, o, _, kind in operator_records(art):
        name = f"{q}.{o}" if o else q
        op = resolve_op(name)
        if kind == G.OperatorKind.CUSTOM:
            custom[name] = "registered"
            if op is None:
                custom[name] = missing[name] = ("not registered: import the library that defines it first "
                                                "(pt2b --import MODULE ...)")
        elif op is not None:
            devices = kernel_devices(op)
            if devices is not None and "cpu" not in devices:
                device[name] = devices
    subclasses = {}
    for r in art.program.tensorSubclasses or []:
        cls_name = text(r.className) if r.className is not None else ""
        if not cls_name or cls_name in subclasses:
            continue
        if tensor_subclasses.class_named(cls_name) is not None:
            subclasses[cls_name] = "registered"
        else:
            subclasses[cls_name] = missing[cls_name] = ("not registered: exporter.register_tensor_subclass(cls) "
                                                        "(or import the library that registers it) first")
    return Needs(types, custom, subclasses, device, missing)
