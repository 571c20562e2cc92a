"""Lower a program node by node instead of retracing it whole: a call the table does not decompose is
copied with its recorded value, the decomposed calls are traced together and spliced in where they
stood, and writes in place become functional ops (_without_writes). ``lower_locally`` returns None
where this does not apply. Why and when: docs/lowering.md#only-the-decomposed-calls-are-traced."""
from __future__ import annotations

import operator

import torch

from ..._torch.pytree import pytree
from ...functionalize import (LOCK, functionalize_graph, insert_runtime_asserts, materialize_conj, program_fake_mode,
                              signature_of, trace_plain)
from ...mutation import functional_variant, is_mutating, returns_alias, updates_hidden_state
from . import functorch_regions
from .node_copy import copy_node

__all__ = ["lower_locally"]


_VALUE_KEYS = frozenset({"val", "tensor_meta", "example_value", "unbacked_bindings"})


# Ops that functionalization emits as another op (a lifted constant's copy becomes a clone).
_REWRITTEN = frozenset({torch.ops.aten.lift_fresh_copy.default, torch.ops.aten.lift_fresh.default})


def _pays_off(n_traced: int, n_inputs: int, n_calls: int) -> bool:
    """Whether tracing ``n_traced`` distinct calls on ``n_inputs`` values of the program is cheaper
    than retracing its ``n_calls`` calls: each traced call costs about two thirds of what a call of
    the whole retrace does (traced without functionalization: functionalize.trace_plain), each input
    of the trace about half a traced call (so 1.5, the inverse of two thirds, on the right). The weights
    come from timing both lowerings of vision models (docs/journal/code-notes.md)."""
    return n_traced + n_inputs / 2 < 1.5 * n_calls


class _Declined(Exception):
    """This program (or one of its calls) is not for the node-local lowering."""


def _eligible(ep, graph: torch.fx.Graph) -> bool:
    """Whether ``graph`` (``ep``'s, its grad-mode regions inlined) is for the node-local lowering."""
    from ..._torch.tracing import has_effects

    if functorch_regions.has_regions(ep.graph_module):
        return False
    for node in graph.nodes:
        if node.op == "get_attr":
            return False
        if node.op == "call_function":
            t = node.target
            if isinstance(t, torch._ops.OpOverload):
                if has_effects(t) or updates_hidden_state(node):
                    return False
            elif t not in _KEPT_CALLS and not _symbolic_arithmetic(node):
                return False
        for v in pytree.tree_leaves(node.meta.get("val")):
            if isinstance(v, torch.Tensor) and (v.is_conj() or v.is_neg() or v.is_sparse or v.is_quantized):
                return False
    return True


def _inline_grad_regions(gm: torch.fx.GraphModule) -> torch.fx.Graph:
    """``gm``'s graph with each ``wrap_with_set_grad_enabled(flag, body, *args)`` region written out
    as the whole retrace writes it: ``_set_grad_enabled(flag)``, the body's calls, then
    ``_set_grad_enabled(False)`` (the mode the retrace runs in, restored). A body that holds anything
    but calls (a nested region) leaves the graph as it is, and the lowering declines it."""
    region = torch.ops.higher_order.wrap_with_set_grad_enabled
    if not any(n.op == "call_function" and n.target is region for n in gm.graph.nodes):
        return gm.graph
    graph, env = torch.fx.Graph(), {}

    def switch(flag):
        graph.call_function(torch._C._set_grad_enabled, (flag,)).meta["val"] = None

    def inline(node) -> bool:
        flag, body, *args = node.args
        body = getattr(gm, body.target) if not node.kwargs else None
        if not isinstance(body, torch.fx.GraphModule) or any(
                n.op not in ("placeholder", "call_function", "output") for n in body.graph.nodes):
            return False
        inner = dict(zip((n for n in body.graph.nodes if n.op == "placeholder"),
                         (env[a] if isinstance(a, torch.fx.Node) else a for a in args)))
        switch(flag)
        for b in body.graph.nodes:
            if b.op == "output":
                env[node] = [inner[o] if isinstance(o, torch.fx.Node) else o for o in b.args[0]]
            elif b.op == "call_function":
                inner[b] = graph.node_copy(b, inner.__getitem__)
        switch(False)
        return True

    for node in gm.graph.nodes:
        if node.op == "get_attr" and node.users and all(u.target is region for u in node.users):
            continue  # (the body of a region, inlined below)
        if node.op == "call_function" and node.target is region:
            if not inline(node):
                return gm.graph
        elif node.op == "call_function" and node.target is operator.getitem and isinstance(env.get(node.args[0]), list):
            env[node] = env[node.args[0]][node.args[1]]
        else:
            env[node] = copy_node(graph, node, env.__getitem__)
    return graph


# Python calls copied as they are: a tuple element, and a grad-mode switch (no tensor in or out; the
# whole retrace records it where it stood, and a decomposition traces to the same ops in either mode)
_KEPT_CALLS = frozenset({operator.getitem, torch._C._set_grad_enabled})


def _symbolic_arithmetic(node) -> bool:
    """A call of a Python function on sizes (operator.mul, sym_ite, ...), not on tensors."""
    return callable(node.target) and not any(
        isinstance(x.meta.get("val"), torch.Tensor) for x in node.all_input_nodes) and not isinstance(
        node.meta.get("val"), torch.Tensor)


# ---- writes in place into a fresh value ----

_RESIZING = frozenset({torch.ops.aten.resize_.default, torch.ops.aten.resize_as_.default})
# Views a write through is made functional by the scatter functionalization emits for it
_SCATTER = {torch.ops.aten.slice.Tensor: torch.ops.aten.slice_scatter.default,
            torch.ops.aten.select.int: torch.ops.aten.select_scatter.default}


# Ops that return their input itself where the value they record has its dtype, device and layout
# (``x.to(torch.int64)`` on an int64 x): a write into their result writes into their input
_SELF_WHEN_ALIKE = frozenset({torch.ops.aten.to.dtype, torch.ops.aten.to.dtype_layout, torch.ops.aten.to.device,
                              torch.ops.aten.alias.default})


_DROPOUTS_IN_PLACE = frozenset(getattr(torch.ops.aten, name).default for name in (
    "dropout_", "feature_dropout_", "alpha_dropout_", "feature_alpha_dropout_"))


def _idle_dropout(node) -> bool:
    """An in-place dropout that writes nothing: ``train`` False or ``p`` 0 (ATen returns the input
    untouched, and the retrace records no node for it: ``nn.Dropout(inplace=True)`` in eval mode)."""
    if node.op != "call_function" or node.target not in _DROPOUTS_IN_PLACE:
        return False
    try:
        bound = node.target._schema.arguments
        values = dict(zip((a.name for a in bound), node.args)) | dict(node.kwargs)
    except (AttributeError, TypeError):
        return False
    return values.get("train") is False or values.get("p") in (0, 0.0)


def _without_idle_dropouts(graph: torch.fx.Graph) -> torch.fx.Graph:
    """``graph`` without its idle in-place dropouts (_idle_dropout), their readers reading the input:
    a copy where there are any, else ``graph`` itself."""
    idle = {n for n in graph.nodes if _idle_dropout(n)}
    if not idle:
        return graph
    new, env = torch.fx.Graph(), {}
    for n in graph.nodes:
        if n in idle:
            env[n] = env[n.args[0]]
        else:
            env[n] = copy_node(new, n, env.__getitem__)
    return new


def _returns_self(node) -> bool:
    """A call that returns its first argument itself: an alias, or a ``to`` that changes nothing
    (no copy=True, no memory format other than preserve, the recorded dtype, device and layout those
    of its input)."""
    if node.op != "call_function" or node.target not in _SELF_WHEN_ALIKE or not node.args or \
            not isinstance(node.args[0], torch.fx.Node):
        return False
    given = [*node.args[1:], *node.kwargs.values()]
    if any(a is True for a in given) or \
            any(isinstance(a, torch.memory_format) and a != torch.preserve_format for a in given):
        return False  # (copy=True, non_blocking=True, or another memory format)
    a, b = node.args[0].meta.get("val"), node.meta.get("val")
    return isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and \
        (a.dtype, a.device, a.layout) == (b.dtype, b.device, b.layout)


def _without_writes(graph: torch.fx.Graph, fake_mode_of, traced,
                    state: dict | None = None) -> tuple[torch.fx.Graph, set, list] | None:
    """``graph`` with each write in place into a value only the writes can see replaced by the
    functional op, the reads after it reading the result: what functionalization makes of it
    (``y = x @ w; y.add_(1)``). Aliasing is told by the ops' schemas, not by the recorded values (a
    program read back from a file has a storage per value): the written value must be made by an op
    returning a new tensor, and be read before the last write into it only by the writes and by ops
    returning new tensors. A decomposed op (``traced(node)``) may return its input where its schema
    promises a new tensor (an eval dropout, type_as), which only its decomposition shows: such calls
    are returned with the graph, for the lowering to check that their decomposition made a new tensor
    (_Lowering.check_fresh). A write through slices and selects (``q[..., :8] = a``, ``f[0][..., 1:6:3]
    = g``) becomes those views of the value as written so far, written by the functional op, and
    scattered back level by level (slice_scatter, select_scatter), as functionalization makes it; a
    slice or select of a written value (or what such a write returns) read after a write is remade
    from the value as written so far. The output of a call returning new tensors, copied untraced
    (``topk(x, k)[0]``), is written alike (_new_output). A write into a
    buffer or an input named in ``state`` ({placeholder name: (output kind, target)}, _writable) is
    made functional alike, its final value returned before the graph's outputs; a write through a
    ``to`` that changes nothing writes the value it returns itself (_returns_self). A write into a
    parameter or a constant, through any other view, or into a value viewed otherwise than by slices
    and selects before the write is left to the whole retrace (None). detach_ calls go (as in the
    retrace, functionalize._prepared).
    Returns (the graph, those calls of it, [(output kind, target)] of the returned writes)."""
    writes = [n for n in graph.nodes if n.op == "call_function" and is_mutating(n.target)]
    if not writes:
        return graph, set(), []
    state = state or {}
    position = {n: i for i, n in enumerate(graph.nodes)}
    selves: dict = {}  # a call returning its input itself (_returns_self) -> the value it returns
    for n in graph.nodes:
        if _returns_self(n):
            selves[n] = selves.get(n.args[0], n.args[0])
    root: dict = {}  # a write (or a call returning a written value itself) -> the value written into
    last_write: dict = {}  # that value -> the position of the last write into it
    through: dict = {}  # a write through slices and selects (f[0][..., 1:6:3] = g) -> them, outermost first
    for w in writes:
        target = w.args[0] if w.args else None
        if not isinstance(target, torch.fx.Node):
            return None
        chain = []
        while target.op == "call_function" and target.target in _SCATTER and isinstance(target.args[0], torch.fx.Node):
            chain.insert(0, target)
            target = target.args[0]
        if chain:
            through[w] = chain
        target = selves.get(target, target)
        root[w] = root.get(target, target)
        last_write[root[w]] = position[w]
    aliases = set()
    for a, base in selves.items():
        if root.get(base, base) in last_write:
            root[a] = root.get(base, base)
            aliases.add(a)
    # the slices and selects of a written value, (transitively): each read is re-made from the value
    # as written so far, as functionalization regenerates a view of a written base
    sliced: dict = {}  # view -> (the written value, [its slices and selects, outermost first])
    for n in graph.nodes:
        if n.op == "call_function" and n.target in _SCATTER and n.args and isinstance(n.args[0], torch.fx.Node):
            base = n.args[0]
            if base in sliced:
                sliced[n] = (sliced[base][0], [*sliced[base][1], n])
            elif root.get(base, base) in last_write and base not in root:
                sliced[n] = (root.get(base, base), [n])
    for w, chain in through.items():  # what such a write returns is its view (of the value as written)
        sliced[w] = (root[w], chain)
    assumed: set = set()  # decomposed calls taken for ops returning a new tensor, checked after tracing
    for origin, last in last_write.items():
        if origin.op == "placeholder":
            if origin.name not in state:
                return None  # (a parameter, a constant: nothing to write back into)
        elif not _new_value(origin, traced):
            return None
        if traced(origin):
            assumed.add(origin)
        members = [origin, *(m for m in root if root[m] is origin), *(v for v in sliced if sliced[v][0] is origin)]
        for member in members:
            for user in member.users:
                if position[user] > last or (user in root and root[user] is origin) or user in sliced:
                    continue
                if _makes_new_tensor(user):
                    if traced(user):
                        assumed.add(user)
                    continue
                if not _may_return_alias_of(user, member):
                    continue  # (a view of another argument: mask.expand_as(scores))
                if user.op == "call_function" and user.target is not operator.getitem and not any(
                        isinstance(v, torch.Tensor) for v in pytree.tree_leaves(user.meta.get("val"))):
                    continue  # (a size, a check)
                return None  # a view (or an input of the output) of the value before it is written
    out = torch.fx.Graph()
    out._codegen = graph._codegen
    env: dict = {}
    latest: dict = {}  # a written value -> the functional result the reads after the writes so far read

    version: dict = {}  # a written value -> how many writes into it are made so far
    remade: dict = {}  # (a slice or select of a written value, that value's version) -> the view re-made

    def read(x):
        """What a read of ``x`` reads: the last write's result, where ``x`` is a written value or a
        write (what reads it after the last write reads the last write's result too); where ``x`` is
        a slice or select of a written value, that view of the value as written so far."""
        if x in sliced:
            origin, chain = sliced[x]
            if origin not in latest:
                return env[x]
            key = (x, version[origin])
            if key not in remade:
                remade[key] = viewed(latest[origin], chain)[-1]
            return remade[key]
        origin = root.get(x, x)
        return latest[origin] if origin in latest and position[x] <= last_write[origin] else env[x]

    def rest(v) -> tuple:
        """The arguments of the slice or select ``v`` after its input, as the new graph reads them (a
        symbolic bound is a node of the program: ``x[:n] = y`` with n = x.size(0))."""
        return pytree.tree_map_only(torch.fx.Node, read, (tuple(v.args[1:]), dict(v.kwargs)))

    def viewed(base, chain) -> list:
        """[base, then each slice or select of ``chain`` of it in turn]."""
        out_ = [base]
        for v in chain:
            args, kwargs = rest(v)
            out_.append(call(v.target, (out_[-1], *args), kwargs, v))
        return out_

    def written_into(origin, value) -> None:
        latest[origin] = value
        version[origin] = version.get(origin, 0) + 1

    def call(op, args, kwargs, like):
        """A new call of ``op`` with ``like``'s provenance, its value computed on its inputs' values."""
        new = out.call_function(op, args, kwargs)
        new.meta.update({k: v for k, v in like.meta.items() if k not in _VALUE_KEYS})
        vals = pytree.tree_map_only(torch.fx.Node, lambda x: x.meta.get("val"), (args, kwargs))
        with fake_mode_of():
            new.meta["val"] = op(*vals[0], **vals[1])
        return new

    def cast_back(value, like, node):
        """``value`` in the dtype of ``like`` (the tensor written in place): an in-place op writes its
        result into its input's dtype, where its functional form may promote (float32 += float64 adds in
        float64); functionalization's copy_ becomes this _to_copy."""
        dtype = like.meta["val"].dtype
        if value.meta["val"].dtype == dtype:
            return value
        return call(torch.ops.aten._to_copy.default, (value,), {"dtype": dtype, "layout": torch.strided}, node)

    for node in graph.nodes:
        if node in aliases:
            env[node] = read(node.args[0])  # (the value itself, as written so far)
            continue
        if node not in root:
            env[node] = copy_node(out, node, read)
            continue
        target = node.args[0]
        if node in through:  # the views of the value as written so far, written, scattered back into it
            chain, functional = through[node], functional_variant(node.target)
            if functional is None:
                return None
            try:
                args = pytree.tree_map_only(torch.fx.Node, read, (node.args[1:], dict(node.kwargs)))
                views = viewed(read(root[node]), chain)
                written = value = cast_back(call(functional, (views[-1], *args[0]), args[1], node), views[-1], node)
                for v, base in zip(reversed(chain), reversed(views[:-1])):
                    args, kwargs = rest(v)
                    value = call(_SCATTER[v.target], (base, value, *args), kwargs, node)
            except Exception:  # noqa: BLE001 -- the whole retrace decides
                return None
            written_into(root[node], value)
            env[node] = written
            continue
        if node.target is torch.ops.aten.detach_.default:
            env[node] = read(target)
            continue
        functional = functional_variant(node.target)
        if functional is None or node.target in _RESIZING or \
                not _same_layout(node.meta.get("val"), target.meta.get("val")):
            return None  # (a write of sizes, not values: functionalization makes another op of it)
        args = pytree.tree_map_only(torch.fx.Node, read, (node.args, dict(node.kwargs)))
        try:
            env[node] = cast_back(call(functional, *args, node), node, node)
        except Exception:  # noqa: BLE001 -- the whole retrace decides
            return None
        written_into(root[node], env[node])
    # an input or buffer written: its final value is an output before the program's own, as
    # functionalization returns it (BUFFER_MUTATION, USER_INPUT_MUTATION), in the order of the inputs
    written = [n for n in graph.nodes if n.op == "placeholder" and n in latest]
    if written:
        output = out.output_node()
        output.args = ((*(latest[n] for n in written), *output.args[0]),)
    return out, {env[c] for c in assumed}, [state[n.name] for n in written]


def _writable(ep) -> dict:
    """{placeholder name: (output kind, target)} of the inputs a write into is returned for: the
    buffers (BUFFER_MUTATION) and user inputs (USER_INPUT_MUTATION), as functionalization returns them."""
    from torch.export.graph_signature import InputKind, OutputKind

    kinds = {InputKind.BUFFER: OutputKind.BUFFER_MUTATION, InputKind.USER_INPUT: OutputKind.USER_INPUT_MUTATION}
    out = {}
    for spec in ep.graph_signature.input_specs:
        if spec.kind in kinds and hasattr(spec.arg, "name"):
            out[spec.arg.name] = (kinds[spec.kind], spec.target if spec.kind == InputKind.BUFFER else spec.arg.name)
    return out


def _may_return_alias_of(node, value) -> bool:
    """Whether ``node`` may return an alias of ``value``: its schema's returns share an alias set with
    a parameter ``value`` is passed in (True for anything but an op call)."""
    t = node.target
    if node.op != "call_function" or not isinstance(t, torch._ops.OpOverload):
        return True
    sets = {a for r in t._schema.returns if r.alias_info is not None for a in r.alias_info.before_set}
    for i, param in enumerate(t._schema.arguments):
        arg = node.args[i] if i < len(node.args) else node.kwargs.get(param.name)
        if param.alias_info is not None and set(param.alias_info.before_set) & sets and \
                any(a is value for a in pytree.tree_leaves(arg)):
            return True
    return False


def _makes_new_tensor(node) -> bool:
    """A call of an op whose schema returns one new tensor (no alias of an argument) and writes
    nothing."""
    t = node.target
    return node.op == "call_function" and isinstance(t, torch._ops.OpOverload) and \
        isinstance(node.meta.get("val"), torch.Tensor) and not returns_alias(t) and not is_mutating(t)


def _new_value(node, traced) -> bool:
    """Whether ``node`` makes a value nothing else sees, so a write into it can be made functional
    where it is: a call returning a new tensor, an output of a call returning new tensors, or what a
    decomposed contiguous or reshape copies."""
    return _makes_new_tensor(node) or _new_output(node, traced) or _copied_by_decomposition(node, traced)


def _new_output(node, traced) -> bool:
    """An output of a call whose schema returns new tensors (no alias of an argument) and writes
    nothing, copied untraced: ``topk(x, k)[0]``, which a mixture of experts normalizes in place. (A
    decomposed call's outputs are left to the whole retrace: its decomposition may return an input.)"""
    if node.op != "call_function" or node.target is not operator.getitem or not node.args:
        return False
    call = node.args[0]
    return isinstance(call, torch.fx.Node) and call.op == "call_function" and \
        isinstance(call.target, torch._ops.OpOverload) and not traced(call) and \
        isinstance(node.meta.get("val"), torch.Tensor) and isinstance(call.meta.get("val"), (tuple, list)) and \
        not returns_alias(call.target) and not is_mutating(call.target)


# Ops whose schema returns a view of their input but which copy where the layout asks for it
# (``x.permute(...).contiguous()``, a reshape of a slice): written into, they are assumed to copy,
# which _Lowering.check_fresh checks on their decomposition
_COPY_WHEN_RELAID = frozenset({torch.ops.aten.contiguous.default, torch.ops.aten.reshape.default})


def _copied_by_decomposition(node, traced) -> bool:
    """A decomposed contiguous or reshape (_COPY_WHEN_RELAID) of a value whose recorded layout it cannot
    view as it stands (not contiguous): its decomposition copies, which check_fresh checks."""
    if node.op != "call_function" or node.target not in _COPY_WHEN_RELAID or not traced(node) or \
            not node.args or not isinstance(node.args[0], torch.fx.Node):
        return False
    v, out = node.args[0].meta.get("val"), node.meta.get("val")
    if not (isinstance(v, torch.Tensor) and isinstance(out, torch.Tensor)) or v.is_contiguous():
        return False
    if node.target is torch.ops.aten.reshape.default:  # a reshape views where it can: only a static
        sizes, strides, shape = list(v.shape), list(v.stride()), list(out.shape)  # layout no view takes copies
        if not all(type(x) is int for x in (*sizes, *strides, *shape)):
            return False  # (symbolic sizes)
        try:
            torch.empty_strided(sizes, strides, device="meta").view(shape)
        except RuntimeError:
            return True
        return False
    return True


def _same_layout(a, b) -> bool:
    """Tensors (or lists of them) laid out alike (functionalize.signature_of); other values of one type."""
    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
        return signature_of(a) == signature_of(b)
    if isinstance(a, (tuple, list)) and isinstance(b, (tuple, list)):
        return len(a) == len(b) and all(_same_layout(x, y) for x, y in zip(a, b))
    return type(a) is type(b) and (not isinstance(a, torch.Tensor))


# Ops that may place their result at an absolute storage offset, and the position of that argument
_PLACING = {torch.ops.aten.as_strided.default: 3, torch.ops.aten.as_strided_.default: 3,
            torch.ops.aten.as_strided_copy.default: 3, torch.ops.aten.as_strided_scatter.default: 4}


def _placed_on_input(node) -> bool:
    """A call of a traced graph placing its result at an absolute storage offset in a value of the
    program (a placeholder, or a view of one): a decomposition of slice, select or narrow into
    as_strided with the offset of the value it traced on. Right only where the offsets the program
    recorded are those at run time, which a program read back from a file (a storage per value,
    offset 0) does not promise; the whole retrace computes the offsets from the program's views. An
    as_strided without an offset (relative to its input's: adaptive_avg_pool2d's) or on a value the
    trace made is not."""
    at = _PLACING.get(node.target) if node.op == "call_function" else None
    if at is None:
        return False
    offset = node.args[at] if len(node.args) > at else node.kwargs.get("storage_offset")
    if offset is None:
        return False
    base = node.args[0]
    while isinstance(base, torch.fx.Node) and base.op == "call_function" and \
            isinstance(base.target, torch._ops.OpOverload) and returns_alias(base.target) and base.args:
        base = base.args[0]
    return isinstance(base, torch.fx.Node) and base.op == "placeholder"


class _Lowering:
    """One node-local lowering of ``ep`` with ``table``: ``prefetch()``, ``run()`` (the lowered graph),
    ``check_fresh()``; _Declined where the whole retrace must do it."""

    def __init__(self, ep, table: dict, graph: torch.fx.Graph):
        self.ep, self.table = ep, table
        self.graph = torch.fx.Graph()
        self.env: dict = {}  # source node -> new node (or a list of new nodes for a traced multi-output call)
        self.vals: dict = {}  # source node -> its value in the lowered program, where it differs from the recorded one
        self.memo: dict = {}  # call key -> its traced form (_trace_calls)
        self.traced = 0
        self.fake_mode = None
        cleared = _without_writes(graph, self.mode, self.traces, _writable(ep))
        if cleared is None:
            raise _Declined("a write in place that only functionalization can remove")
        self.source, self.assumed, self.mutations = cleared
        self.made: dict = {}  # a traced call -> the nodes its splice made

    def fresh(self, v):
        """A value of ``v``'s layout that aliases nothing (aot_export handles aliased inputs otherwise)."""
        if not isinstance(v, torch.Tensor) or str(v.storage_offset()) != "0":
            return v
        with self.mode():
            return torch.empty_strided(v.shape, v.stride(), dtype=v.dtype, device=v.device)

    def traces(self, node) -> bool:
        """Whether the call is traced, not copied: the table decomposes it, or functionalization
        rewrites it (_REWRITTEN)."""
        return isinstance(node.target, torch._ops.OpOverload) and (node.target in self.table or node.target in _REWRITTEN)

    def check_fresh(self) -> None:
        """Each decomposed call whose result the program writes in place (``assumed``) made a new
        tensor: its value is a node of its own splice, by an op returning a new tensor, or a view of
        one, not one of its inputs (an eval dropout's decomposition returns its input: a write into
        it writes the input too, which only the whole retrace's functionalization sees)."""
        for call in self.assumed:
            value, made = self.env.get(call), self.made.get(call, set())
            while isinstance(value, torch.fx.Node) and value in made and isinstance(value.target, torch._ops.OpOverload) \
                    and returns_alias(value.target):
                value = value.args[0]
            if not (isinstance(value, torch.fx.Node) and value in made):
                raise _Declined(f"{call.format_node()} may return an alias of its input, and is written in place")

    def mode(self):
        """The program's fake mode (functionalize.program_fake_mode)."""
        if self.fake_mode is None:
            self.fake_mode = program_fake_mode(self.ep.graph_module)
        return self.fake_mode

    def value(self, node):
        return self.vals.get(node, node.meta.get("val"))

    def run(self):
        for node in self.source.nodes:
            if node.op == "placeholder":
                self.env[node] = copy_node(self.graph, node, self.env.__getitem__)
            elif node.op == "output":
                out = self.graph.output(pytree.tree_map_only(torch.fx.Node, self.env.__getitem__, node.args[0]))
                out.meta.update(node.meta)
            elif node.op != "call_function":
                raise _Declined(f"{node.op} node")
            elif node.target is operator.getitem and isinstance(self.env.get(node.args[0]), list):
                self.env[node] = self.env[node.args[0]][node.args[1]]
                if node.args[0] in self.vals:
                    self.vals[node] = self.vals[node.args[0]][node.args[1]]
            elif self.traces(node):
                self.trace(node)
            elif any(a in self.vals for a in node.all_input_nodes):
                if not self.propagate(node):
                    self.trace(node)
            else:
                self.env[node] = self.graph.node_copy(node, self.env.__getitem__)
        return self.graph

    def propagate(self, node) -> bool:
        """Copy a call the table leaves, whose inputs are laid out otherwise than recorded, with its
        value on the new inputs (what the trace would record for it, with less work); False where
        that is not known to be what a trace gives: a call of a data-dependent op or a Python
        function on tensors, or one the new layout makes fail (a view, which the trace turns into a
        copy)."""
        t = node.target
        if isinstance(t, torch._ops.OpOverload):
            if any(tag in t.tags for tag in (torch.Tag.data_dependent_output, torch.Tag.dynamic_output_shape)):
                return False
        elif not _symbolic_arithmetic(node):  # (size arithmetic, sym_ite on a size read anew: run it on the new sizes)
            return False
        args, kwargs = pytree.tree_map_only(torch.fx.Node, self.value, (node.args, dict(node.kwargs)))
        try:
            with self.mode():
                val = t(*args, **kwargs)
        except Exception:  # noqa: BLE001 -- the trace decides (functionalize._tolerant_view for a view)
            return False
        new = self.graph.node_copy(node, self.env.__getitem__)
        new.meta["val"] = val
        new.meta.pop("tensor_meta", None)
        self.env[node] = new
        if not _same_layout(val, node.meta.get("val")):
            self.vals[node] = val
        return True

    def key(self, node, values: dict | None = None):
        """(what makes two calls decompose alike: op, argument structure, inputs' signatures; the
        call's distinct inputs); ``values`` overrides the values of some inputs."""
        inputs = list(dict.fromkeys(node.all_input_nodes))
        index = {x: i for i, x in enumerate(inputs)}
        shape = pytree.tree_map_only(torch.fx.Node, lambda x: ("in", index[x]), (node.args, dict(node.kwargs)))
        values = values or {}
        return (node.target, repr(shape),
                tuple(signature_of(values[x] if x in values else self.value(x)) for x in inputs)), inputs

    def prefetch(self) -> None:
        """Trace every distinct call the lowering traces, on the values the program recorded, in one
        trace: one trace's fixed cost instead of one per call. A call whose inputs turn out laid out
        otherwise in the lowered program is traced again (``trace``)."""
        calls, n_calls = {}, 0
        for node in self.source.nodes:
            n_calls += node.op == "call_function"
            if node.op == "call_function" and self.traces(node):
                key, inputs = self.key(node)
                calls.setdefault(key, (node, inputs))
        n_inputs = len({x for _, inputs in calls.values() for x in inputs})
        if not _pays_off(len(calls), n_inputs, n_calls):
            raise _Declined(f"{len(calls)} distinct calls to trace on {n_inputs} inputs, of {n_calls} calls")
        if len(calls) < 2:
            return
        try:
            traced = self._trace_calls(list(calls.values()))
        except _Declined:
            return
        self.memo.update(zip(calls, traced))

    def trace(self, node):
        if not isinstance(node.target, torch._ops.OpOverload):
            raise _Declined(f"{node.target} on a value laid out otherwise than recorded")
        key, inputs = self.key(node)
        traced = self.memo.get(key)
        if traced is not None and traced[4] not in (None, node):
            traced = None  # (its values depend on the data it read: another call of it reads other data)
        outs = None if traced is None else self._splice(traced, node, inputs)
        if outs is None:
            traced = self._trace_chain(node, key, inputs)
            outs = self._splice(traced, node, inputs)
        recorded = node.meta.get("val")
        if isinstance(recorded, (tuple, list)):
            self.env[node] = outs
            got = [o.meta.get("val") if isinstance(o, torch.fx.Node) else o for o in outs]
        else:
            if len(outs) != 1:
                raise _Declined(f"{node.target}: {len(outs)} outputs for one value")
            self.env[node] = outs[0]
            got = outs[0].meta.get("val") if isinstance(outs[0], torch.fx.Node) else outs[0]
        if not _same_layout(got, recorded):
            self.vals[node] = got

    # at most this many calls after a call traced anew are traced with it (_chain)
    CHAIN = 8

    def _chain(self, node) -> list:
        """``node`` and the calls after it that read its result in a row (one user each), each one
        the table decomposes, of one tensor, its other inputs lowered already: the calls a
        decomposition that lays its result out anew makes the lowering trace again one by one
        (attention's output: transpose, reshape, linear). Traced together, one trace's fixed cost
        instead of one per call."""
        chain, last = [node], node
        while len(chain) <= self.CHAIN and len(last.users) == 1:
            (m,) = last.users
            if m.op != "call_function" or not self.traces(m) or not isinstance(m.meta.get("val"), torch.Tensor) \
                    or not isinstance(last.meta.get("val"), torch.Tensor) \
                    or any(x is not last and x not in self.env for x in m.all_input_nodes):
                break
            chain.append(m)
            last = m
        return chain

    def _trace_chain(self, node, key, inputs):
        """``node`` traced (with the calls of its _chain, in one trace where there are some); each call's
        traced form memoized under the key it will have when the lowering reaches it; ``node``'s returned."""
        chain = self._chain(node)
        if len(chain) > 1:
            try:
                traced = self._trace_calls([(c, list(dict.fromkeys(c.all_input_nodes))) for c in chain], chained=True)
            except _Declined:
                traced = None
            if traced is not None and all(t[4] is None for t in traced):
                values = {}
                for c, t in zip(chain, traced):
                    out = t[2][0]
                    values[c] = out.meta.get("val") if isinstance(out, torch.fx.Node) else out
                    self.memo.setdefault(self.key(c, values)[0], t)
                return traced[0]
        (traced,) = self._trace_calls([(node, inputs)])
        self.memo[key] = traced
        return traced

    def _trace_calls(self, calls: list, chained: bool = False) -> list:
        """[(placeholders, nodes, outputs, {other placeholder read: the program's node}, the call it
        serves alone or None) of the traced graph for each (call, its inputs)], from one trace of a
        graph holding the calls, each value of the program they read a placeholder (shared by the
        calls reading it). ``chained``: a call reads an earlier one's result (_chain) as the program
        does; the traced form of the later call starts at the earlier one's traced result."""
        mini = torch.fx.Graph()
        ins, counts, outputs = {}, [], []  # ins: the program's node -> its placeholder
        made: dict = {}  # (chained) a call of ``calls`` -> its node in the graph traced
        for node, inputs in calls:
            for x in inputs:
                if x not in ins and x not in made:
                    ins[x] = mini.placeholder(f"in_{len(ins)}")
                    ins[x].meta["val"] = self.fresh(self.value(x))
            call = mini.node_copy(node, lambda x: made[x] if x in made else ins[x])
            if chained:
                made[node] = call
            recorded = node.meta.get("val")
            if isinstance(recorded, (tuple, list)):
                for i in range(len(recorded)):
                    g = mini.call_function(operator.getitem, (call, i))
                    g.meta["val"] = recorded[i]
                    outputs.append(g)
                counts.append(len(recorded))
            else:
                outputs.append(call)
                counts.append(1)
        placeholders = list(ins.values())
        mini.output(tuple(outputs))
        gm = torch.fx.GraphModule(torch.nn.Module(), mini)
        try:
            # without functionalization where that gives what it gives (the cheaper trace), else with it
            new_gm, aot_sig = (trace_plain(gm, placeholders, self.table)
                               or functionalize_graph(gm, placeholders, self.table))
        except Exception as e:  # noqa: BLE001 -- the whole retrace decides (and reports what fails there)
            raise _Declined(f"the trace of the calls failed: {type(e).__name__}: {e}") from e
        if aot_sig.input_tokens or aot_sig.output_tokens or aot_sig.user_inputs_to_mutate or \
                aot_sig.buffers_to_mutate or len(aot_sig.user_inputs) != len(placeholders):
            raise _Declined("the trace of the calls is not a plain function")
        graph = new_gm.graph
        graph.eliminate_dead_code(is_impure_node=lambda n: n.is_impure(impure_random=False))
        self.traced += 1
        placed = next((n for n in graph.nodes if _placed_on_input(n)), None)
        if placed is not None:
            raise _Declined(f"the trace of the calls holds {placed.format_node()}, which places its result at an "
                            "absolute storage offset: the recorded values' offsets (0 in a program read back "
                            "from a file) need not be those at run time")
        phs = [n for n in graph.nodes if n.op == "placeholder"]  # in the order of ``ins``
        outs = list(graph.output_node().args[0])
        if len(outs) != len(outputs):
            raise _Declined("the trace of the calls returns another number of values")
        source = dict(zip(phs, ins))  # a traced placeholder -> the program's node
        traced_ph = dict(zip(ins, phs))
        owner: dict = {}
        result, o = [], 0
        for k, ((_, inputs), n_out) in enumerate(zip(calls, counts)):
            result.append([[traced_ph[x] for x in inputs if x in traced_ph], [], outs[o:o + n_out], None])
            o += n_out
            for x in inputs:
                if x in traced_ph:
                    owner.setdefault(traced_ph[x], k)
        start = {}  # (chained) an earlier call's traced result -> the call reading it, where it starts
        if chained:
            index = {node: k for k, (node, _) in enumerate(calls)}
            for k, (node, inputs) in enumerate(calls):
                for x in inputs:
                    if x in index:
                        earlier = result[index[x]][2][0]
                        if not isinstance(earlier, torch.fx.Node):
                            raise _Declined("a chained call's traced result is not a node")
                        result[k][0].insert(inputs.index(x), earlier)
                        start[earlier] = k
        for k, entry in enumerate(result):
            # what the call's outputs read (a size the trace computed once for two calls goes to both)
            inside, stack = set(), [x for x in entry[2] if isinstance(x, torch.fx.Node)]
            while stack:
                x = stack.pop()
                if x not in inside and x.op != "placeholder" and start.get(x) != k:
                    inside.add(x)
                    stack += x.all_input_nodes
            if chained and any(owner.get(x, k) != k for x in inside):
                raise _Declined("a chained call's traced form holds another call's nodes")
            entry[1] = inside
            for x in inside:
                owner.setdefault(x, k)
        for n in graph.nodes:
            if n.op in ("placeholder", "output") or n in owner:
                continue
            # what no output reads (a check): to the call whose values it reads, with what it reads
            k = next((owner[x] for x in n.all_input_nodes if x in owner and x.op != "placeholder"),
                     next((owner[x] for x in n.all_input_nodes if x in owner), None))
            if k is None:
                raise _Declined(f"the trace of the calls holds {n.format_node()}, which reads none of them")
            stack = [n]
            while stack:
                x = stack.pop()
                if x not in result[k][1] and x.op != "placeholder":
                    result[k][1].add(x)
                    stack += x.all_input_nodes
            owner[n] = k
        order = {n: i for i, n in enumerate(graph.nodes)}
        for entry in result:
            entry[1] = sorted(entry[1], key=order.__getitem__)
        for entry in result:
            # a symbol's size the trace took from another call's input (the tracer binds a symbol to the
            # first value it saw it in): that input's node in the program stands in (same value)
            own = set(entry[0])
            read = [x for y in entry[1] for x in y.all_input_nodes] + [x for x in entry[2] if isinstance(x, torch.fx.Node)]
            entry[3] = {x: source[x] for x in read if x.op == "placeholder" and x not in own}
        for entry, (node, _) in zip(result, calls):
            # a traced form that makes values from data (item(), nonzero: new unbacked sizes) serves its
            # own call only: an equal call elsewhere reads other data
            entry.append(node if any("unbacked_bindings" in y.meta for y in entry[1]) else None)
        return [tuple(e) for e in result]

    def _splice(self, traced, node, inputs) -> list | None:
        """The traced call copied into the lowered graph on ``inputs``; None when it reads another
        call's input that the lowered graph does not have yet."""
        phs, nodes, outs, foreign, _ = traced
        if any(x not in self.env for x in foreign.values()):
            return None
        val_map = {ph: self.env[x] for ph, x in zip(phs, inputs)}
        val_map.update((ph, self.env[x]) for ph, x in foreign.items())
        for n in nodes:
            new = self.graph.node_copy(n, val_map.__getitem__)
            self.made.setdefault(node, set()).add(new)
            # the call's own provenance (module stack, stack trace), as the whole retrace carries it
            # over, not that of the equal call first traced (reuse.py finds a layer's nodes by it)
            new.meta.update((k, v) for k, v in node.meta.items() if k not in _VALUE_KEYS)
            val_map[n] = new
        return [val_map[o] if isinstance(o, torch.fx.Node) else o for o in outs]


def _range_constraints(ep, graph: torch.fx.Graph, fake_mode) -> dict:
    """``ep``'s range constraints, and the range of each size the lowering reads from data anew (a
    decomposition's ``_local_scalar_dense`` for ``item``: its symbol is new), as torch's retrace
    records them (the reader refuses a symbol without a range)."""
    out = dict(ep.range_constraints)
    env = getattr(fake_mode, "shape_env", None)
    if env is None:
        return out
    for node in graph.nodes:
        for sym in node.meta.get("unbacked_bindings") or {}:
            if sym not in out and sym not in env.replacements and sym in env.var_to_range:
                out[sym] = env.var_to_range[sym]
    return out


def lower_locally(ep, table: dict):
    """``ep`` with ``table`` (functionalize's trace table) applied node by node, as a new
    ExportedProgram, or None when the node-local lowering does not apply, and the caller retraces the
    whole program.

    The decomposed calls are traced by the retrace's own code (functionalize.functionalize_graph), so
    each is decomposed exactly as in the whole trace. It applies only where the argument that the
    result equals the whole retrace's holds: no write into a parameter, a constant or a view read
    again, no higher-order op or functorch region, no effectful op, no conjugate view, only
    OpOverload calls, getitem, grad-mode switches and size arithmetic, a trace that takes and returns
    plain values; and only where it pays off (_pays_off)."""
    from .reuse import program_with_graph

    source = _without_idle_dropouts(_inline_grad_regions(ep.graph_module))
    if not _eligible(ep, source):
        return None
    with LOCK:
        try:
            low = _Lowering(ep, table, source)
            low.prefetch()
            graph = low.run()
            low.check_fresh()
        except Exception:  # noqa: BLE001 -- _Declined, or a program this lowering does not foresee: the
            return None  # whole retrace lowers it (or reports, in its words, why it cannot)
    graph.eliminate_dead_code(is_impure_node=lambda n: n.is_impure(impure_random=False))
    prog = program_with_graph(ep, graph, _range_constraints(ep, graph, low.fake_mode), low.mutations)
    materialize_conj(prog.graph_module)
    insert_runtime_asserts(prog.graph_module)
    prog.graph_module.recompile()
    return prog
