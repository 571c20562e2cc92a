"""Serialized names for torch.return_types (sort, topk, slogdet, ...): torch registers these named
tuples of tensors as pytree nodes without a serialized name, so a program returning one could not
be written (torch.export.save fails on it too). pt2b names each by its path, from torch's own list.

The names resolve only through torch's pytree registry, which this adds to (a registration declared in
exporter/_torch/patches.py): exactly the named-tuple
classes of torch.return_types (all_return_types and the private ones such as _lu_with_info, which
torch.lu returns), nothing a file names otherwise."""

from __future__ import annotations

import threading

_DONE = threading.Event()
_LOCK = threading.Lock()


def register() -> None:
    """Give every torch.return_types class without one a serialized pytree name (once a process)."""
    if _DONE.is_set():
        return
    with _LOCK:
        if _DONE.is_set():
            return
        import torch.return_types as return_types

        from ..._torch import patches

        patches.name_pytree_types({cls: f"torch.return_types.{cls.__name__}" for cls in _classes(return_types)})
        _DONE.set()


def _classes(return_types) -> list[type]:
    """The named-tuple classes torch.return_types defines (its all_return_types leaves out the private
    ones torch's own functions return, such as torch.lu's _lu_with_info)."""
    found = list(getattr(return_types, "all_return_types", []))
    for name in sorted(vars(return_types)):
        cls = getattr(return_types, name)
        if (isinstance(cls, type) and issubclass(cls, tuple) and cls.__module__ == "torch.return_types"
                and cls not in found):
            found.append(cls)
    return found
