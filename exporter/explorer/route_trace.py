"""Record, during one real lowering, which ops each decomposition emits: the routes (decomposition
trees) of every call site of a program, exact for any table the opset explorer can choose. Why they
are exact: docs/explorer.md#how-the-page-knows."""

from __future__ import annotations

import dataclasses

import torch
from torch.fx.experimental.proxy_tensor import get_proxy_mode

from ..functionalize import forced_ops
from ..mutation import may_mutate
from ..lowering import tables
from ..lowering.decompose import flag_free
from ..lowering.engines import run_decompositions
from ..graph_walk import op_nodes
from ..lowering.opset_check import INFRASTRUCTURE, is_infrastructure
from ..ops import op_name
from .._torch.custom_kernels import composite_kernel
from ..lowering.plan import is_custom


def _has_cia(name: str) -> bool:
    """Whether op ``name`` has a CompositeImplicitAutograd kernel (torch decomposes it natively)."""
    base = name[: -len(".default")] if name.endswith(".default") else name
    return torch._C._dispatch_has_kernel_for_dispatch_key(base, "CompositeImplicitAutograd")


@dataclasses.dataclass
class _Node:
    op: str
    decomposed: bool = False
    children: list = dataclasses.field(default_factory=list)
    emitted: list = dataclasses.field(default_factory=list)  # fx nodes a leaf call created

    def as_tree(self) -> dict:
        return {"op": self.op, "children": [c.as_tree() for c in self.children]} if self.decomposed \
            else {"op": self.op}


class _Recorder:
    """The state of one recording: the wrapper stack, the fx nodes already attributed, the roots."""

    def __init__(self):
        self.roots: list[_Node] = []
        self.active: list[_Node] = []
        self.claimed: set[int] = set()
        self.final_graphs: set[int] = set()

    def wrap(self, op, fn):
        name = op_name(op)

        def decomposition(*args, **kwargs):
            mode = get_proxy_mode()
            if mode is None:
                return fn(*args, **kwargs)  # a pre-pass outside the traced graph
            node = _Node(name, decomposed=True)
            (self.active[-1].children if self.active else self.roots).append(node)
            graph = mode.tracer.graph
            mark = graph._root.prev  # the last node before this call
            self.active.append(node)
            try:
                return fn(*args, **kwargs)
            finally:
                self.active.pop()
                self._claim(node, graph, mark)

        return decomposition

    def _claim(self, node: _Node, graph, mark) -> None:
        """The ops this decomposition emitted itself: the graph's nodes since ``mark`` that no
        decomposition it called has claimed (what an op decomposed without a table entry emits,
        such as reshape's view, counts as its caller's)."""
        n = mark.next
        while n is not graph._root:
            if id(n) not in self.claimed:
                self.claimed.add(id(n))
                if n.op == "call_function" and isinstance(n.target, torch._ops.OpOverload) \
                        and n.target.namespace != "prim":
                    node.children.append(_Node(op_name(n.target), emitted=[n]))
            n = n.next

    def dead(self, node: _Node) -> bool:
        if node.decomposed:
            return bool(node.children) and all(self.dead(c) for c in node.children)
        return bool(node.emitted) and all(n._erased or id(n.graph) not in self.final_graphs for n in node.emitted)

    def prune(self, node: _Node) -> _Node:
        node.children = [self.prune(c) for c in node.children if not self.dead(c)]
        return node


@dataclasses.dataclass
class ProgramRoutes:
    trees: list[dict]      # one decomposition tree per decomposable call site ({"op", "children"?})
    leaves: list[str]      # ops the program calls that no decomposition touches
    unlowered: list[str]   # the op set of the program functionalized only (what `none` gives)
    functional: bool       # no mutation: `none` returns the program untouched


def record(ep: torch.export.ExportedProgram) -> ProgramRoutes:
    """The routes of every call site of ``ep`` (an undecomposed program)."""

    available = dict(tables.available_decompositions())
    for op, fn in tables.pt2b_decompositions().items():  # (what an op-list lowering adds to torch's)
        available.setdefault(op, fn)
    # a custom op's own kernel, which an op-list lowering inlines (LoweringPlan.with_kernels_for)
    kernels = kernels_of(ep)
    available.update(kernels)
    rec = _Recorder()
    forced = forced_ops()  # decomposed whatever the table says: what they emit is their caller's
    # (whole: the recorder follows every call of each decomposition into the one traced graph; the
    # node-local lowering traces equal calls once and copies them)
    lowered = run_decompositions(ep, {op: rec.wrap(op, flag_free(op, fn)) for op, fn in available.items()
                                      if op not in forced}, local=False)
    rec.final_graphs = {id(m.graph) for m in lowered.graph_module.modules() if isinstance(m, torch.fx.GraphModule)}
    trees = [rec.prune(r).as_tree() for r in rec.roots if not rec.dead(r)]
    trees = [t for t in trees if t["op"] not in INFRASTRUCTURE]
    # (a kernel that does not trace on the program's values leaves its op: a leaf, as one without a kernel)
    names = {op_name(op) for op in available if op not in kernels} | ({op_name(op) for op in kernels}
                                                                      & {t["op"] for t in trees})
    # leaves: what the program calls after the decompositions every lowering applies (eval batch
    # norm -> _native_batch_norm_legit_no_training), functionalized; `none` returns that when the
    # program mutates and the program itself otherwise (functionalize.py)
    mutates = may_mutate(ep)
    functional = run_decompositions(ep, {}, local=False)

    def ops_of(program):
        return sorted({op_name(n.target) for n in op_nodes(program.graph_module) if not is_infrastructure(n.target)})

    unlowered = ops_of(functional if mutates else ep)
    leaves = sorted(o for o in set(ops_of(functional)) | set(unlowered)
                    if o not in names and not (o.startswith("aten::") and _has_cia(o)))
    return ProgramRoutes(trees, leaves, unlowered, not mutates)


def kernels_of(ep) -> dict:
    """The custom ops ``ep`` calls that have a kernel for every device, each with it as a decomposition."""
    out = {}
    for node in op_nodes(ep.graph_module):
        if is_custom(node.target) and node.target not in out and (kernel := composite_kernel(node.target)):
            out[node.target] = kernel
    return out


def walk(routes: ProgramRoutes, table, emit) -> None:
    """Each op the lowering with ``table`` (op names to decompose) leaves, from the routes alone, as
    ``emit(op, parent, aten_above)``: the decomposed op that emitted it and the nearest ATen op
    decomposed above it (None: the program calls it). The page's script (page.html) walks the same."""
    if not table:  # functionalization only
        for op in routes.unlowered:
            emit(op, None, None)
        return
    for op in routes.leaves:
        emit(op, None, None)

    def visit(tree, parent, above):
        if "children" in tree and tree["op"] in table:
            for c in tree["children"]:
                visit(c, tree["op"], tree["op"] if tree["op"].startswith("aten::") else above)
        elif tree["op"] not in INFRASTRUCTURE:
            emit(tree["op"], parent, above)

    for t in routes.trees:
        visit(t, None, None)


def evaluate(routes: ProgramRoutes, table) -> list[str]:
    """The op set after lowering with ``table`` (op names to decompose), from the routes alone."""
    out: set = set()
    walk(routes, table, lambda op, parent, above: out.add(op))
    return sorted(out)
