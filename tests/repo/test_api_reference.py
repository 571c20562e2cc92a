"""The public Python API is typed (every parameter and return annotated, the annotations resolve,
py.typed shipped) and documented: docs/api.md is generated from the code's signatures and
docstrings (tools/api_reference.py) and must match them."""

import inspect
import pathlib
import sys
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
        else:
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
