"""The runtime's own state: parameters, buffers and lifted constants of a program, moved once to
the runtime's device (tied tensors stay tied; buffers the program mutates are copied, never shared
with the program; the methods of one artifact can share one state)."""

from __future__ import annotations

import torch
from torch.export.graph_signature import InputKind, OutputKind

__all__ = ["RuntimeState"]


def _lookup(ep: torch.export.ExportedProgram, spec):
    """The value an input spec refers to (persistent buffers and params live in the state_dict,
    non-persistent buffers, lifted constants and script objects in ep.constants)."""
    if spec.kind == InputKind.TOKEN:
        return torch.empty(0)
    if spec.target in ep.state_dict:
        return ep.state_dict[spec.target]
    return ep.constants[spec.target]


class RuntimeState:
    """Values for every non-user placeholder, keyed by placeholder name, on one device.

    ``shared`` (the runtimes of several methods of one artifact): qualified name -> value, filled by
    the first method that needs a value and used by the others, so they run over one set of state.
    Every buffer is then copied once (a method that only reads a buffer, such as a KV cache that
    another method fills, sees the other's writes), parameters are moved once."""

    def __init__(self, ep: torch.export.ExportedProgram, device: torch.device, shared: dict | None = None):
        sig = ep.graph_signature
        mutated = {s.target for s in sig.output_specs
                   if s.kind in (OutputKind.BUFFER_MUTATION, OutputKind.PARAMETER_MUTATION)}
        moved: dict[int, object] = {}
        self.by_placeholder: dict[str, object] = {}
        self.named: dict[str, torch.Tensor] = {}  # params and buffers by fully qualified name
        for spec in sig.input_specs:
            if spec.kind == InputKind.USER_INPUT:
                continue
            original = _lookup(ep, spec)
            value = None if shared is None else _same_kind(shared.get(spec.target), original)
            if value is None:
                copy = spec.target in mutated or (shared is not None and spec.kind == InputKind.BUFFER)
                value = self._move(original, device, moved, copy=copy)
                if shared is not None and spec.kind in (InputKind.PARAMETER, InputKind.BUFFER):
                    shared.setdefault(spec.target, value)
            self.by_placeholder[spec.arg.name] = value
            if spec.kind in (InputKind.PARAMETER, InputKind.BUFFER):
                self.named[spec.target] = value

    @staticmethod
    def _move(value, device, moved, copy: bool):
        """value on device as a plain tensor; requires_grad is kept because kernels choose their
        path by it (CPU LSTM/GRU take mkldnn only without grad), so results match eager bit for bit."""
        if not isinstance(value, torch.Tensor):
            return value
        key = id(value)
        if copy or key not in moved:
            moved_value = value.detach().to(device, copy=copy).requires_grad_(value.requires_grad)
            if copy:
                return moved_value
            moved[key] = moved_value
        return moved[key]


def _same_kind(value, original):
    """``value`` (another method's) when it can stand for ``original`` (same dtype and shape), else None."""
    if isinstance(value, torch.Tensor) and isinstance(original, torch.Tensor) and \
            value.dtype == original.dtype and value.shape == original.shape:
        return value
    return None
