"""Argument fetchers for planned steps: turn an argument template (slot references and baked-in
constants, possibly nested in lists/tuples/dicts) into a fast callable `slots -> value`."""

from __future__ import annotations

from operator import itemgetter

from .nested import any_leaf

__all__ = ["SlotRef", "has_slot", "slots_getter", "value_getter", "call_with_kwargs"]


class SlotRef(int):
    """An argument that reads slot number `int(self)` at run time."""

    __slots__ = ()

    def __repr__(self) -> str:
        return f"%{int(self)}"


def has_slot(template) -> bool:
    """Whether a template reads any slot (anywhere inside lists/tuples/dicts)."""
    return any_leaf(lambda t: type(t) is SlotRef, template)


def slots_getter(indices):
    """`slots -> sequence of slots[i] for i in indices`, done entirely in C (operator.itemgetter)."""
    indices = [int(i) for i in indices]
    if len(indices) == 0:
        return itemgetter(slice(0, 0))  # -> []
    if len(indices) == 1:
        return itemgetter(slice(indices[0], indices[0] + 1))  # -> [slots[i]]
    return itemgetter(*indices)  # -> (slots[i], slots[j], ...)


def _const(value):
    return lambda slots: value


def _sequence(template):
    kind = list if isinstance(template, list) else tuple
    if all(type(t) is SlotRef for t in template):
        get = slots_getter(template)
        return lambda slots: kind(get(slots))
    parts = [value_getter(t) for t in template]
    return lambda slots: kind([f(slots) for f in parts])


def _mapping(template):
    parts = [(k, value_getter(v)) for k, v in template.items()]
    return lambda slots: {k: f(slots) for k, f in parts}


def value_getter(template):
    """`slots -> value` for one argument template."""
    if type(template) is SlotRef:
        return itemgetter(int(template))
    if not has_slot(template):
        return _const(template)
    if isinstance(template, (list, tuple)):
        return _sequence(template)
    return _mapping(template)


def call_with_kwargs(fn):
    """Wrap fn so that a step can pass (args, kwargs) resolved together as two positionals."""
    return lambda args, kwargs: fn(*args, **kwargs)
