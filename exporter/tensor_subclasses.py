"""The registry of tensor subclasses a .pt2b may hold as weights: a class is written under the name it
was registered with, and a file's name is resolved only here (nothing is imported from a file)."""

from __future__ import annotations

import re
import threading

import torch

__all__ = ["register_tensor_subclass"]

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*")
_MAX_NAME = 256
MAX_NESTING = 8  # subclasses wrapping subclasses: deeper is refused on write and on read
_lock = threading.Lock()
_by_name: dict[str, type] = {}
_by_class: dict[type, str] = {}


def register_tensor_subclass(cls: type, name: str | None = None) -> type:
    """Let pt2b write and read weights of the tensor subclass ``cls`` (returns ``cls``, so it also works
    as a class decorator). A weight of such a class is stored as the inner tensors its
    ``__tensor_flatten__`` names, its flatten context (plain data: None, bools, numbers, strings,
    lists, tuples, dicts with string keys, dtypes, devices, sizes) and ``name``; loading rebuilds it
    with ``cls.__tensor_unflatten__``. ``name`` defaults to ``"<module>.<qualname>"``; give a stable
    one if the class may move. A file naming a class that the reading process did not register is
    refused with a MissingTensorSubclassError. Registering the same class under the same name twice
    is a no-op; a name or class already taken otherwise is a ValueError."""
    if not (isinstance(cls, type) and issubclass(cls, torch.Tensor)) or cls in (torch.Tensor, torch.nn.Parameter):
        raise TypeError(f"register_tensor_subclass takes a subclass of torch.Tensor, got {cls!r}")
    missing = [m for m in ("__tensor_flatten__", "__tensor_unflatten__") if not hasattr(cls, m)]
    if missing:
        raise TypeError(f"{cls.__qualname__} has no {' or '.join(missing)}: pt2b stores a tensor subclass as the "
                        f"inner tensors torch's wrapper-subclass protocol names (docs/format.md, tensor subclasses).")
    name = default_name(cls) if name is None else name
    if not (isinstance(name, str) and len(name) <= _MAX_NAME and _NAME.fullmatch(name)):
        raise ValueError(f"a tensor subclass's name is a dotted Python name of at most {_MAX_NAME} characters, "
                         f"got {name!r}")
    with _lock:
        if _by_name.get(name, cls) is not cls:
            raise ValueError(f"the name {name!r} is already registered for {_by_name[name].__qualname__}")
        if _by_class.get(cls, name) != name:
            raise ValueError(f"{cls.__qualname__} is already registered as {_by_class[cls]!r}")
        _by_name[name] = cls
        _by_class[cls] = name
    return cls


def is_subclass(t) -> bool:
    """Whether ``t`` is a tensor of a class other than torch.Tensor and torch.nn.Parameter."""
    return isinstance(t, torch.Tensor) and type(t) not in (torch.Tensor, torch.nn.Parameter)


def default_name(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def name_of(cls: type) -> str | None:
    """The name ``cls`` is registered under, or None."""
    return _by_class.get(cls)


def class_named(name: str) -> type | None:
    """The class registered under ``name``, or None."""
    return _by_name.get(name)


def unregister(cls: type) -> None:
    """Forget ``cls`` (tests that register a class for one case)."""
    with _lock:
        name = _by_class.pop(cls, None)
        if name is not None:
            _by_name.pop(name, None)
