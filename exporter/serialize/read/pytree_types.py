"""The Python types a file's pytree specs name (its inputs and outputs), and the only modules a file may make
pt2b import to register them: a well-known library's output-type module (LIBRARY_MODULES), where it is installed."""

from __future__ import annotations

import functools
import importlib
import importlib.util
import json
import os
import re

from ..._torch.pytree import pytree
from . import untrusted

__all__ = ["LIBRARY_MODULES", "advice", "library_module", "named_types", "register_from_libraries", "unfindable",
           "unregistered"]

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


def _installed(library: str) -> bool:
    """Whether the top-level package ``library`` is on the import path (found, not imported)."""
    try:
        return importlib.util.find_spec(library) is not None
    except (ImportError, ValueError):
        return False


def _source(module: str) -> str | None:
    """The source file of ``module`` (a dotted name) found without importing it or any package above it:
    importlib's find_spec of a dotted name imports its parents, and a library's top-level import
    (transformers') costs more than `pt2b verify` of a big file. None where it is not there."""
    top, *rest = module.split(".")
    try:
        spec = importlib.util.find_spec(top)  # (a top-level name: nothing is imported)
    except (ImportError, ValueError):
        return None
    for folder in (spec.submodule_search_locations or []) if spec is not None else []:
        path = os.path.join(folder, *rest) + ".py"
        if os.path.isfile(path):
            return path
    return None


@functools.lru_cache(maxsize=64)
def _classes_defined(path: str) -> frozenset[str]:
    """The names of the classes a module's source defines at its top level (read as text, not run)."""
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return frozenset(re.findall(r"^class\s+([A-Za-z_][A-Za-z_0-9]*)", f.read(), flags=re.MULTILINE))
    except OSError:
        return frozenset()


def _defined_by_library(name: str) -> bool:
    """Whether the LIBRARY_MODULES module ``name`` belongs to is installed and its source defines the class
    (what importing it registers), known without importing anything."""
    found = library_module(name)
    path = _source(found[1]) if found is not None else None
    return path is not None and name.rpartition(".")[2] in _classes_defined(path)


def unfindable(names) -> list[str]:
    """The names neither registered with torch's pytree now nor defined by an installed LIBRARY_MODULES
    module (which register_from_libraries imports where the program is built): what a load would refuse.
    Imports nothing."""
    return [n for n in unregistered(names) if not _defined_by_library(n)]


def register_from_libraries(names) -> dict[str, str]:
    """Import the LIBRARY_MODULES module of each unregistered name in ``names`` whose library is installed;
    returns name -> the module imported for it, for the names it registered."""
    done = {}
    for name in unregistered(names):
        found = library_module(name)
        if found is None or _source(found[1]) is None:
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
    path = _source(module)
    if path is None:
        return f"this {lib} release has no module {module}: use the {lib} release the file was written with"
    if name.rpartition(".")[2] not in _classes_defined(path):
        return (f"this {lib} release's {module} defines no class {name.rpartition('.')[2]}: use the {lib} release "
                f"the file was written with")
    return (f"pt2b imported {module}, which does not register it: use the {lib} release the file was written "
            f"with (or import what registers the type first: pt2b --import MODULE ...)")
