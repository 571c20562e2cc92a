"""Functionalization: remove mutation and aliasing from a program's graph as torch.export does (in-place
ops become functional, buffer and input mutations extra outputs), applying a decomposition table in the
same trace. It owns what every retrace decomposes (forced_decompositions) and the functionalizing trace
(functionalize_graph, materialize_conj, insert_runtime_asserts), the public API the lowering engines
call; what is mutation is exporter/mutation.py's.

Why and how: docs/lowering.md#lowering-leaves-global-state-alone."""

from __future__ import annotations

import contextlib
import functools
import threading

import torch

from ._torch import compat as torch_compat
from ._torch import patches
from ._torch.dispatch import disable_fake_tensor_cache
from .graph_walk import iter_graphs
from .mutation import is_mutating, returns_alias

__all__ = ["LOCK", "forced_decompositions", "forced_ops", "functionalize_graph", "insert_runtime_asserts",
           "materialize_conj", "program_fake_mode", "runs_cia_kernel", "signature_of", "trace_plain"]

# Lowerings are serialized: two threads lowering programs that share a FakeTensorMode (one
# loaded program lowered twice at once) would interleave inside it.
LOCK = threading.RLock()


# ---- what every retrace decomposes ----

@functools.cache
def forced_decompositions() -> dict:
    """aten ops torch's retrace decomposes whatever its table says, with what it runs for them:
    CompositeImplicitAutograd ops it cannot preserve (aliasing, mutating, or declaring a functional
    schema they do not keep) decompose by their CIA kernel; ops with a Python kernel at the Autograd
    key (hardshrink, upsample_bilinear2d, ...) by that kernel."""
    from ._torch.tracing import get_decomp_for_cia as _get_decomp_for_cia
    from ._torch.tracing import is_cia_op as _is_cia_op
    from ._torch.tracing import is_preservable_cia_op as _is_preservable_cia_op
    from ._torch.tracing import materialize_cpp_cia_ops as _materialize_cpp_cia_ops

    _materialize_cpp_cia_ops()
    autograd = torch._C.DispatchKey.Autograd
    out = {}
    for packet in list(torch.ops.aten):
        packet = getattr(torch.ops.aten, packet)
        for overload in packet.overloads():
            op = getattr(packet, overload)
            try:
                cia = _is_cia_op(op)
            except RuntimeError:  # a TorchScript-only overload (aten::add.t): not a dispatcher op
                continue
            if cia:
                if not _is_preservable_cia_op(op):
                    out[op] = _get_decomp_for_cia(op)
            elif callable(op.py_kernels.get(autograd)) and not isinstance(op.py_kernels[autograd], torch._C.DispatchKey):
                out[op] = op.py_kernels[autograd]
    return out


def forced_ops() -> frozenset:
    """The ops every lowering decomposes, whatever its table says."""
    return frozenset(forced_decompositions())


# ---- the functionalizing trace of a graph ----


# Ops whose decomposition writes in place below functionalization on some inputs (adaptive_avg_pool2d's
# CIA kernel: as_strided_ on a channels-last result), measured; the retrace of a program calling one
# applies the decompositions torch runs above functionalization there at once. Others found by the
# watch while lowering are added for the rest of the process.
_WRITERS = {torch.ops.aten.adaptive_avg_pool1d.default, torch.ops.aten.adaptive_avg_pool2d.default}


def functionalize_graph(gm, placeholders, table: dict):
    """(``gm`` retraced, functionalized with ``table`` applied, aot_export's graph signature of it), on
    the values of ``placeholders``: the trace every lowering engine runs. The decompositions torch runs
    above functionalization (those of CIA ops and Autograd-key Python kernels) may write in place
    (adaptive_avg_pool2d's as_strided_, the write into an eval dropout's result in XLM), which only
    their application above functionalization functionalizes; applying them there costs more (their ops
    go through functionalization: about a fifth more time on a seq2seq model). So the whole table is
    applied below functionalization, with a watch that stops the trace at the first write in place,
    unless the program calls an op known to write (_WRITERS); on a write, or where functionalization
    refuses one (the frozen storage of dropout's result), the trace is done with them above it; if a
    decomposition torch runs below functionalization writes (where torch's own retrace fails), in two
    steps."""
    calls = {n.target for graph in iter_graphs(gm) for n in graph.nodes if n.op == "call_function"}
    if not calls & _WRITERS:
        watch, watched = _Watch.of(table)
        try:
            return _trace(gm, placeholders, watched)
        except Exception as e:  # noqa: BLE001 -- a write in place is told by the watch, or one of these
            if watch.wrote is None and not isinstance(e, AssertionError) and "frozen storage" not in str(e):
                raise
            if watch.wrote is not None:
                _WRITERS.add(watch.wrote)
    try:
        return _trace(gm, placeholders, table, above=True)
    except AssertionError as e:
        return _trace_in_two_steps(gm, placeholders, table, e, writers_only=True)
    except RuntimeError as e:
        if "frozen storage" not in str(e):
            raise
        return _trace_in_two_steps(gm, placeholders, table, e, writers_only=False)


class PlainSignature:
    """What _trace_calls reads of aot_export's graph signature, for a trace_plain result: no tokens, no
    input written, every placeholder a user input."""

    input_tokens = output_tokens = user_inputs_to_mutate = buffers_to_mutate = ()

    def __init__(self, n_inputs: int):
        self.user_inputs = tuple(range(n_inputs))


def trace_plain(gm, placeholders, table: dict):
    """(``gm`` retraced with ``table`` applied, a PlainSignature) without functionalization, or None
    where that is not known to give what functionalize_graph gives: the calls of the node-local
    lowering (lowering/engines/local.py), traced in a third to two thirds of the time.

    Functionalization changes only writes in place (and views of what they write), effects and lifted
    constants; a trace that records none of them, with only ATen ops and the arithmetic of sizes, none
    of which makes a size from data, is the functionalized trace already. The trace is torch's make_fx
    at the pre-dispatch level (where the table's composite entries apply, as in the retrace), running
    the graph through the interpreter aot_export runs it through, in the program's fake mode (its
    ShapeEnv: symbolic sizes stay the program's symbols), with each node's metadata carried over
    (fx.traceback.preserve_node_meta) as there; the table's entries below it run in the same proxy
    mode. An output that is an input (``x.to(x.dtype)``) stays that input, as in aot_export's graph.

    Declined at once, without a trace: a call that writes, has effects, lifts a constant or reads
    data into a value (``item``), and inputs with data-dependent sizes. Declined after the trace: any
    such op recorded, a size read from data (an unbacked symbol), an output that is a list, a failure.
    Then the caller runs functionalize_graph.
    Why: it traces a call in less time than functionalize_graph, for vision and transformers programs
    alike (docs/journal/code-notes.md). The graphs and their values are equal, node names of size
    arithmetic aside (tests/lowering/test_trace_plain.py)."""
    import operator

    from torch.fx.experimental.proxy_tensor import make_fx
    from torch.fx.experimental.symbolic_shapes import PropagateUnbackedSymInts, free_unbacked_symbols

    vals = [n.meta.get("val") for n in placeholders]
    if not all(isinstance(v, (torch.Tensor, torch.SymInt)) and not free_unbacked_symbols(v) for v in vals):
        return None
    if any(not _plain_op(n.target) for n in gm.graph.nodes if isinstance(n.target, torch._ops.OpOverload)):
        return None
    fake_mode, args = _fake_inputs(gm, placeholders)
    prepared = _prepared(gm)

    def run(*inputs):
        return PropagateUnbackedSymInts(prepared).run(*inputs)

    try:
        with fake_mode, torch.no_grad(), torch.fx.traceback.preserve_node_meta(), \
                _cache_off_if_symbolic(fake_mode, args):
            traced = make_fx(run, decomposition_table=table, tracing_mode="real", pre_dispatch=True)(*args)
    except Exception:  # noqa: BLE001 -- functionalize_graph decides, and reports what fails there
        return None
    graph = traced.graph
    inputs = [n for n in graph.nodes if n.op == "placeholder"]
    outputs = graph.output_node().args[0]
    # (a list among the outputs, histogramdd's bin edges: aot_export flattens what make_fx nests)
    if len(inputs) != len(placeholders) or any(isinstance(o, (list, tuple)) for o in outputs):
        return None
    for node in graph.nodes:
        if node.op in ("placeholder", "output"):
            continue
        t, val = node.target, node.meta.get("val")
        if node.op != "call_function" or free_unbacked_symbols(val):
            return None
        if isinstance(t, torch._ops.OpOverload):
            if not _plain_op(t):
                return None
        elif t is not operator.getitem and not isinstance(val, (torch.SymInt, torch.SymFloat, torch.SymBool)):
            return None  # (else the arithmetic of sizes: operator.mul, torch.sym_max, ...)
    return traced, PlainSignature(len(inputs))


def _plain_op(op) -> bool:
    """Whether a trace recording ``op`` is its functionalized trace already, as far as ``op`` goes: it
    writes nothing, has no effect, lifts no constant and makes no value from data (``item``; an op of a
    data-dependent output shape is told by its value's unbacked symbols instead: index.Tensor on integer
    indices, where decompositions of unfold and padding call it, has static sizes)."""
    from ._torch.tracing import has_effects

    return not (is_mutating(op) or has_effects(op) or op in _LIFTS or torch.Tag.data_dependent_output in op.tags)


_LIFTS = frozenset({torch.ops.aten.lift_fresh_copy.default, torch.ops.aten.lift_fresh.default,
                    torch.ops.aten.lift.default})


def _static(t: torch.Tensor) -> bool:
    """Whether ``t``'s sizes, strides and offset are plain ints (no symbol)."""
    return all(type(x) is int for x in (*t.shape, *t.stride(), t.storage_offset()))


def _trace_in_two_steps(gm, placeholders, table: dict, error: Exception, writers_only: bool):
    """The retrace when even the trace with the decompositions torch runs above functionalization
    applied there (functionalize_graph) is not functional (``error``): on a torch whose functionalization
    cannot be told per mode object (2.11: the C++ CIA kernels, such as adaptive_avg_pool2d's with its
    as_strided_ on a channels-last result, then run below it), or where a decomposition torch runs
    below functionalization writes in place. So the decompositions among those torch applies above functionalization (_above_functionalization)
    that write in place, also through the calls they make, are applied first, unfunctionalized (the
    in-place ops stay for functionalization to turn into the functional ops the table then
    decomposes), then that is functionalized with the whole table, as in torch's retrace. (After a
    frozen-storage error, ``writers_only=False``: all of them but aliasing ops run first.)

    Applying the whole table first instead would leave the PrimTorch views that the other entries
    emit (prims.collapse_view for aten.view, prims.broadcast_in_dim for aten.expand, ...) for
    functionalization, which refuses a non-ATen op that returns an alias.

    If a decomposition torch runs below functionalization writes in place (torch._refs.polar sets
    ``result.real``), torch's retrace fails (with ``error``); pt2b then applies those
    decompositions above functionalization too (_writing_in_place), else raises ``error``."""
    # Only the decompositions that write in place run first: the others run in the second trace, where
    # they see the strides and values the table's other entries produce, as in torch's single retrace
    # (swin: contiguous() after attention is a copy on the layout of torch's sdpa decomposition and a
    # no-op on its kernel's; applied first, it would be dropped and the view after it fail).
    # (After a frozen-storage error, dropout's decomposition must run first too, which writes nothing:
    # then every decomposition torch applies above functionalization does, aliasing ops excepted.)
    candidates = _above_functionalization(table)
    if writers_only:
        above = _writing_in_place(gm, candidates, {}, nested=candidates)
    else:
        above = {op: fn for op, fn in candidates.items() if not returns_alias(op)}
    while True:
        first = _decomposed(gm, placeholders, above)
        try:
            return _trace(first, placeholders, table)
        except AssertionError:
            writers = _writing_in_place(first, table, above)
            if not writers:
                raise error from None
            above.update(writers)


def _writing_in_place(gm, table: dict, applied: dict, nested: dict | None = None) -> dict:
    """The entries of ``table`` (not in ``applied``) whose decomposition of one of ``gm``'s calls,
    traced alone, writes in place; and, as they will be applied with it, those of the calls that
    their decompositions make. With ``nested``, a decomposition is traced with ``nested`` applied to
    the calls it makes (a write that happens only there counts: adaptive_avg_pool1d's decomposition
    calls adaptive_avg_pool2d, whose own writes), and the entries of ``nested`` it used, except
    aliasing ops (decomposed later, where the strides are final), are returned with it."""
    from torch.fx.experimental.proxy_tensor import make_fx

    out, seen = {}, set()
    fake_mode = program_fake_mode(gm)
    graphs = [m.graph for m in gm.modules() if isinstance(m, torch.fx.GraphModule)]
    while graphs:
        for node in graphs.pop().nodes:
            op = node.target
            if node.op != "call_function" or not isinstance(op, torch._ops.OpOverload) or op not in table \
                    or op in applied or op in out or op._schema.is_mutable:
                continue
            args, kwargs = torch.fx.node.map_arg((node.args, node.kwargs), lambda n: n.meta.get("val"))
            leaves, spec = torch.utils._pytree.tree_flatten((args, kwargs))
            key = (op, tuple(signature_of(v) for v in leaves))
            if key in seen:
                continue
            seen.add(key)
            inputs = [i for i, v in enumerate(leaves) if isinstance(v, (torch.Tensor, torch.SymInt))]

            used: set = set()
            decompose = {} if nested is None else {o: _recording(o, f, used) for o, f in nested.items()}

            def run(*vals, fn=table[op], leaves=leaves, spec=spec, inputs=inputs):
                leaves = list(leaves)
                for i, v in zip(inputs, vals):
                    leaves[i] = v
                a, k = torch.utils._pytree.tree_unflatten(leaves, spec)
                return fn(*a, **k)

            try:
                with fake_mode, torch.no_grad():
                    traced = make_fx(run, decomposition_table=decompose, pre_dispatch=True)(*[leaves[i] for i in inputs])
            except Exception:  # noqa: BLE001 -- not traceable alone: it stays below functionalization
                continue
            if any(n.op == "call_function" and isinstance(n.target, torch._ops.OpOverload)
                   and n.target._schema.is_mutable for n in traced.graph.nodes):
                out[op] = table[op]
                out.update({o: nested[o] for o in used if o not in applied and not returns_alias(o)})
                graphs.append(traced.graph)
    return out


def _recording(op, fn, used: set):
    def decomposition(*args, **kwargs):
        used.add(op)
        return fn(*args, **kwargs)

    return decomposition


def signature_of(v):
    """What a decomposition can see of a value traced alone: a tensor's shape, strides, storage
    offset, dtype, device and conjugate bit; a size's expression; any other value itself. Two calls
    of one op on values with equal signatures decompose alike."""
    if isinstance(v, torch.Tensor):
        return ("tensor", str(v.shape), v.dtype, str(v.stride()), str(v.storage_offset()), v.device, v.is_conj())
    if isinstance(v, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        return (type(v).__name__, str(v))
    return ("value", repr(v))


def _above_functionalization(table: dict) -> dict:
    """The part of ``table`` torch's retrace applies above functionalization: the decompositions of
    CompositeImplicitAutograd ops (run at the Autograd key, as the op's CIA kernel or as the
    py_kernel torch installs for the table's entry) and of ops with a Python kernel at the Autograd
    key (forced_decompositions); ops they emit are functionalized, then decomposed by the rest of the table. The
    rest (aten.view -> prims.collapse_view, aten.expand -> prims.broadcast_in_dim, ...) runs in the
    tracer below functionalization, which never sees what they emit: applied above it, their
    PrimTorch views would reach functionalization, which has no rule for a non-ATen op returning
    an alias. In-place entries stay out: functionalization removes the ops they decompose."""
    from ._torch.tracing import is_cia_op as _is_cia_op

    def above(op) -> bool:
        if op._schema.is_mutable:
            return False
        if op in forced_decompositions():
            return True
        try:
            return _is_cia_op(op)
        except RuntimeError:  # not a dispatcher op
            return False

    return {op: fn for op, fn in table.items() if above(op)}


def _conj_view(node) -> bool:
    val = node.meta.get("val") if isinstance(node, torch.fx.Node) else None
    return isinstance(val, torch.Tensor) and val.is_conj()


def materialize_conj(gm) -> None:
    """A conjugate view (conj bit set) read by an op without a kernel for it is first cloned into
    plain memory, as the dispatcher's conjugate fallback does below autograd, where torch retraces
    (above it the op is recorded on the view itself)."""
    for module in gm.modules():
        if not isinstance(module, torch.fx.GraphModule):
            continue
        graph = module.graph
        if not any(_conj_view(n) for n in graph.nodes):
            continue
        for node in list(graph.nodes):
            if node.op != "call_function" or not isinstance(node.target, torch._ops.OpOverload) \
                    or torch._C._dispatch_has_kernel_for_dispatch_key(node.target.name(), "Conjugate"):
                continue
            views = {a for a in node.all_input_nodes if _conj_view(a)}
            for view in views:
                with graph.inserting_before(node):
                    clone = graph.call_function(torch.ops.aten.clone.default, (view,))
                clone.meta.update({k: v for k, v in node.meta.items() if k in ("stack_trace", "nn_module_stack")})
                clone.meta["val"] = view.meta["val"].clone()
                node.replace_input_with(view, clone)
        module.recompile()


def program_fake_mode(gm):
    """The program's fake mode, found as torch's retrace finds it: from the placeholders' fake
    tensors, else (a program without tensor inputs) from the other nodes' values; else a fresh mode
    on the ShapeEnv of the program's symbols, else on a fresh ShapeEnv. Retracing in another
    ShapeEnv than the one that made the graph's unbacked symbols (u0, ...) breaks the trace: the new
    env names its own data-dependent sizes u0, ... again, and rebinding them to the graph's
    ("u0 possible memo disaster") or reasoning across the two envs fails."""
    from ._torch.dispatch import FakeTensorMode
    from ._torch.tracing import detect_fake_mode_from_gm as _detect_fake_mode_from_gm
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    fake_mode = _detect_fake_mode_from_gm(gm)
    if fake_mode is not None:
        return fake_mode
    shape_env = None
    for node in gm.graph.nodes:
        for v in torch.utils._pytree.tree_leaves(node.meta.get("val")):
            if isinstance(v, (torch.SymInt, torch.SymFloat, torch.SymBool)):
                shape_env = v.node.shape_env
                break
        if shape_env is not None:
            break
    return FakeTensorMode(shape_env=shape_env or ShapeEnv(), export=True)


def _fake_inputs(gm, placeholders):
    """(the program's fake mode (program_fake_mode), the placeholders' values detached in it)."""
    fake_mode = program_fake_mode(gm)
    vals = [n.meta.get("val") for n in placeholders]
    with fake_mode:
        return fake_mode, [v.detach() if isinstance(v, torch.Tensor) else v for v in vals]


def _cache_off_if_symbolic(fake_mode, args):
    """Fake tensors' dispatch cache switched off for a trace on inputs of symbolic sizes, else nothing.
    On symbolic sizes an entry costs more to make and to turn back into an output (its sizes and
    strides rebuilt through the ShapeEnv, a dozen symbolic products each) than running the op's meta
    kernel again. On static sizes an entry is cheap and reused, so the cache stays on there (how each
    choice was timed: docs/journal/code-notes.md)."""
    symbolic = any(isinstance(a, torch.SymInt) or (isinstance(a, torch.Tensor) and not _static(a)) for a in args)
    return disable_fake_tensor_cache(fake_mode) if symbolic else contextlib.nullcontext()


def _trace(gm, placeholders, table, above: bool = False):
    """aot_export_module above autograd: functionalized, ``table`` applied, on fresh fake inputs; with
    ``above``, the decompositions torch applies above functionalization are applied there
    (_AboveFunctionalization), else the whole table below it."""
    from ._torch.functorch import aot_export_module

    fake_mode, args = _fake_inputs(gm, placeholders)
    modes = _AboveFunctionalization(_above_functionalization(table)) if above else contextlib.nullcontext()
    with fake_mode, torch.no_grad(), modes, _rng_tracker_outside_fake_mode(), _cache_off_if_symbolic(fake_mode, args):
        return aot_export_module(_prepared(gm), args, decompositions=table, trace_joint=False,
                                 pre_dispatch=True)


@contextlib.contextmanager
def _rng_tracker_outside_fake_mode():
    """aot_export resets torch's Philox RNG-state tracker (torch._decomp.decompositions_for_rng) twice
    per trace, inside its fake mode: twelve empty tensors, each converted to a fake one, a large
    share of the time of a trace of one call (the node-local lowering traces small graphs often). The tracker's
    tensors are read only where torch._functorch.config.functionalize_rng_ops is on; where it is off
    (always, here), they are made as plain tensors outside the fake mode for the trace: the class
    attribute PhiloxState.reset is swapped for the trace and restored after it (declared, with what
    that means for other threads, in exporter/_torch/patches.py); nothing else changes."""
    from ._torch.functorch import functionalizes_rng_ops

    if functionalizes_rng_ops():
        yield
        return
    with patches.swapped(_PHILOX_RESET, _plain_reset):
        yield


_PHILOX_RESET = "torch._decomp.decompositions_for_rng:PhiloxState.reset"


def _plain_reset(reset):
    """PhiloxState.reset making the tracker's tensors outside any fake mode."""
    from ._torch.dispatch import unset_fake_temporarily

    def plain_reset(self):
        with unset_fake_temporarily():
            reset(self)

    return plain_reset


class _WritesInPlace(Exception):
    pass


class _Watch:
    """Table entries wrapped so that the fast trace stops at the first decomposition that writes in
    place below functionalization (the graph would not be functional; the trace is redone with the
    decompositions torch runs above functionalization applied there), instead of at its end."""

    _last: tuple | None = None  # (table, watch, watched table): the node-local lowering traces often with one table

    def __init__(self):
        self.wrote = None

    @classmethod
    def of(cls, table: dict) -> tuple["_Watch", dict]:
        """(a watch reset for a new trace, ``table`` wrapped by it); the wrapping (a closure per entry
        of torch's large table) is reused while the table is the same object."""
        last = cls._last
        if last is not None and last[0] is table:
            last[1].wrote = None
            return last[1], last[2]
        watch = cls()
        watched = watch.wrap(table)
        cls._last = (table, watch, watched)
        return watch, watched

    def wrap(self, table: dict) -> dict:
        from torch.fx.experimental.proxy_tensor import get_proxy_mode

        return {op: self._watching(op, fn, get_proxy_mode) for op, fn in table.items()}

    def _watching(self, op, fn, get_proxy_mode):
        def decomposition(*args, **kwargs):
            mode = get_proxy_mode()
            if mode is None:
                return fn(*args, **kwargs)
            graph = mode.tracer.graph
            before = len(graph.nodes)
            out = fn(*args, **kwargs)
            node = graph._root
            for _ in range(len(graph.nodes) - before):
                node = node.prev
                if isinstance(node.target, torch._ops.OpOverload) and node.target._schema.is_mutable:
                    self.wrote = op
                    raise _WritesInPlace(f"{op} writes in place ({node.target}) below functionalization")
            return out

        return decomposition


def runs_cia_kernel(fn) -> bool:
    """Whether a table entry is torch's stand-in for an op's own CompositeImplicitAutograd kernel."""
    return isinstance(fn, functools.partial) and getattr(fn.func, "__name__", "") == "_special_op_to_decompose_cia"


def _functional_mode():
    from ._torch.dispatch import get_dispatch_mode_pre_dispatch as _get_dispatch_mode_pre_dispatch

    key = torch._C._TorchDispatchModeKey.FUNCTIONAL
    return _get_dispatch_mode_pre_dispatch(key) or torch._C._get_dispatch_mode(key)


class _AboveFunctionalization(torch.overrides.TorchFunctionMode):
    """Applies ``table`` (the decompositions torch's retrace runs above functionalization) where torch
    runs them, in the same single trace: what they emit, in-place writes included (the as_strided_ of
    adaptive_avg_pool2d's CIA kernel on a channels-last result, the write into dropout's result in
    XLM), is then functionalized, and the rest of the table decomposes it below. A Python entry is
    called at the torch-function level, with this mode on for the calls it makes; an op whose entry is
    its own C++ CIA kernel is decomposed by the trace's functionalization mode itself, told so on that
    mode object only (nothing process-wide changes), as torch's functionalization decomposes every CIA
    op outside pre-dispatch tracing. The entry of an op runs once per call: a call it makes to its own
    op (a CIA kernel's re-dispatch) goes on to the dispatcher."""

    def __init__(self, table: dict):
        super().__init__()
        self.table = table
        # (a torch whose functionalization cannot be told per mode object, 2.11, runs their C++
        # kernels where the table's other entries run)
        self.cia = frozenset(op for op, fn in table.items() if runs_cia_kernel(fn)) \
            if torch_compat.functional_mode_decides_per_object() else frozenset()
        self.active: set = set()

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        fn = self.table.get(func) if isinstance(func, torch._ops.OpOverload) else None
        if fn is None:
            return func(*args, **kwargs)
        if func in self.cia:
            self._decompose_in_functionalization()
        elif func not in self.active:
            self.active.add(func)
            try:
                with self:
                    out = fn(*args, **kwargs)
            finally:
                self.active.discard(func)
            if out is not NotImplemented:
                return out
        return func(*args, **kwargs)

    def _decompose_in_functionalization(self) -> None:
        mode = _functional_mode()
        if mode is None or getattr(mode, "_pt2b_cia", None) is self.cia:
            return
        cia, decides = self.cia, mode._can_decompose
        mode._can_decompose = lambda func, args, kwargs: func in cia or decides(func, args, kwargs)
        mode._pt2b_cia = cia


def _prepared(gm):
    """``gm`` as the retrace runs it: a GraphModule on a copy of the graph, sharing ``gm``'s attributes
    (so that the trace still carries each node's metadata, stack trace and module stack, over to
    what it emits, instead of recording a stack trace per new node, a large share of a lowering), with

    - its in-place detach_ calls removed (torch.export records one after each torch.tensor(...)
      constant; below autograd, where torch retraces, they vanish, above it they would leave a
      detach);
    - each aten.view whose input and result nothing writes to made tolerant of its input's layout
      (_tolerant_view).

    ``gm`` itself when neither applies."""
    views = [n for n in gm.graph.nodes if n.target is _VIEW and _view_unwritten(n)]
    if not views and not any(n.target is torch.ops.aten.detach_.default for n in gm.graph.nodes):
        return gm
    graph = torch.fx.Graph(owning_module=gm)
    graph._codegen = gm.graph._codegen
    copies = {}
    graph.output(graph.graph_copy(gm.graph, copies))
    for node in views:
        copies[node].target = _tolerant_view
    for node in list(graph.nodes):
        if node.target is torch.ops.aten.detach_.default:
            node.replace_all_uses_with(node.args[0])
            graph.erase_node(node)
    return torch.fx.GraphModule(gm, graph)


_VIEW = torch.ops.aten.view.default
_LAYOUT_ERRORS = ("Cannot view a tensor with shape", "view size is not compatible with input tensor's size and stride")


def _view_unwritten(node) -> bool:
    """Neither the view nor its input is written in place (then a copy in its stead computes the same)."""
    source = node.args[0]
    return isinstance(source, torch.fx.Node) and not any(
        is_mutating(user.target) for user in (*node.users, *source.users))


def _tolerant_view(x, size):
    """aten.view; where the decompositions upstream left ``x`` in a layout this view cannot take, the
    same view of a contiguous copy of ``x`` (same values). The program was exported on the layouts of
    the kernels of the ops it calls, and model code views their results on the strength of that
    (gpt2: ``attn_output.reshape(...).contiguous()``, a no-op on the fused attention kernel's layout,
    so export records no copy, then ``.view(-1, n)``), while the decomposition of such an op may lay
    its result out otherwise (scaled_dot_product_attention's math decomposition): torch's own
    run_decompositions fails there. Only views whose input and result nothing writes to are made
    tolerant (_prepared), since a copy does not alias."""
    try:
        return _VIEW(x, size)
    except (RuntimeError, ValueError) as e:
        if not str(e).startswith(_LAYOUT_ERRORS):
            raise
    return _VIEW(torch.ops.aten.clone.default(x, memory_format=torch.contiguous_format), size)


def _decomposed(gm, placeholders, table):
    """``gm`` retraced above autograd with ``table`` applied and nothing else (mutations stay)."""
    from torch.fx.experimental.proxy_tensor import make_fx

    fake_mode, args = _fake_inputs(gm, placeholders)
    with fake_mode, torch.no_grad():
        out = make_fx(torch.fx.Interpreter(gm).run, decomposition_table=table, pre_dispatch=True)(*args)
    for old, new in zip(placeholders, [n for n in out.graph.nodes if n.op == "placeholder"]):
        new.meta.update(old.meta)
    return out


def insert_runtime_asserts(gm) -> None:
    """The deferred shape checks of a symbolic program, as torch's retrace inserts them."""
    from ._torch.tracing import get_shape_env as _get_shape_env
    from torch.fx.passes.runtime_assert import insert_deferred_runtime_asserts

    if torch._dynamo.config.do_not_emit_runtime_asserts:
        return
    shape_env = _get_shape_env(gm)
    if shape_env is not None:
        insert_deferred_runtime_asserts(gm, shape_env, "exported program", export=True)
        _drop_repeated_asserts(gm)


def _drop_repeated_asserts(gm) -> None:
    """Each runtime assertion of a condition an earlier one in the graph already asserts removed, with
    the size arithmetic only it used. A program read from a file holds its assertions as calls, and its
    shape environment records them again as deferred ones, so the pass above asserts each twice where
    torch's retrace of the program it exported asserts it once. The earlier one stops a call first;
    a message the user wrote (not torch's generic one) moves to it."""
    generic = "Runtime assertion failed for expression"
    kept = {}
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or node.target is not torch.ops.aten._assert_scalar.default or not node.args:
            continue
        cond = node.args[0]
        val = cond.meta.get("val") if isinstance(cond, torch.fx.Node) else None
        if not isinstance(val, torch.SymBool):
            continue
        expr = val.node.expr
        if expr not in kept:
            kept[expr] = node
            continue
        first, message = kept[expr], node.args[1] if len(node.args) > 1 else None
        if isinstance(message, str) and not message.startswith(generic) and len(first.args) > 1 \
                and str(first.args[1]).startswith(generic):
            first.args = (first.args[0], message, *first.args[2:])
        gm.graph.erase_node(node)
        unused = [cond]
        while unused:
            n = unused.pop()
            if isinstance(n, torch.fx.Node) and n.op == "call_function" and not n.users \
                    and not isinstance(n.target, torch._ops.OpOverload):
                unused.extend(n.all_input_nodes)
                gm.graph.erase_node(n)


