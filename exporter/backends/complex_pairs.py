"""Complex arithmetic given to a backend as arithmetic on real pairs: every complex tensor the graph
computes becomes the real tensor ``view_as_real`` gives of it (one more trailing dim of 2: real and
imaginary parts), and every op on it the op on those pairs, so the backend sees no complex tensor
between the program's inputs and outputs. OpenVINO's converter holds complex tensors only between a
few ops of its own (no ``polar``, no ``cat`` or ``copy`` of one), and DeepSeek-V2's rotary embedding
multiplies the queries and keys, viewed as complex, by ``polar(1, freqs)``.

Each op is rewritten on its own: a view (complex_views.REAL_ARGS) is the same view of the pairs, the
same elements; ``mul`` of two complex tensors is ``(ar*br - ai*bi, ar*bi + ai*br)`` and ``polar(r, t)``
the pairs ``(r*cos t, r*sin t)``, the definitions, which torch's vectorized kernels may round in
another last bit. Where the graph does anything
else with a complex tensor, the program is handed over as it was (the backend says what it refuses)."""

from __future__ import annotations

import operator

import torch
import torch.fx

from .complex_views import REAL_ARGS, real_dim
from .program_copy import emitted, graph_copy, program_with

__all__ = ["PAIRED_OPS", "complex_as_real_pairs"]

aten = torch.ops.aten

_REAL_OF = {torch.complex64: torch.float32, torch.complex128: torch.float64, torch.complex32: torch.float16}


def _complex(x) -> bool:
    val = x.meta.get("val") if isinstance(x, torch.fx.Node) else None
    return isinstance(val, torch.Tensor) and val.is_complex()


class _Rewrite:
    """One graph's rewrite: ``pairs`` maps each complex node to the node of its real pairs."""

    def __init__(self, graph: torch.fx.Graph):
        self.graph, self.pairs, self.made = graph, {}, set()

    def emit(self, target, *args, **kwargs) -> torch.fx.Node:
        node = emitted(self.graph, target, *args, **kwargs)
        self.made.add(node)
        return node

    def parts(self, z: torch.fx.Node) -> tuple:
        p = self.pairs[z]
        return self.emit(aten.select.int, p, -1, 0), self.emit(aten.select.int, p, -1, 1)

    def pair_of(self, re, im) -> torch.fx.Node:
        return self.emit(aten.stack.default, [re, im], -1)

    def rewrite(self, node: torch.fx.Node):
        """The node standing for ``node``: its pairs' node where it is complex (recorded in ``pairs``),
        the node replacing it where it is real, ``False`` to drop it, or None where no rule applies."""
        t, a, kw = node.target, node.args, node.kwargs
        pairs = self.pairs
        if t is aten.view_as_complex.default:
            return a[0]
        if t is aten.view_as_real.default:
            return pairs[a[0]]
        if t is aten._assert_tensor_metadata.default and _complex(a[0]):
            return False  # (a check of the complex tensor's dtype: its pairs are real)
        if t is aten.polar.default:
            r, angle = a
            return self.pair_of(self.emit(aten.mul.Tensor, r, self.emit(aten.cos.default, angle)),
                                self.emit(aten.mul.Tensor, r, self.emit(aten.sin.default, angle)))
        if t is aten.complex.default:
            return self.pair_of(*a)
        if t in (aten.real.default, aten.imag.default):
            return self.emit(aten.select.int, pairs[a[0]], -1, 0 if t is aten.real.default else 1)
        if t is aten.mul.Tensor and not kw:
            x, y = a
            if _complex(x) and _complex(y):
                (xr, xi), (yr, yi) = self.parts(x), self.parts(y)
                mul, emit = aten.mul.Tensor, self.emit
                return self.pair_of(emit(aten.sub.Tensor, emit(mul, xr, yr), emit(mul, xi, yi)),
                                    emit(aten.add.Tensor, emit(mul, xr, yi), emit(mul, xi, yr)))
            z, other = (x, y) if _complex(x) else (y, x)
            if isinstance(other, torch.fx.Node):  # a real tensor scales both parts
                if not isinstance(other.meta.get("val"), torch.Tensor) or other.meta["val"].is_complex():
                    return None
                return self.emit(aten.mul.Tensor, pairs[z], self.emit(aten.unsqueeze.default, other, -1))
            if isinstance(other, (int, float)) and not isinstance(other, bool):
                return self.emit(aten.mul.Tensor, pairs[z], other)
            return None
        if t in (aten.add.Tensor, aten.sub.Tensor) and _complex(a[0]) and _complex(a[1]) and set(kw) <= {"alpha"}:
            alpha = kw.get("alpha", 1)
            if isinstance(alpha, complex):
                return None
            return self.emit(t, pairs[a[0]], pairs[a[1]], **kw)
        if t in REAL_ARGS and not kw and _complex(a[0]):
            args = REAL_ARGS[t](a, a[0].meta["val"].dim())
            return self.emit(t, pairs[a[0]], *args[1:])
        if t is aten.clone.default and _complex(a[0]):
            return self.emit(aten.clone.default, pairs[a[0]])
        if t is aten._to_copy.default and _complex(a[0]) and _complex(node) and set(kw) <= {"dtype", "device", "layout"}:
            return self.emit(aten._to_copy.default, pairs[a[0]], dtype=_REAL_OF[node.meta["val"].dtype])
        if t is aten.to.dtype and _complex(a[0]) and _complex(node) and not kw and len(a) == 2:
            return self.emit(aten.to.dtype, pairs[a[0]], _REAL_OF[node.meta["val"].dtype])
        if t is aten.copy.default and _complex(a[0]) and _complex(a[1]) and not kw:
            return self.emit(aten.copy.default, pairs[a[0]], pairs[a[1]])
        if t is aten.cat.default and all(_complex(x) for x in a[0]) and not kw:
            rank = a[0][0].meta["val"].dim()
            return self.emit(aten.cat.default, [pairs[x] for x in a[0]], real_dim(a[1] if len(a) > 1 else 0, rank))
        if t is aten.sym_size.int and _complex(a[0]):
            return self.emit(aten.sym_size.int, pairs[a[0]], real_dim(a[1], a[0].meta["val"].dim()))
        return None


# the ops that make or read complex tensors, each rewritten on real pairs (_Rewrite.rewrite): a backend
# without complex dtypes takes them through this rewrite
PAIRED_OPS = ("aten::view_as_complex.default", "aten::view_as_real.default", "aten::polar.default",
              "aten::complex.default", "aten::real.default", "aten::imag.default")


def _touches_complex(node: torch.fx.Node) -> bool:
    return _complex(node) or any(_complex(x) for x in node.all_input_nodes)


def complex_as_real_pairs(ep: torch.export.ExportedProgram) -> torch.export.ExportedProgram:
    """``ep`` with the complex tensors its graph computes held as real pairs (the module docstring);
    ``ep`` itself where it computes none, or where an op on one has no rule here (it is never changed).
    A complex input or output of the program stays complex at the graph's edge."""
    if not any(n.op == "call_function" and _touches_complex(n) for n in ep.graph.nodes):
        return ep
    gm = graph_copy(ep)
    graph = gm.graph
    rw = _Rewrite(graph)
    output = graph.output_node()
    named = [x.name for x in output.all_input_nodes]
    done = []
    for node in list(graph.nodes):
        if node.op == "placeholder" and _complex(node):
            with graph.inserting_after(node):
                rw.pairs[node] = rw.emit(aten.view_as_real.default, node)
            continue
        if node.op == "output":
            with graph.inserting_before(node):
                edge = {x: rw.emit(aten.view_as_complex.default, rw.pairs[x])
                        for x in node.all_input_nodes if _complex(x) and x in rw.pairs}
            node.args = torch.fx.node.map_arg(node.args, lambda x: edge.get(x, x))
            continue
        if node.op != "call_function" or not _touches_complex(node):
            continue
        if node.target is operator.getitem or any(_complex(x) and x not in rw.pairs for x in node.all_input_nodes):
            return ep
        with graph.inserting_before(node):
            new = rw.rewrite(node)
        if new is None:
            return ep
        if _complex(node):
            rw.pairs[node] = new
        elif new is not False:
            node.replace_all_uses_with(new)
        done.append(node)
    for node in reversed(done):
        if node.users:  # (only the nodes it replaced used it: none is left)
            return ep
        graph.erase_node(node)
    _keep_output_names(graph, output, named, rw.made)
    gm.recompile()
    return program_with(ep, gm)


def _keep_output_names(graph: torch.fx.Graph, output: torch.fx.Node, named: list, made: set) -> None:
    """Each of the graph's outputs named as before (the signature names them): a node made here that only
    the output reads takes its output's name, any other a ``clone`` of it under that name."""
    taken = {n.name for n in graph.nodes}
    swap = {}
    for x, name in zip(list(output.all_input_nodes), named):
        if x.name == name:
            continue
        if x in made and set(x.users) == {output} and name not in taken:
            x.name = name
        else:
            with graph.inserting_before(output):
                swap[x] = graph.call_function(aten.clone.default, (x,))
            swap[x].meta["val"] = x.meta["val"]
            swap[x].name = name
        taken.add(name)
    if swap:
        output.args = torch.fx.node.map_arg(output.args, lambda x: swap.get(x, x))
