"""One home for the names a program carries: which module/parameter/buffer paths and argument names pt2b
accepts (whatever nn.Module and Python accept), and the reversible safe aliases
(``_pt2b_x<hex>``) that replace a path component where torch would paste it into generated Python
code unsafely. Why: docs/untrusted.md#every-name-from-the-file-that-becomes-a-python-object."""

from __future__ import annotations

import functools
import keyword
import re
import unicodedata

import torch

MAX_PATH_LEN = 1 << 16  # a state or module path longer than this is refused (no model has one)
_ALIAS = re.compile(r"_pt2b_x((?:[0-9a-f]{2})+)")
# attributes of the modules torch's unlifting builds and assigns, which a state path must not hit
_OWNED_BY_TORCH = frozenset({"self", "_guards_fn", "_in_spec", "_out_spec", "_graph_signature"})


@functools.cache
def _reserved() -> frozenset[str]:
    gm = torch.fx.GraphModule(torch.nn.Module(), torch.fx.Graph())
    return frozenset(dir(gm)) | frozenset(dir(torch.nn.Module())) | _OWNED_BY_TORCH


def path_ok(path) -> bool:
    """A module/parameter/buffer/constant path as nn.Module builds them: components joined by
    '.', each non-empty (nn.Module refuses only '.' and the empty name); bounded in length."""
    return type(path) is str and 0 < len(path) <= MAX_PATH_LEN and "" not in path.split(".")


def identifier_ok(name) -> bool:
    """A name that Python source uses as a variable or argument (forward arguments, fx values)."""
    return type(name) is str and len(name) <= 1024 and _source_identifier(name) and not keyword.iskeyword(name)


def schema_argument_ok(name) -> bool:
    """A name an operator schema gives an argument: an identifier, Python keywords included
    (aten::uniform_'s `from`); never pasted into generated code as a keyword argument of Python."""
    return type(name) is str and len(name) <= 1024 and _source_identifier(name)


def _source_identifier(text: str) -> bool:
    """An identifier that Python source spells as written: the parser NFKC-normalizes identifiers,
    so `self.ª` in generated code would read attribute "a"."""
    return text.isidentifier() and unicodedata.normalize("NFKC", text) == text


def component_safe(comp: str) -> bool:
    """True when torch's code generation handles the path component ``comp`` as it is."""
    if comp in _reserved() or keyword.iskeyword(comp) or _ALIAS.fullmatch(comp):
        return False
    if comp.isidentifier():  # written as `self.comp` by torch's code generation
        return _source_identifier(comp)
    return not breaks_out(comp)


def breaks_out(comp: str) -> bool:
    """True when ``comp``, not an identifier, would break out of the string literal torch's code
    generation writes it into (``getattr(self, "comp")``): code injection, not merely a failed build."""
    return not comp.isidentifier() and not (comp.isprintable() and '"' not in comp and "\\" not in comp)


def alias(comp: str) -> str:
    """The in-memory name of a path component: itself when safe, else its reversible alias."""
    return comp if component_safe(comp) else "_pt2b_x" + comp.encode("utf-8", "surrogatepass").hex()


def safe_path(path: str) -> str:
    """``path`` with every unsafe component replaced by its alias."""
    if all(component_safe(c) for c in path.split(".")):
        return path
    return ".".join(alias(c) for c in path.split("."))


def _original(comp: str) -> str:
    m = _ALIAS.fullmatch(comp)
    if m is None:
        return comp
    try:
        text = bytes.fromhex(m.group(1)).decode("utf-8", "surrogatepass")
    except UnicodeDecodeError:
        return comp
    return text if not component_safe(text) and text else comp


def original_path(path: str) -> str:
    """The inverse of safe_path: every alias component back to the name it stands for."""
    if "_pt2b_x" not in path:
        return path
    return ".".join(_original(c) for c in path.split("."))


_STATE_FIELDS = ("parameter_name", "buffer_name", "tensor_constant_name", "custom_obj_name")


def rename_state_paths(serialized, rename) -> bool:
    """Apply ``rename`` (safe_path or original_path) to every state and module path of a program
    in torch's export schema (signature specs and module_call_graph), in place; True if any changed."""
    gm = serialized.graph_module
    changed = False
    for spec in (*gm.signature.input_specs, *gm.signature.output_specs):
        value = spec.value
        for field in _STATE_FIELDS:
            old = getattr(value, field, None)
            if type(old) is str and (new := rename(old)) != old:
                setattr(value, field, new)
                changed = True
    for entry in gm.module_call_graph:
        if entry.fqn and (new := rename(entry.fqn)) != entry.fqn:
            entry.fqn = new
            changed = True
    return changed


DEFAULT_METHOD = "forward"  # the name of a single-method artifact's method (format 1.2: Program.default_method)


def method_names_problem(found) -> str | None:
    """What is wrong with an artifact's method names, or None: they must be distinct Python identifiers
    (they name attributes, CLI choices and cache keys). The writer and the reader apply this one rule."""
    for name in found:
        if not isinstance(name, str) or not name.isidentifier() or keyword.iskeyword(name):
            return f"method name {str(name)[:80]!r} is not a Python identifier"
    if len(set(found)) != len(found):
        return f"method names repeat ({', '.join(found)[:200]})"
    return None
