"""One home for operator names: "aten::add.Tensor" <-> OpOverload, and matching ops against
user-given entries (overloads, packets, globs, namespaces)."""

from __future__ import annotations

import fnmatch
import re
from typing import Union

import torch

_OVERLOAD = torch._ops.OpOverload
_PACKET = torch._ops.OpOverloadPacket


def op_name(op: object) -> str:
    """Canonical name: "aten::add.Tensor" for overloads, "higher_order::cond" for HOPs,
    "operator.getitem" for Python callables."""
    if isinstance(op, _OVERLOAD):
        return f"{op._schema.name}.{op._overloadname}"
    if isinstance(op, torch._ops.HigherOrderOperator):
        return f"higher_order::{op.name()}"
    if isinstance(op, _PACKET):
        return op._qualified_op_name
    module = getattr(op, "__module__", None) or "?"
    module = "operator" if module == "_operator" else module
    return f"{module}.{getattr(op, '__qualname__', None) or getattr(op, '__name__', repr(op))}"


def normalize_text(entry: str, *, default_overload: bool = False) -> str:
    """"torch.ops.aten.add.Tensor" / "aten.add.Tensor" / "aten::add.Tensor" -> "aten::add.Tensor"; a
    bare namespace "aten" -> "aten::*". An overload-less name ("aten::relu") names every overload, as
    OpMatcher takes it; with ``default_overload`` it names the default one ("aten::relu.default"), as
    resolve_op and the reference runtime's opset take it."""
    s = entry.strip()
    s = s.removeprefix("torch.ops.")
    if "::" not in s:
        ns, _, rest = s.partition(".")
        s = f"{ns}::{rest}" if rest else f"{ns}::*"
    if default_overload and "." not in s.split("::", 1)[1]:
        s = f"{s}.default"
    return s


OpSpec = Union[str, torch._ops.OpOverload, torch._ops.OpOverloadPacket, torch._ops.HigherOrderOperator]
"""How the API takes an op: an OpOverload, a packet (every overload), or a name such as "aten::add.Tensor",
"aten.add" or a glob "aten::*pool*"."""

MAX_NAME = 1024  # longer operator names are not looked up at all


def registered_overload(ns: str, name: str, overload: str = "default"):
    """The OpOverload ``ns::name.overload`` if the running torch's operator registry holds it,
    else None. The registry is asked first, so no text (from a file, say) ever reaches an attribute
    of torch.ops that is not an operator (torch.ops.prim.name is a str, aten.__class__ a class)."""
    if not all(type(p) is str and 0 < len(p) <= MAX_NAME for p in (ns, name, overload)):
        return None
    try:
        torch._C._dispatch_find_schema_or_throw(f"{ns}::{name}", "" if overload == "default" else overload)
        packet = getattr(getattr(torch.ops, ns), name)
        op = getattr(packet, overload) if isinstance(packet, _PACKET) else None
    except (AttributeError, RuntimeError):
        return None
    if isinstance(op, _OVERLOAD) and op._schema.name == f"{ns}::{name}" and op._overloadname == overload:
        return op
    return None


def registered_hop(name: str):
    """The HigherOrderOperator torch registers as ``torch.ops.higher_order.<name>``, or None."""
    return torch._ops._higher_order_ops.get(name) if type(name) is str else None


_KNOWN_TARGETS: dict[str, object] = {}  # target text -> op; positives only (registrations only grow)


def op_of_target(target: str):
    """The operator a serialized node target names ("torch.ops.aten.add.Tensor",
    "torch.ops.higher_order.cond"), looked up in the registries; None when it names none."""
    op = _KNOWN_TARGETS.get(target)
    if op is not None or type(target) is not str or len(target) > 4 * MAX_NAME:
        return op
    parts = target.split(".")
    if parts[:2] != ["torch", "ops"]:
        return None
    if len(parts) == 4 and parts[2] == "higher_order":
        op = registered_hop(parts[3])
    elif len(parts) == 5:
        op = registered_overload(*parts[2:])
    if op is not None:
        _KNOWN_TARGETS[target] = op
    return op


def resolve_op(name: str):
    """The OpOverload for "aten::add.Tensor" (overload "default" if omitted), or None."""
    ns, _, rest = normalize_text(name, default_overload=True).partition("::")
    op, _, overload = rest.partition(".")
    return registered_overload(ns, op, overload or "default")  # ("aten::add." too)


class OpMatcher:
    """Matches ops against entries: OpOverload, OpOverloadPacket, "aten::add.Tensor",
    "aten.add" (every overload), "aten.add.*" / "aten::*pool*" (globs), "mylib::*" (namespace)."""

    def __init__(self, entries=()):
        self.exact: set[str] = set()
        self.patterns: list[re.Pattern] = []
        self.packets: set[str] = set()  # string entries naming every overload of an op ("aten::add")
        self.entries = list(entries)
        for e in self.entries:
            self.add(e)

    def add(self, entry) -> None:
        if isinstance(entry, _OVERLOAD):
            self.exact.add(op_name(entry))
        elif isinstance(entry, _PACKET):
            self.patterns.append(re.compile(re.escape(entry._qualified_op_name) + r"\..*"))
        elif isinstance(entry, str):
            text = normalize_text(entry)
            ns, _, rest = text.partition("::")
            if any(c in text for c in "*?["):
                self.patterns.append(re.compile(fnmatch.translate(text)))
            elif "." in rest:
                self.exact.add(text)
            else:  # a packet: every overload
                self.patterns.append(re.compile(re.escape(text) + r"\..*"))
                self.packets.add(text)
        elif isinstance(entry, torch._ops.HigherOrderOperator):
            self.exact.add(op_name(entry))
        else:
            raise TypeError(f"cannot match ops against {entry!r} ({type(entry).__name__})")

    def __contains__(self, op) -> bool:
        name = op if isinstance(op, str) else op_name(op)
        return name in self.exact or any(p.fullmatch(name) for p in self.patterns)

    @staticmethod
    def closest(name: str) -> str | None:
        """The registered op overload of ``name``'s namespace closest to it ("aten::linear.default" for
        "aten::linearr"), or None when none is close (difflib's ratio of 0.75 or more)."""
        import difflib

        namespace = name.partition("::")[0] + "::"
        names = [n for n in registered_op_names() if n.startswith(namespace)]
        wanted = name if "." in name.partition("::")[2] else f"{name}.default"
        close = difflib.get_close_matches(wanted, names, n=1, cutoff=0.75)
        return close[0] if close else None

    def unknown_entries(self) -> list[str]:
        """String entries that name no registered op or overload (likely typos): "aten::linearr",
        "aten::linear.defualt"."""
        exact = [n for n in self.exact if not n.startswith("higher_order::") and resolve_op(n) is None]
        packets = [n for n in self.packets if "::" in n and not n.startswith("higher_order::")]
        if packets:  # the dispatcher's op names ("aten::add.Tensor"), read once for every such entry
            registered = {n.partition(".")[0] for n in torch._C._dispatch_get_all_op_names()}
            packets = [n for n in packets if n not in registered]
        return sorted(exact + packets)


def registered_op_names() -> list[str]:
    """Every op overload the running torch's dispatcher registers, named as op_name names them
    ("aten::relu.default", "aten::add.Tensor"), sorted: what OpMatcher.closest offers, and what the
    explorer page embeds to tell a typo as OpMatcher.unknown_entries does."""
    return sorted(n if "." in n.partition("::")[2] else f"{n}.default" for n in torch._C._dispatch_get_all_op_names())
