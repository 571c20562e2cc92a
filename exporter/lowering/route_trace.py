"""Record, during one real lowering, which ops each decomposition emits: the routes (decomposition
trees) of every call site of a program, exact for any table the opset explorer can choose.

The program is lowered by torch's own run_decompositions with every available decomposition, each
wrapped to note its call; a dispatch mode pushed inside each wrapper sees the ops that decomposition
calls. The result is one tree per call site that gets decomposed, and the ops the program calls that
have no decomposition. Evaluating those trees for a smaller table (an op not in it stays whole; its
children are not emitted) gives the same op set as lowering with that table (tests/test_explorer.py
checks this on the whole corpus), because:
- a decomposition emits the same ops whatever else the table holds (it is the same function on the
  same fake values);
- ops that torch decomposes natively whatever the table says (non-functional CompositeImplicit ops
  such as reshape or contiguous) never show up as tree nodes: what they emit is attributed to the caller;
- calls made outside the graph being traced (shape pre-passes, throwaway traces of control-flow
  bodies) and emitted nodes that dead-code elimination removes are pruned, so the trees hold only what
  reaches the lowered graph.
"""

from __future__ import annotations

import dataclasses
import operator

import torch
import torch.utils._pytree as pytree
from torch.fx.experimental.proxy_tensor import get_proxy_mode, get_proxy_slot
from torch.utils._python_dispatch import TorchDispatchMode

from ..ops import op_name
from . import tables
from .decompose import run_decompositions
from .graph_ops import op_nodes
from .verify import INFRASTRUCTURE, is_infrastructure


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
    """The state of one recording: the wrapper stack, the call in flight, the roots."""

    def __init__(self):
        self.roots: list[_Node] = []
        self.active: list[_Node] = []
        self.pending: list[_Node] = []
        self.final_graphs: set[int] = set()

    def wrap(self, op, fn):
        name = op_name(op)

        def decomposition(*args, **kwargs):
            if not self.active and get_proxy_mode() is None:
                return fn(*args, **kwargs)  # a pre-pass outside the traced graph
            parent = self.active[-1] if self.active else None
            call = self.pending[-1] if self.pending else None
            if (call is not None and parent is not None and parent.children and parent.children[-1] is call
                    and call.op == name and not call.decomposed):
                node = call  # the call the parent's dispatch mode saw is being decomposed
            else:  # reached without passing a dispatch mode (a CompositeImplicit op's py-kernel)
                node = _Node(name)
                (parent.children if parent is not None else self.roots).append(node)
            node.decomposed = True
            self.active.append(node)
            try:
                with _Calls(self, node):
                    return fn(*args, **kwargs)
            finally:
                self.active.pop()

        return decomposition

    def dead(self, node: _Node) -> bool:
        if node.decomposed:
            return bool(node.children) and all(self.dead(c) for c in node.children)
        return bool(node.emitted) and all(n._erased or id(n.graph) not in self.final_graphs for n in node.emitted)

    def prune(self, node: _Node) -> _Node:
        node.children = [self.prune(c) for c in node.children
                         if (c.decomposed or not _has_cia(c.op)) and not self.dead(c)]
        return node


class _Calls(TorchDispatchMode):
    """Inside one decomposition: every op it calls becomes a child; a leaf's emitted fx nodes are
    noted so that dead ones can be pruned."""

    def __init__(self, rec: _Recorder, node: _Node):
        super().__init__()
        self.rec, self.node = rec, node

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if not isinstance(func, torch._ops.OpOverload) or func.namespace == "prim":
            return func(*args, **kwargs)
        child = _Node(op_name(func))
        self.node.children.append(child)
        self.rec.pending.append(child)
        try:
            out = func(*args, **kwargs)
        finally:
            self.rec.pending.pop()
        if not child.decomposed:
            mode = get_proxy_mode()
            for leaf in pytree.tree_leaves(out):
                if mode is not None and isinstance(leaf, torch.Tensor):
                    try:
                        fx_node = get_proxy_slot(leaf, mode.tracer).proxy.node
                    except Exception:  # not a tensor of this trace (a functional wrapper): kept
                        continue
                    child.emitted.append(fx_node.args[0] if fx_node.target is operator.getitem else fx_node)
        return out


@dataclasses.dataclass
class ProgramRoutes:
    trees: list[dict]      # one decomposition tree per decomposable call site ({"op", "children"?})
    leaves: list[str]      # ops the program calls that no decomposition touches
    unlowered: list[str]   # the op set of the program functionalized only (what `none` gives)
    functional: bool       # no mutation: `none` returns the program untouched


def record(ep: torch.export.ExportedProgram) -> ProgramRoutes:
    """The routes of every call site of ``ep`` (an undecomposed program)."""
    from .graph_ops import may_mutate

    available = tables.available_decompositions()
    rec = _Recorder()
    lowered = run_decompositions(ep, {op: rec.wrap(op, fn) for op, fn in available.items()})
    rec.final_graphs = {id(m.graph) for m in lowered.graph_module.modules() if isinstance(m, torch.fx.GraphModule)}
    trees = [rec.prune(r).as_tree() for r in rec.roots if not rec.dead(r)]
    trees = [t for t in trees if t["op"] not in INFRASTRUCTURE]
    names = {op_name(op) for op in available}
    # leaves: what the program calls after torch's own CompositeImplicit decompositions (eval batch
    # norm -> _native_batch_norm_legit_no_training), functionalized; `none` returns that when the
    # program mutates and the program itself otherwise (functionalize.py)
    mutates = may_mutate(ep)
    functional = run_decompositions(ep, {})

    def ops_of(program):
        return sorted({op_name(n.target) for n in op_nodes(program.graph_module) if not is_infrastructure(n.target)})

    unlowered = ops_of(functional if mutates else ep)
    leaves = sorted(o for o in set(ops_of(functional)) | set(unlowered)
                    if o not in names and not (o.startswith("aten::") and _has_cia(o)))
    return ProgramRoutes(trees, leaves, unlowered, not mutates)


def evaluate(routes: ProgramRoutes, table) -> list[str]:
    """The op set after lowering with ``table`` (op names to decompose), from the routes alone.
    The page's script (exporter/lowering/page/explorer.js) implements the same walk."""
    if not table:  # functionalization only
        return list(routes.unlowered)
    out = set(routes.leaves)

    def visit(tree):
        if "children" in tree and tree["op"] in table:
            for c in tree["children"]:
                visit(c)
        elif tree["op"] not in INFRASTRUCTURE:
            out.add(tree["op"])

    for t in routes.trees:
        visit(t)
    return sorted(out)
