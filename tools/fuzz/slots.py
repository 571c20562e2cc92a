"""Every field of an object tree as (parent, key, value, path): the slots structured mutations
choose from (flatc object-API program tables, torch export-schema trees)."""

from __future__ import annotations

import dataclasses


def _is_fb(v) -> bool:
    return type(v).__name__.endswith("T") and type(v).__module__.endswith("pt2b_generated")


def fb_slots(root) -> list:
    """(parent, key, value, path) of every field of the FlatBuffers object tree, depth first."""
    out, stack = [], [(root, "program")]
    while stack:
        obj, path = stack.pop()
        for attr, v in vars(obj).items():
            p = f"{path}.{attr}"
            out.append((obj, attr, v, p))
            if _is_fb(v):
                stack.append((v, p))
            elif isinstance(v, list):
                for i, x in enumerate(v):
                    if _is_fb(x):
                        stack.append((x, f"{p}[{i}]"))
                    else:
                        out.append((v, i, x, f"{p}[{i}]"))
    return out


def schema_slots(root) -> list:
    """(parent, key, value, path) of every value of a torch export-schema tree; dict keys get
    key "<key>" with the dict as parent."""
    from torch._export.serde.union import _Union

    out, stack = [], [(root, "ep")]
    while stack:
        obj, path = stack.pop()
        if isinstance(obj, _Union):
            children = [(obj.type, obj.value)]
        elif dataclasses.is_dataclass(obj):
            children = [(f.name, getattr(obj, f.name)) for f in dataclasses.fields(obj)]
        elif isinstance(obj, list):
            children = list(enumerate(obj))
        elif isinstance(obj, dict):
            children = list(obj.items())
            for k in obj:
                out.append((obj, "<key>", k, f"{path}[{k!r}]<key>"))
        else:
            continue
        for k, v in children:
            p = f"{path}[{k}]" if isinstance(obj, (list, dict)) else f"{path}.{k}"
            out.append((obj, k, v, p))
            if isinstance(v, (list, dict, _Union)) or dataclasses.is_dataclass(v):
                stack.append((v, p))
    return out
