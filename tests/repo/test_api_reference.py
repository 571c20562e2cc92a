"""The public Python API is one list per package (``__all__``), typed (every parameter and return
annotated, the annotations resolve, py.typed shipped) and documented: docs/api.md is generated from
those lists (tools/api_reference.py) and names exactly them, and every name the docs teach is on it."""

import inspect
import pathlib
import re
import subprocess
import sys
import types
import typing

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]

from tools import api_reference  # noqa: E402


def _functions():
    for qualname, obj in api_reference.public_api():
        if inspect.isclass(obj):
            for name, member in api_reference.members(obj):
                fn = member.fget if isinstance(member, property) else member
                yield f"{qualname}.{name}", fn
        elif inspect.isfunction(obj):
            yield qualname, obj


def test_docs_api_md_is_generated_from_the_code():
    page = (ROOT / "docs" / "api.md").read_text()
    assert page == api_reference.render(), "docs/api.md is stale: run `python -m tools.api_reference > docs/api.md`"


@pytest.mark.parametrize("qualname, fn", list(_functions()), ids=lambda v: v if isinstance(v, str) else "")
def test_public_signature_is_annotated_and_resolves(qualname, fn):
    sig = inspect.signature(fn)
    missing = [p.name for p in sig.parameters.values()
               if p.name != "self" and p.annotation is inspect.Parameter.empty]
    assert not missing, f"{qualname}: parameters without annotation: {missing}"
    assert sig.return_annotation is not inspect.Signature.empty or fn.__name__ == "__init__", \
        f"{qualname}: no return annotation"
    hints = typing.get_type_hints(fn, vars(sys.modules[fn.__module__]), api_reference.type_namespace())
    assert set(hints) >= {p.name for p in sig.parameters.values() if p.name != "self"}
    if fn.__name__ != "__init__":
        assert inspect.getdoc(fn), f"{qualname}: no docstring"


def test_public_classes_are_documented():
    for qualname, obj in api_reference.public_api():
        if inspect.isclass(obj):
            assert obj.__doc__ and not obj.__doc__.startswith(obj.__name__ + "("), f"{qualname}: no docstring"


def test_an_unannotated_parameter_is_caught():
    def f(x, y: int) -> int:
        """doc"""
        return y

    with pytest.raises(AssertionError, match=r"parameters without annotation: \['x'\]"):
        test_public_signature_is_annotated_and_resolves("f", f)


def test_py_typed_is_shipped():
    assert (ROOT / "exporter" / "py.typed").exists() and (ROOT / "runtime_ref" / "py.typed").exists()
    assert '"py.typed"' in (ROOT / "pyproject.toml").read_text()


# ---- the public edge: api.md names exactly the packages' __all__, and the docs teach only those ----

def _public() -> dict[str, types.ModuleType]:
    """Public package name -> module (the tool's walk: the roots, and the modules their ``__all__`` name)."""
    return {package.__name__: package for package in api_reference.public_packages()}


def test_the_public_packages_are_found():
    assert set(_public()) == {"exporter", "exporter.errors", "exporter.backends", "exporter.sweep",
                             "runtime_ref"}


def _documented(page: str) -> set[str]:
    """The qualified names api.md gives an entry (``### `name...``` headings: functions, classes,
    modules, values)."""
    return set(re.findall(r"^### (?:class |module )?`([\w.]+)", page, re.M))


def test_api_md_documents_exactly_the_public_names():
    page = (ROOT / "docs" / "api.md").read_text()
    public = {f"{p}.{n}" for p, m in _public().items() for n in m.__all__}
    documented = _documented(page)
    assert documented == public, (f"in __all__, not in api.md: {sorted(public - documented)}; "
                                  f"in api.md, not in __all__: {sorted(documented - public)}")
    for module in ("exporter.errors", "exporter.backends"):  # documented as modules, their names below
        assert f"### module `{module}`" in page and f"## package `{module}`" in page


def test_the_documented_names_check_sees_a_missing_name():
    page = "### `exporter.load(path)`\n### class `exporter.Pt2bProgram`\n#### `ops(self)`\n### module `exporter.errors`\n"
    assert _documented(page) == {"exporter.load", "exporter.Pt2bProgram", "exporter.errors"}


def test_exporter_serves_only_its_public_names():
    """``exporter.X`` is a name of ``__all__`` (imported on first use) or an AttributeError: a
    submodule is reached by importing it."""
    code = ("import exporter\n"
            "for name in ('cli', 'api', 'lowering', 'no_such_name'):\n"
            "    try: getattr(exporter, name)\n"
            "    except AttributeError as e: print(name, 'AttributeError', 'public names are' in str(e))\n"
            "import exporter.cli\n"
            "print(exporter.cli.__name__)\n"
            "print(all(getattr(exporter, name) is not None for name in exporter.__all__))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=True,
                         cwd=ROOT).stdout.split("\n")
    assert out[:6] == ["cli AttributeError True", "api AttributeError True", "lowering AttributeError True",
                       "no_such_name AttributeError True", "exporter.cli", "True"], out
    import exporter

    assert set(exporter._LAZY) <= set(exporter.__all__)  # (nothing served that is not public)


_FENCE = re.compile(r"^```[^\n]*\n(.*?)^```", re.M | re.S)
_INLINE = re.compile(r"`([^`\n]+)`")
_FROM = re.compile(r"\bfrom\s+((?:exporter|runtime_ref)(?:\.\w+)*)\s+import\s+(\([^)]*\)|[\w ,]+(?:\\\n[\w ,]+)*)")
_IMPORT = re.compile(r"\bimport\s+((?:exporter|runtime_ref)(?:\.\w+)*)")
_DOTTED = re.compile(r"(?<![\w./-])((?:exporter|runtime_ref)(?:\.\w+)+)")


def _code(text: str) -> list[tuple[int, str]]:
    """(line number, code) of a markdown page's fenced blocks (each whole) and inline code spans."""
    out, fenced = [], set()
    for m in _FENCE.finditer(text):
        start = text.count("\n", 0, m.start()) + 2
        out.append((start, m.group(1)))
        fenced.update(range(start - 1, start + m.group(1).count("\n") + 1))
    for k, line in enumerate(text.split("\n"), 1):
        if k not in fenced:
            out += [(k, span) for span in _INLINE.findall(line)]
    return out


def _resolve(dotted: str, public: dict) -> str | None:
    """None when ``dotted`` (``exporter.errors.OpsetError``, ``runtime_ref.Runtime.ops``) is a public
    name (or an attribute of a public class), else what is wrong with it."""
    parts = dotted.split(".")
    package, obj = parts[0], public[parts[0]]
    for k, part in enumerate(parts[1:], 1):
        if package is not None:
            if part not in public[package].__all__:
                return f"{part!r} is not in {package}.__all__"
            obj = getattr(public[package], part)
            package = obj.__name__ if isinstance(obj, types.ModuleType) and obj.__name__ in public else None
        elif inspect.isclass(obj):
            if not hasattr(obj, part):
                return f"{'.'.join(parts[:k])} has no attribute {part!r}"
            obj = getattr(obj, part)
        else:
            break  # (a call's result or a value: what follows is not a name of ours)
    return None


def wrong_names(text: str, public: dict) -> list[str]:
    """Every name of exporter or runtime_ref a markdown page teaches (``exporter.X``, ``from exporter...
    import X``, ``import exporter.X``, ``M.X`` after ``from exporter import M``, in its code blocks and
    inline code) that is not public, as "line N: name (why)"."""
    def blank(m):  # a statement read, blanked out with its line breaks kept
        return re.sub(r"[^\n]", " ", m.group(0))

    out = []
    for first, code in _code(text):
        taught, modules = [], {}  # (offset in code, name); short name -> public module it stands for
        for m in _FROM.finditer(code):
            for alias in re.split(r"[,\s()\\]+", m.group(2).replace(" as ", "@")):
                name, _, short = alias.partition("@")
                if name:
                    taught.append((m.start(), f"{m.group(1)}.{name}"))
                    modules[short or name] = f"{m.group(1)}.{name}"
        code = _FROM.sub(blank, code)
        taught += [(m.start(), m.group(1)) for m in _IMPORT.finditer(code)]
        code = _IMPORT.sub(blank, code)
        taught += [(m.start(), m.group(1)) for m in _DOTTED.finditer(code)]
        for short, full in modules.items():
            taught += [(m.start(), f"{full}.{m.group(1)}") for m in re.finditer(rf"(?<![\w.]){short}\.(\w+)", code)]
        for at, name in sorted(taught):
            why = _resolve(name, public)
            if why:
                out.append(f"line {first + code.count(chr(10), 0, at)}: {name} ({why})")
    return out


def _pages() -> list[pathlib.Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def test_every_name_the_docs_teach_is_public():
    public = _public()
    wrong = [f"{page.relative_to(ROOT)} {w}" for page in _pages() for w in wrong_names(page.read_text(), public)]
    assert not wrong, "\n".join(wrong)
    assert any("to_backend" in page.read_text() for page in _pages())  # (the scan reads the pages)


def test_the_docs_scan_finds_a_planted_wrong_name():
    page = """Use `exporter.load` and `exporter.errors.OpsetError`, `runtime_ref.Runtime.ops`.

```python
from exporter import backends, load_for_backend
from exporter.errors import (OpsetError,
                             NoSuchError)
from exporter.lowering.lowered import LoweredProgram
import exporter.cli
lp = load_for_backend("m.pt2b")
backends.to_backend("onnx", lp)
backends.hand_over("onnx", lp)
```

Not a name: `exporter/lowering/validate.py`; wrong: `exporter.lowered_program`, `runtime_ref.Runtime.no_such`.
"""
    assert wrong_names(page, _public()) == [
        "line 5: exporter.errors.NoSuchError ('NoSuchError' is not in exporter.errors.__all__)",
        "line 7: exporter.lowering.lowered.LoweredProgram ('lowering' is not in exporter.__all__)",
        "line 8: exporter.cli ('cli' is not in exporter.__all__)",
        "line 11: exporter.backends.hand_over ('hand_over' is not in exporter.backends.__all__)",
        "line 14: exporter.lowered_program ('lowered_program' is not in exporter.__all__)",
        "line 14: runtime_ref.Runtime.no_such (runtime_ref.Runtime has no attribute 'no_such')",
    ]
