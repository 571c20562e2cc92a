"""torch.export's serializer and deserializer (torch._export.serde.serialize) and its verifiers
(torch._export.verifier), with public names for the private tables and helpers pt2b reads.
Importing it imports torch._dynamo: modules import it where they serialize or deserialize, never at
``import exporter`` (tests/repo/test_import_graph.py)."""

import contextlib
import logging
import threading

import torch
import torch._export.serde.serialize as _serialize
from torch._export.serde.serialize import (
    SCHEMA_VERSION,
    ST_DELIMITER,
    ExportedProgramDeserializer,
    ExportedProgramSerializer,
    GraphModuleDeserializer,
    GraphModuleSerializer,
    SerializeError,
    deserialize_device,
    serialize_range_constraints,
)
from torch._export.verifier import load_verifier

from .serde import Union as _Union
from .serde import make_union

SERIALIZE_TO_TORCH_DTYPE = _serialize._SERIALIZE_TO_TORCH_DTYPE
SERIALIZE_TO_TORCH_MEMORY_FORMAT = _serialize._SERIALIZE_TO_TORCH_MEMORY_FORMAT
SERIALIZE_TO_TORCH_LAYOUT = _serialize._SERIALIZE_TO_TORCH_LAYOUT
SYM_OPS = _serialize._SYM_OPS  # the Python functions torch's deserializer accepts for SymInt arithmetic
int_to_sympy_int = _serialize._int_to_sympy_int
bytes_to_dataclass = _serialize._bytes_to_dataclass  # json.loads, then the schema's dataclasses (nothing resolved)



@contextlib.contextmanager
def unprinted(gm: torch.fx.GraphModule):
    """Inside, ``gm`` and its graph submodules answer print_readable with "" where torch's serializer
    logger drops debug lines: its serialize_graph formats a whole graph's code as the argument of a
    log.debug call, evaluated whether or not the line is logged (a code generation per graph per save).
    The method is shadowed on each instance and the shadow removed on the way out."""
    if _serialize.log.isEnabledFor(logging.DEBUG):
        yield
        return
    shadowed = [m for m in gm.modules() if isinstance(m, torch.fx.GraphModule) and "print_readable" not in vars(m)]
    for m in shadowed:
        vars(m)["print_readable"] = _unprinted
    try:
        yield
    finally:
        for m in shadowed:
            vars(m).pop("print_readable", None)


def _unprinted(*args, **kwargs) -> str:
    return ""


_FAST_LOCK = threading.Lock()
_fast_depth = 0
_found: list = []  # the create found in place when the first thread entered fast_unions


def _fast_create(cls, **kwargs):
    """What _Union.create makes, through serde.make_union (torch's own checks its one argument and builds
    the dataclass, walking its fields twice)."""
    if len(kwargs) != 1:
        raise AssertionError(f"expected exactly 1 kwarg, got {len(kwargs)}")
    ((name, value),) = kwargs.items()
    return make_union(cls, name, value)


@contextlib.contextmanager
def fast_unions():
    """Inside, the union classes of torch's export schema are made by _fast_create (torch's serializer
    makes one per argument, size and stride); the ``create`` found is put back when the last of the
    threads inside leaves (tests/format/test_graph_packing.py: the serialized programs are equal)."""
    global _fast_depth
    with _FAST_LOCK:
        if _fast_depth == 0:
            _found[:] = [_Union.__dict__["create"]]
            _Union.create = classmethod(_fast_create)
        _fast_depth += 1
    try:
        yield
    finally:
        with _FAST_LOCK:
            _fast_depth -= 1
            if _fast_depth == 0:
                _Union.create = _found.pop()


__all__ = ["SCHEMA_VERSION", "ST_DELIMITER", "SERIALIZE_TO_TORCH_DTYPE", "SERIALIZE_TO_TORCH_LAYOUT",
           "SERIALIZE_TO_TORCH_MEMORY_FORMAT", "SYM_OPS", "bytes_to_dataclass", "ExportedProgramDeserializer",
           "ExportedProgramSerializer", "GraphModuleDeserializer", "GraphModuleSerializer", "SerializeError",
           "deserialize_device", "fast_unions", "int_to_sympy_int", "load_verifier", "serialize_range_constraints",
           "unprinted"]
