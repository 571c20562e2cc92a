"""The conversion tables transformers' exporters keep per backend (its ONNX translations, its OpenVINO
conversion extensions), read from the installed transformers: the one place that reads those private names.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib
import importlib.metadata
import inspect
from typing import Any

# backend -> (transformers' exporter module, the table's name in it)
TABLES = {
    "onnx": ("transformers.exporters.exporter_onnx", "_ONNX_TRANSLATION_TABLE"),
    "openvino": ("transformers.exporters.exporter_openvino", "_OV_CONVERSION_EXTENSIONS"),
}


@dataclasses.dataclass(frozen=True)
class LibraryTable:
    """A library's conversion table for one backend, as the library keeps it (``entries``: a dict of
    op -> onnxscript function for ONNX, a list of ConversionExtension for OpenVINO), the ops it converts
    ("transformers::grouped_mm_fallback.default"), the graph targets it converts that are no op (the
    SymInt builtins "<built-in function mod>"), and the library and version ("transformers5.24.0")."""

    entries: Any = ()
    ops: tuple[str, ...] = ()
    others: tuple[str, ...] = ()
    library: str = ""
    where: str = ""  # the table's home in the library, for a backend's ``source``

    def __bool__(self) -> bool:
        return bool(self.entries)


def transformers_table(backend: str) -> LibraryTable:
    """transformers' conversion table for ``backend`` ("onnx", "openvino"); empty where transformers is
    not installed, fails to import, or has no such table (the backend then works as it does without
    one). The tables are private names of transformers, read here only."""
    module_name, attr = TABLES[backend]
    try:  # only when a backend asks: importing transformers' exporters takes seconds
        module = importlib.import_module(module_name)
        version = importlib.metadata.version("transformers")
    # a transformers that is missing or broken leaves the backend as it is without it
    except Exception:  # noqa: BLE001
        return LibraryTable()
    entries = getattr(module, attr, None)
    if not entries:
        return LibraryTable()
    names = _extension_names(module, len(entries)) if backend == "openvino" else _key_names(entries)
    if names is None:
        return LibraryTable()
    ops = tuple(sorted(n for n in names if "::" in n))
    others = tuple(sorted(n for n in names if "::" not in n))
    return LibraryTable(entries, ops, others, f"transformers{version}", f"{module_name}.{attr}")


def _key_names(table: dict) -> list[str]:
    """The names of a translation table's keys: ops as pt2b names them, other targets by op_name
    ("operator.floordiv")."""
    from ..ops import op_name

    return [op_name(key) for key in table]


def _extension_names(module, count: int) -> list[str] | None:
    """The op names the module's ConversionExtension entries are made for: an extension object does not
    say which op it converts, so the names are read from the calls that make them in the module's
    source ("aten.index_add.default" as "aten::index_add.default"; "<built-in function mod>" as it is).
    An entry named by an expression ("str(torch.sym_float)") has no fixed name and is not listed. None
    where the source cannot be read or names more entries than the table holds (the table then says
    nothing pt2b can rely on)."""
    from ..ops import normalize_text

    try:
        tree = ast.parse(inspect.getsource(module))
    except (OSError, TypeError, SyntaxError):
        return None
    names = [call.args[0].value for call in ast.walk(tree)
             if isinstance(call, ast.Call) and getattr(call.func, "id", None) == "ConversionExtension"
             and call.args and isinstance(call.args[0], ast.Constant) and isinstance(call.args[0].value, str)]
    if len(names) > count:
        return None
    return [n if n.startswith("<") else normalize_text(n) for n in names]


# transformers' ONNX Runtime fusions: (module, function) taking (an onnx_ir Model, a provider) and fusing in place
ORT_FUSIONS = ("transformers.exporters.onnxruntime_fusions", "fuse_for_onnxruntime")


def transformers_ort_fusions():
    """transformers' fusions of an ONNX graph into ONNX Runtime's own ops (rotary embeddings,
    GroupQueryAttention over a cache, skip norms; onnxscript's fusions run among them), as a function
    ``fuse(model, provider)``; None where transformers is missing, fails to import or has no such
    function (the ONNX hand-off then fuses with onnxscript's alone)."""
    module_name, attr = ORT_FUSIONS
    try:
        module = importlib.import_module(module_name)
    # a transformers that is missing or broken leaves the fusions to onnxscript's own
    except Exception:  # noqa: BLE001
        return None
    fuse = getattr(module, attr, None)
    return fuse if callable(fuse) else None
