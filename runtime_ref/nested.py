"""Nested arguments: values inside lists, tuples and dicts, as node arguments and the plan's
templates nest them (anything else is a leaf): a function mapped over the leaves, and the leaves."""

from __future__ import annotations

from collections.abc import Callable, Iterator

__all__ = ["map_leaves", "leaves", "any_leaf"]


def map_leaves(fn: Callable, x):
    """``x`` with ``fn`` applied to every leaf; lists stay lists, tuples tuples, dicts dicts."""
    if isinstance(x, (list, tuple)):
        items = [map_leaves(fn, i) for i in x]
        return items if isinstance(x, list) else tuple(items)
    if isinstance(x, dict):
        return {k: map_leaves(fn, v) for k, v in x.items()}
    return fn(x)


def leaves(x) -> Iterator:
    """The leaves of ``x``, in order."""
    if isinstance(x, (list, tuple)):
        for i in x:
            yield from leaves(i)
    elif isinstance(x, dict):
        for v in x.values():
            yield from leaves(v)
    else:
        yield x


def any_leaf(test: Callable, x) -> bool:
    """Whether ``test`` holds for a leaf of ``x`` (asked in order, up to the first that passes)."""
    return any(test(leaf) for leaf in leaves(x))
