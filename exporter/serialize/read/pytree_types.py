"""The Python types a file's pytree specs name (its inputs and outputs), and the only modules a file may make
pt2b import to register them: a well-known library's output-type module (LIBRARY_MODULES), where it is installed."""

from __future__ import annotations

import importlib
import importlib.util
import json
import re

from ..._torch.pytree import pytree
from . import untrusted

__all__ = ["LIBRARY_MODULES", "advice", "library_module", "named_types", "register_from_libraries", "unregistered"]

# Modules whose import registers their classes with torch's pytree under "<module>.<class>", the name a
# spec records: transformers' ModelOutput subclasses register themselves where they are defined (the
# shared outputs, and each model's own outputs in its modeling module). Nothing else a file names is
# imported: a file must never choose the code pt2b runs.
LIBRARY_MODULES = (
    ("transformers", re.compile(r"transformers\.modeling_outputs")),
    ("transformers", re.compile(r"transformers\.models\.[a-z0-9_]+\.modeling_[a-z0-9_]+")),
)


def named_types(specs, where: str) -> set[str]:
    """The serialized type names in ``specs`` (reader.spec_texts' (text, place, what) of the file ``where``:
    each through untrusted.check_treespec first; None and malformed ones skipped: treespec_loads refuses those)."""
    found = set()
    for spec, place, what in specs:
        if spec:
            untrusted.check_treespec(spec, f"{where}: {place}", what)
        try:
            stack = [json.loads(spec)[1]] if spec else []
        except (TypeError, ValueError, IndexError, KeyError):
            continue
        while stack:
            node = stack.pop()
            if not isinstance(node, dict):
                continue
            if isinstance(node.get("type"), str):
                found.add(node["type"])
            if isinstance(node.get("children_spec"), list):
                stack.extend(node["children_spec"])
    return found


def unregistered(names) -> list[str]:
    """The names no imported module registers with torch's pytree (what treespec_loads refuses)."""
    return sorted(n for n in names if n not in pytree.SERIALIZED_TYPE_TO_PYTHON_TYPE)


def library_module(name: str) -> tuple[str, str] | None:
    """(library, module) of LIBRARY_MODULES that defines the type ``name``, or None."""
    module = name.rpartition(".")[0]
    return next(((lib, module) for lib, pattern in LIBRARY_MODULES if pattern.fullmatch(module)), None)


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # (a parent package that is not installed)
        return False


def register_from_libraries(names) -> dict[str, str]:
    """Import the LIBRARY_MODULES module of each unregistered name in ``names`` whose library is installed;
    returns name -> the module imported for it, for the names it registered."""
    done = {}
    for name in unregistered(names):
        found = library_module(name)
        if found is None or not _installed(found[1]):
            continue
        try:
            importlib.import_module(found[1])
        except Exception:  # noqa: BLE001 -- the library's own failure: the type stays unregistered, advice() says it
            continue
        if name in pytree.SERIALIZED_TYPE_TO_PYTHON_TYPE:
            done[name] = found[1]
    return done


def advice(name: str) -> str:
    """What to do for an unregistered type ``name``."""
    found = library_module(name)
    if found is None:
        return ("import the library that defines it first (from the command line: pt2b --import MODULE ...); "
                "pt2b imports only a well-known library's output types by itself (transformers' model outputs)")
    lib, module = found
    if not _installed(lib):
        return f"install {lib} (pip install {lib}): pt2b imports {module} by itself where it is installed"
    if not _installed(module):
        return f"this {lib} release has no module {module}: use the {lib} release the file was written with"
    return (f"pt2b imported {module}, which does not register it: use the {lib} release the file was written "
            f"with (or import what registers the type first: pt2b --import MODULE ...)")
