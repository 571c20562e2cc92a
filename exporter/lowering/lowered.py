"""LoweredProgram: what load_for_backend returns; the lowered ExportedProgram plus the answers
a backend author needs (ops to implement, why each op is there, what fell outside the opset)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from ..lazy import Lazy
from .lower import Lowering, lowering_record
from ..ops import normalize_text, op_name, resolve_op
from .._torch.custom_kernels import where_defined
from ..program import ProgramHandle
from . import routes, tables
from ..graph_walk import op_counts, op_nodes
from ..mutation import functional_variant
from .opset_check import route_lines

if TYPE_CHECKING:
    from ..ops import OpSpec
    from ..program import Pt2bProgram


class LoweredProgram(ProgramHandle):
    """What load_for_backend returns: the lowered program (callable; ``exported_program()``), the ops
    a backend must implement (``ops()``), why each op is there (``explain(op)``, ``report()``), and
    what fell outside the declared opset (``outside_opset``)."""

    def __init__(self, lowering: Lowering, *, source_ep, source=None, method: str = "forward",
                 methods: dict | None = None, dim_names: dict | None = None):
        """Built complete, once: ``lowering`` (lower.Lowering: the plan, the program or a Lazy building
        it for a cache entry, and what its stages found), the undecomposed
        program (``source_ep``: an ExportedProgram or a Lazy loading it; ``source``: the Pt2bProgram,
        or a Lazy), the method's name and every method by name (a dict its maker fills)."""
        built, plan = lowering.program, lowering.plan
        self._built = built if isinstance(built, Lazy) else Lazy.of(built)
        self._ops = lowering.ops
        self._source = source_ep  # an ExportedProgram, or a Lazy loading it on first use
        self._source_prog = source  # the Pt2bProgram it was lowered from (or a Lazy loading it)
        self._accepts = plan.accepts
        self.fingerprint = plan.fingerprint  # the request in full (None: a custom decomposition table)
        # what it was lowered for, as reports and records name it ("core@2.13", "onnx@0.7.2", "supported_ops")
        self.lowered_for = plan.label
        self.preset = plan.label if plan.preset is not None else None  # the preset and its release, or None
        self.backend = plan.backend  # the backend whose own op list it was lowered to ("onnx"), or None
        self.table = plan.table
        self._inlined = tuple(plan.inlined)  # custom ops given their own kernels as decompositions
        self.keep = plan.keep
        self.supported = plan.supported
        self.description = plan.description
        self.unknown_supported_ops = list(plan.unknown)  # names this torch lacks, left out
        self.outside_opset = dict(lowering.outside)  # op -> count of ops outside the declared opset (reported)
        self.fallback = plan.fallback  # "reference": outside_opset is left for it; to_backend's default fallback
        self.from_cache = lowering.from_cache  # True when load_for_backend took the result from the lowering cache
        self.reused = lowering.reused  # engines.Reused when repeated layers were lowered once
        self.validation = lowering.validation  # validate.Validation (None: not run)
        self.method = method
        self._methods = methods
        self.dim_names = dict(dim_names or {})
        self._complete = True

    def __setattr__(self, name: str, value) -> None:
        # a LoweredProgram is what its stages made: what it answers is fixed when it is built
        if not name.startswith("_") and self.__dict__.get("_complete"):
            raise AttributeError(f"LoweredProgram.{name} is set when the program is built, not after.")
        object.__setattr__(self, name, value)

    @property
    def _ep(self):
        return self._built.get()

    @property
    def source(self) -> Pt2bProgram | None:
        """The Pt2bProgram this was lowered from, when it was loaded from a file."""
        if isinstance(self._source_prog, Lazy):
            self._source_prog = self._source_prog.get()
        return self._source_prog

    @property
    def _source_ep(self):
        if isinstance(self._source, Lazy):
            self._source = self._source.get()
        return self._source

    def _label(self) -> str:
        return f"the program lowered for {self.lowered_for}"

    def lowering_record(self) -> dict[str, Any]:
        """What a .pt2b written from this program records about its lowering (format 1.1+)."""
        return lowering_record(self.lowered_for, self.fingerprint, self.outside_opset)

    def ops(self) -> dict[str, int]:
        """The op overloads the backend must implement, with their number of call sites."""
        if self._ops is not None and not self._built.done:
            return dict(self._ops)
        return op_counts(self._ep.graph_module)

    def report(self) -> str:
        """A text report: the preset, every op with its call sites, what fell outside the opset, and each
        runtime assertion with what becomes of it (lowering/assertions.py)."""
        lines = [f"lowered for {self.lowered_for}: {self.description}",
                 f"{len(self.ops())} distinct ops, {sum(self.ops().values())} call sites:"]
        if self.validation is not None:
            lines.insert(1, self.validation.describe())
        lines += [f"  {n:5d}  {name}" for name, n in self.ops().items()]
        unused = self.unused_keep()
        if unused:
            lines.append(f"keep names ops the program does not call ({len(unused)}): " + ", ".join(unused))
        if self.unknown_supported_ops:
            lines.append(f"supported_ops names this torch does not have, left out ({len(self.unknown_supported_ops)}): "
                         + ", ".join(self.unknown_supported_ops))
        inlined = self.inlined_custom_ops()
        if inlined:
            lines.append(f"custom ops the backend does not list, lowered through their own kernels ({len(inlined)}): "
                         + ", ".join(inlined))
        if self.outside_opset:
            lines.append(f"outside the declared opset ({len(self.outside_opset)})"
                         + (f", left for the {self.fallback} (fallback={self.fallback!r}):" if self.fallback else ":"))
            lines += [f"  {n:5d}  {name}  -- {self.explain(name).splitlines()[0]}"
                      for name, n in self.outside_opset.items()]
        from .assertions import ASSERTION_OPS, runtime_assertions

        if ASSERTION_OPS & set(self.ops()):  # (listing them builds the program: only where there are some)
            found = runtime_assertions(self._ep, self.backend)
            fates = {}
            for a in found:
                fates[a.fate] = fates.get(a.fate, 0) + 1
            lines.append(f"runtime assertions ({len(found)}): "
                         + ", ".join(f"{n} {fate}" for fate, n in fates.items()))
            lines += [f"  {a.describe()}" for a in found]
        return "\n".join(lines)

    def inlined_custom_ops(self) -> dict[str, str]:
        """The custom ops the backend does not list that were lowered through their own kernels: op ->
        where the kernel is written. A custom op whose kernel does not trace on the program's values
        (it decides its control flow from data) stays as it is, and is not named here."""
        held = self.ops()
        return {name: where_defined(resolve_op(name)) for name in self._inlined if name not in held}

    def unused_keep(self) -> list[str]:
        """The ops keep= names exactly that the undecomposed program never calls (nothing to keep); an
        in-place call counts as a call of its functional variant too (the op the lowering keeps for it)."""
        if self.keep is None or not self.keep.exact:
            return []
        called = set(op_counts(self._source_ep.graph_module))
        called |= {op_name(f) for n in op_nodes(self._source_ep.graph_module)
                   if isinstance(n.target, torch._ops.OpOverload) and (f := functional_variant(n.target)) is not None}
        return sorted(self.keep.exact - called)

    def explain(self, op: OpSpec) -> str:
        """Why ``op`` is in the result (supported, kept, no decomposition, ...) or how it was decomposed."""
        name = op if not isinstance(op, str) else normalize_text(op)
        name = name if isinstance(name, str) else op_name(name)
        if "." not in name.partition("::")[2]:
            name += ".default"
        result, source = self.ops(), op_counts(self._source_ep.graph_module)
        available = tables.available_names()
        if name in result:
            if self.keep is not None and name in self.keep:
                why = "kept: protected from decomposition by keep=[...]"
            elif self.validation is not None and name in self.validation.kept:
                why = f"kept: its decomposition failed validation ({self.validation.kept[name]})"
            elif self.supported is not None and name in self.supported:
                why = "supported by the backend (listed in supported_ops)"
            elif name in self._inlined:
                why = (f"a custom op {self.lowered_for} does not list: its own kernel ({where_defined(resolve_op(name))}) "
                       f"does not trace on this program's values (it decides its control flow from data), so the "
                       f"op stays as it is (keep= it to say so, or give a decomposition: decompositions={{op: fn}})")
            elif name in self.outside_opset:
                declined = name in available and self.table and available[name] in self.table
                why = (f"outside {self.lowered_for}'s declared opset: "
                       + ("its table decomposes it, but the decomposition declined these calls (it would "
                          "guard on a value known only at run time, or does not handle their inputs), "
                          "so the op stays" if declined else
                          "its table does not decompose it" if name in available else
                          "no decomposition exists for it"))
                if self.fallback:
                    why += f"; left for the {self.fallback}: to_backend(..., fallback={self.fallback!r}) runs it there"
            elif name not in available:
                why = "no decomposition exists for it in this torch, so it stays"
            else:
                why = f"in {self.lowered_for}'s opset: not decomposed"
            lines = [f"{name}: {why}"]
            if name not in source or source.get(name, 0) < result[name]:
                lines += ["  reached by:"] + ["    " + r for r in route_lines(
                    name, self._ep.graph_module, self._source_ep.graph_module, self.table, self._stop)]
            return "\n".join(lines)
        if name in source:
            node = next(n for n in op_nodes(self._source_ep.graph_module) if op_name(n.target) == name)
            tree = routes.tree_for_node(node, self.table, self._stop)
            how = (f"inlined for {self.lowered_for}, which does not list it: lowered through its own kernel "
                   f"({where_defined(resolve_op(name))}), " if name in self._inlined else "decomposed ")
            lines = [f"{name}: {how}(route traced at node {node.name}):"] + ["  " + line for line in routes.render(tree)]
            if self.validation is not None:
                lines.append("  " + self.validation.describe())
            return "\n".join(lines)
        return f"{name}: not used by this program"

    def _stop(self, op) -> bool:
        return op not in self.table

    def __repr__(self) -> str:
        extra = f", {len(self.outside_opset)} ops outside the opset" if self.outside_opset else ""
        return f"LoweredProgram({self.lowered_for}, {len(self.ops())} ops{extra})"
