"""Serialized names for torch.return_types (sort, topk, slogdet, ...): torch registers these named
tuples of tensors as pytree nodes without a serialized name, so a program returning one could not
be written (torch.export.save fails on it too). pt2b names each by its path, from torch's own list.

The names resolve only through torch's pytree registry, which this adds to: exactly the named-tuple
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
        import torch.utils._pytree as pytree

        missing = getattr(pytree, "NO_SERIALIZED_TYPE_NAME_FOUND", None)
        for cls in _classes(return_types):
            name = f"torch.return_types.{cls.__name__}"
            known = pytree.SUPPORTED_SERIALIZED_TYPES.get(cls)
            if cls not in pytree.SUPPORTED_NODES or name in pytree.SERIALIZED_TYPE_TO_PYTHON_TYPE or (
                    known is not None and known.serialized_type_name != missing):
                continue
            pytree.SUPPORTED_SERIALIZED_TYPES[cls] = pytree._SerializeNodeDef(cls, name, None, None)
            pytree.SERIALIZED_TYPE_TO_PYTHON_TYPE[name] = cls
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
