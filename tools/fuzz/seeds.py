"""Seed artifacts: small zoo models exported once, and what the mutators need to know about each
(header fields, sections, segment boundaries, small u32 words, the strings of its schema tree)."""

from __future__ import annotations

import os
import struct

from .layout import HEADER_FMT
from .schema_tree import graph_of
from .slots import schema_slots

DEFAULT_MODELS = ("mlp", "cnn_bn", "cond", "dynamic_shapes", "buffer_mutation")
METHODS_SUFFIX = "_methods"  # "<zoo case>_methods": the case written as two methods, "forward" and "again"
SEED_METHODS = ("forward", "again")


def seed_case(name: str):
    """(zoo case, the methods the seed artifact holds) of a seed name."""
    from tools.corpus.zoo import make_case

    base = name.removesuffix(METHODS_SUFFIX)
    return make_case(base), (SEED_METHODS if base != name else ("forward",))


def export_seeds(models, folder) -> dict[str, str]:
    """Export each zoo case in ``models`` to ``folder``/<name>.pt2b (a name ending in "_methods": the
    case as a multi-method artifact, both methods over the one model's weights); name -> path."""
    from exporter import export_model

    os.makedirs(folder, exist_ok=True)
    out = {}
    for name in models:
        path = os.path.join(folder, f"{name}.pt2b")
        if not os.path.exists(path):
            case, methods = seed_case(name)
            tmp = path + ".tmp.pt2b"
            if len(methods) == 1:
                export_model(case.model, case.args, tmp, kwargs=case.kwargs, dynamic_shapes=case.dynamic_shapes,
                             strict=case.strict)
            else:
                export_model({m: (case.model, case.args, case.kwargs) for m in methods}, tmp, strict=case.strict,
                             dynamic_shapes={m: case.dynamic_shapes for m in methods} if case.dynamic_shapes else None)
            os.replace(tmp, path)
        out[name] = path
    return out


class Seed:
    """A pristine artifact and everything the mutators need to know about its layout."""

    def __init__(self, name: str, data: bytes):
        from exporter.layout.generated import pt2b_generated as G

        self.name, self.data = name, data
        (_, self.major, self.minor, self.header_size, self.flags, self.d_off, self.d_size, self.p_off,
         self.p_size, _, _, self.alignment) = HEADER_FMT.unpack_from(data, 0)
        self.program = data[self.p_off:self.p_off + self.p_size]
        tree = G.ProgramT.InitFromPackedBuf(self.program, 0)
        self.segments = [(self.d_off + int(s.offset), int(s.nbytes)) for s in tree.segments or []]
        b = {"preamble end": 8, "header end": 64, "data start": self.d_off,
             "data end": self.d_off + self.d_size, "program start": self.p_off,
             "program end": self.p_off + self.p_size, "program middle": self.p_off + self.p_size // 2}
        for i, (off, n) in enumerate(self.segments):
            b[f"segment {i} start"] = off
            b[f"segment {i} end"] = off + n
        self.boundaries = sorted(b.items(), key=lambda kv: (kv[1], kv[0]))
        words = [(i, struct.unpack_from("<I", self.program, i)[0]) for i in range(0, self.p_size - 3, 4)]
        self.small_words = [i for i, v in words if 0 < v < 4096]
        self.strings = sorted(_collect_strings(self.schema_tree()))

    def program_tree(self):
        """A fresh object-API tree of the seed's program table (each mutation edits its own)."""
        from exporter.layout.generated import pt2b_generated as G

        return G.ProgramT.InitFromPackedBuf(self.program, 0)

    def schema_tree(self, tree=None):
        """torch's schema tree of ``tree`` (default: a fresh object-API tree of the seed's program)."""
        return graph_of(tree or self.program_tree())


def _collect_strings(root) -> set[str]:
    out = set()
    for _, _, v, _ in schema_slots(root):
        if isinstance(v, str) and len(v) < 200:
            out.add(v)
    return out
