"""Node metadata "nn_module_stack" that torch's export serializer cannot round-trip, made safe.

torch writes each node's module stack as "key,path,type" entries joined by ";" and splits them
back on "," and ";" outside brackets, so a module name holding one of ",;()[]" (nn.Module
accepts them) is written, then fails to load. When a program has such a name, pt2b
percent-escapes those characters (and "%") in every entry while torch serializes it, records
PROVENANCE_KEY in the artifact, and the reader unescapes every entry after torch deserializes.
"""

from __future__ import annotations

import contextlib
import re
import urllib.parse

import torch

PROVENANCE_KEY = "pt2b:nn_module_stack"
PROVENANCE_VALUE = "percent-escaped"
_FRAGILE = re.compile(r"[,;()\[\]]")
_SAFE = "".join(chr(c) for c in range(32, 127) if chr(c) not in "%,;()[]")


def _graphs(gm: torch.fx.GraphModule):
    for _, mod in gm.named_modules():
        if isinstance(mod, torch.fx.GraphModule):
            yield mod.graph


def _stacks(gm):
    for graph in _graphs(gm):
        for node in graph.nodes:
            stack = node.meta.get("nn_module_stack")
            if stack:
                yield node, stack


def _needs_escape(gm) -> bool:
    return any(_FRAGILE.search(k) or _FRAGILE.search(p) or _FRAGILE.search(t)
               for _, stack in _stacks(gm) for k, (p, t) in stack.items()
               if isinstance(p, str) and isinstance(t, str))


def _map(stack: dict, fn) -> dict:
    return {fn(k): (fn(p), fn(t)) for k, (p, t) in stack.items()}


def needs_escape(ep: torch.export.ExportedProgram) -> bool:
    """Whether a module stack of ``ep`` holds a name torch's metadata format cannot split."""
    return _needs_escape(ep.graph_module)


@contextlib.contextmanager
def escaped(ep: torch.export.ExportedProgram, force: bool = False):
    """While the block runs, ``ep``'s module stacks are escaped if any needs it or ``force`` (the
    methods of one artifact are escaped alike: the reader unescapes them all); yields whether; the
    program is restored afterwards, also on error."""
    if not (force or _needs_escape(ep.graph_module)):
        yield False
        return
    saved = list(_stacks(ep.graph_module))
    try:
        for node, stack in saved:
            node.meta["nn_module_stack"] = _map(stack, lambda s: urllib.parse.quote(s, safe=_SAFE))
        yield True
    finally:
        for node, stack in saved:
            node.meta["nn_module_stack"] = stack


def unescape(ep: torch.export.ExportedProgram) -> None:
    """Undo `escaped` on a program read from an artifact that records PROVENANCE_KEY."""
    for node, stack in list(_stacks(ep.graph_module)):
        node.meta["nn_module_stack"] = _map(stack, urllib.parse.unquote)
