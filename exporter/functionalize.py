"""Functionalization: remove mutation and aliasing from an ExportedProgram, the way torch.export does
(in-place ops become functional ones, buffer and user-input mutations become extra outputs for the
caller to apply), applying a decomposition table in the same trace, without touching process-global
state. The lowering (lowering/decompose.py) builds the table and calls down into this module.

torch's ExportedProgram.run_decompositions gets its result by retracing below autograd, where
CompositeImplicitAutograd (CIA) ops would decompose by themselves; to keep the ones the table does
not decompose it rewrites their ``py_kernels`` (and registers fake-tensor rules) for the whole
process while it runs, and it turns mkldnn, nnpack and cudnn off process-wide. Eager code in
another thread meanwhile runs other kernels.

Here the program is retraced ABOVE autograd instead (aot_export_module with pre_dispatch=True):
there a functional CIA op is seen as itself, so it stays unless the table holds it, and the table
alone says what decomposes; functionalization happens in the same trace. What torch's retrace does
implicitly is made explicit: ops it decomposes whatever its table says (CIA ops it cannot preserve,
ops with a Python kernel at the Autograd key) get those decompositions (_forced), aten.lstm.input
gets the path torch's entry takes with mkldnn off (it reads the global flag; flag_free), effectful
ops are threaded on effect tokens (_thread_effects), conjugate views are materialized before ops
without a conjugate kernel (_materialize_conj); the decompositions torch applies above
functionalization (those of CompositeImplicitAutograd ops and Autograd-key Python kernels) are
applied above it in the same single trace (_AboveFunctionalization), so that what they write in
place is functionalized, and the rest of the table, whose PrimTorch views functionalization cannot
take, below it, as in torch; a decomposition torch runs below functionalization that writes in
place (where torch's retrace fails), or on 2.11 a C++ CIA kernel, is applied in a first step
(_trace_in_two_steps); the whole table is first tried below functionalization, which is faster,
with a watch that stops at the first write in place (_trace_once); torch.export's detach_
after a constant is skipped, and a view is made tolerant of the layout decompositions give its
input (_prepared); the trace runs in the program's own fake mode and ShapeEnv, found as torch
finds it, also for a program without tensor inputs (_fake_mode), so the graph's unbacked symbols
and their ranges are the trace's. Nothing global is written;
grad mode and the trace's modes are thread-local. The result is an ATen-dialect ExportedProgram
whose op set equals run_decompositions' (tests/test_lowering.py, test_decompose.py).
"""

from __future__ import annotations

import contextlib
import functools
import threading

import torch

from . import functorch_regions, torch_compat
from .errors import LoweringError
from .ops import op_name
from .graph_walk import iter_graphs

__all__ = ["forced_ops", "functionalize", "is_mutating", "may_mutate", "signature_of", "updates_hidden_state"]

# Lowerings are serialized: two threads lowering programs that share a FakeTensorMode (one
# loaded program lowered twice at once) would interleave inside it.
_LOCK = threading.RLock()


def functionalize(ep, table: dict | None = None):
    """``ep`` functionalized, with ``table`` (op -> decomposition, applied exactly as given, in the
    same trace) as a new ATen-dialect ExportedProgram. Without a table only the decompositions every
    retrace applies (forced_ops) are, and ``ep`` itself is returned when it has no mutation."""
    if table is None:
        if not needs_functionalization(ep):
            return ep
        table = _forced()
    with _LOCK:
        try:
            return _retrace(ep, table)
        except LoweringError:
            raise
        except Exception as e:
            raise LoweringError(f"decomposition failed: {type(e).__name__}: {e}") from e


def needs_functionalization(ep) -> bool:
    """Whether functionalize(ep) (no table) changes ``ep``: it may write in place or holds a functorch region."""
    return may_mutate(ep) or functorch_regions.has_regions(ep.graph_module)


# ---- what functionalization removes ----

# Ops whose schemas do not declare that they update an argument, but do (running stats).
HIDDEN_MUTATION = {
    "aten::batch_norm.default", "aten::_batch_norm_impl_index.default", "aten::instance_norm.default",
    "aten::native_batch_norm.default", "aten::_native_batch_norm_legit.default",
    "aten::cudnn_batch_norm.default", "aten::miopen_batch_norm.default",
}


def is_mutating(op) -> bool:
    """In-place, out= and other ops that write an argument: functionalization removes them."""
    return isinstance(op, torch._ops.OpOverload) and any(
        a.alias_info is not None and a.alias_info.is_write for a in op._schema.arguments)


def updates_hidden_state(node) -> bool:
    """A call whose schema declares no write but that updates running stats in place (HIDDEN_MUTATION)."""
    return op_name(node.target) in HIDDEN_MUTATION and _updates_running_stats(node)


def may_mutate(ep) -> bool:
    """True when functionalization has work to do on ``ep``."""
    for graph in iter_graphs(ep.graph_module):
        for node in graph.nodes:
            if node.op == "call_function" and isinstance(node.target, torch._ops.OpOverload) and (
                    is_mutating(node.target) or updates_hidden_state(node)):
                return True
    return False


def _updates_running_stats(node) -> bool:
    """A batch/instance norm node updates its running stats unless its training (use_input_stats)
    flag is literally False (eval mode), or it has no running stats."""
    names = [a.name for a in node.target._schema.arguments]

    def arg(name):
        if name not in names:
            return None
        i = names.index(name)
        return node.args[i] if i < len(node.args) else node.kwargs.get(name)

    flag = arg("training") if "training" in names else arg("use_input_stats")
    return flag is not False and not (arg("running_mean") is None and arg("running_var") is None)



# ---- what every retrace decomposes ----

@functools.cache
def _forced() -> dict:
    """aten ops torch's retrace decomposes whatever its table says, with what it runs for them:
    CompositeImplicitAutograd ops it cannot preserve (aliasing, mutating, or declaring a functional
    schema they do not keep) decompose by their CIA kernel; ops with a Python kernel at the Autograd
    key (hardshrink, upsample_bilinear2d, ...) by that kernel."""
    from torch._export.utils import _get_decomp_for_cia, _is_cia_op, _is_preservable_cia_op, _materialize_cpp_cia_ops

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
    return frozenset(_forced())


# ---- the retrace ----

def _retrace(ep, table: dict):
    gm = ep.graph_module
    old_phs = [n for n in gm.graph.nodes if n.op == "placeholder"]
    if functorch_regions.has_regions(gm):
        gm = functorch_regions.flatten_regions(gm, _fake_mode(gm))
    new_gm, aot_sig = _trace_once(gm, old_phs, table)
    # as torch's retrace does, an unused random draw is dead code too
    new_gm.graph.eliminate_dead_code(is_impure_node=lambda n: n.is_impure(impure_random=False))
    _materialize_conj(new_gm)
    tokens, new_phs = _split_tokens(new_gm, aot_sig)
    if not tokens:
        tokens = _thread_effects(new_gm, aot_sig)
    if len(new_phs) != len(old_phs):
        raise LoweringError(f"the retrace has {len(new_phs)} inputs where the program has {len(old_phs)}.")
    traced_names = {ph.name: ph for ph in new_phs}  # aot_sig names the inputs as traced, before _rename
    _rename(new_gm, old_phs, new_phs)
    _insert_runtime_asserts(new_gm)  # (ExportedProgram generates the code once, in _program)
    sig = _signature(ep, new_gm, tokens, new_phs, aot_sig, traced_names)
    for old, new in zip(old_phs, new_phs):
        if not isinstance(old.meta.get("val"), torch.Tensor):
            new.meta["val"] = old.meta.get("val")
        if new.target in sig.inputs_to_parameters or new.target in sig.inputs_to_buffers:
            new.meta.update(old.meta)
    return _program(ep, new_gm, sig)  # threaded effect tokens stay, as in torch's result


# Ops whose decomposition writes in place below functionalization on some inputs (adaptive_avg_pool2d's
# CIA kernel: as_strided_ on a channels-last result), measured; the retrace of a program calling one
# applies the decompositions torch runs above functionalization there at once. Others found by the
# watch while lowering are added for the rest of the process.
_WRITERS = {torch.ops.aten.adaptive_avg_pool1d.default, torch.ops.aten.adaptive_avg_pool2d.default}


def _trace_once(gm, placeholders, table: dict):
    """The retrace. The decompositions torch runs above functionalization (those of CIA ops and
    Autograd-key Python kernels) may write in place (adaptive_avg_pool2d's as_strided_, the write
    into an eval dropout's result in XLM), which only their application above functionalization
    functionalizes; applying them there costs more (their ops go through functionalization: about
    a fifth more time on a seq2seq model). So the whole table is applied below functionalization, with
    a watch that stops the trace at the first write in place, unless the program calls an op known to
    write (_WRITERS); on a write, or where functionalization refuses one (the frozen storage of
    dropout's result), the trace is done with them above it; if a decomposition torch runs below
    functionalization writes (where torch's own retrace fails), in two steps."""
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


def _trace_in_two_steps(gm, placeholders, table: dict, error: Exception, writers_only: bool):
    """The retrace when even the trace with the decompositions torch runs above functionalization
    applied there (_trace_once) is not functional (``error``): on a torch whose functionalization
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
        above = {op: fn for op, fn in candidates.items() if not _returns_alias(op)}
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
    fake_mode = _fake_mode(gm)
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
                out.update({o: nested[o] for o in used if o not in applied and not _returns_alias(o)})
                graphs.append(traced.graph)
    return out


def _recording(op, fn, used: set):
    def decomposition(*args, **kwargs):
        used.add(op)
        return fn(*args, **kwargs)

    return decomposition


def _returns_alias(op) -> bool:
    """Whether an op's schema returns a view of an input (reshape, contiguous, flatten: what their
    decompositions give depends on the strides they see)."""
    return any(r.alias_info is not None for r in op._schema.returns)


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
    key (_forced); ops they emit are functionalized, then decomposed by the rest of the table. The
    rest (aten.view -> prims.collapse_view, aten.expand -> prims.broadcast_in_dim, ...) runs in the
    tracer below functionalization, which never sees what they emit: applied above it, their
    PrimTorch views would reach functionalization, which has no rule for a non-ATen op returning
    an alias. In-place entries stay out: functionalization removes the ops they decompose."""
    from torch._export.utils import _is_cia_op

    def above(op) -> bool:
        if op._schema.is_mutable:
            return False
        if op in _forced():
            return True
        try:
            return _is_cia_op(op)
        except RuntimeError:  # not a dispatcher op
            return False

    return {op: fn for op, fn in table.items() if above(op)}


def _conj_view(node) -> bool:
    val = node.meta.get("val") if isinstance(node, torch.fx.Node) else None
    return isinstance(val, torch.Tensor) and val.is_conj()


def _materialize_conj(gm) -> None:
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


def _thread_effects(gm, aot_sig) -> list:
    """Side-effecting ops (linalg's error checks, prints) called through with_effects on a token
    that the program takes and returns, as torch's retrace below autograd leaves them (above it
    they stay plain calls). [the token placeholder] or []."""
    import operator

    from torch._export.utils import _detect_fake_mode_from_gm
    from torch._higher_order_ops.effects import has_effects, with_effects

    calls = [n for n in gm.graph.nodes if n.op == "call_function" and isinstance(n.target, torch._ops.OpOverload)
             and has_effects(n.target)]
    if not calls:
        return []
    graph = gm.graph
    fake_mode = _detect_fake_mode_from_gm(gm)  # also a program without tensor inputs
    with graph.inserting_before(next(iter(graph.nodes))):
        token = graph.placeholder("token")
    with fake_mode or contextlib.nullcontext():
        token.meta["val"] = torch.empty(0)
    for call in calls:
        val = call.meta.get("val")
        results = () if val is None else tuple(val) if isinstance(val, (tuple, list)) else (val,)
        with graph.inserting_before(call):
            node = graph.call_function(with_effects, (token, call.target, *call.args), dict(call.kwargs))
            node.meta.update(call.meta)
            node.meta["val"] = (token.meta["val"], *results)
            token = graph.call_function(operator.getitem, (node, 0))
            token.meta["val"] = node.meta["val"][0]
            if isinstance(val, (tuple, list)):
                for user in list(call.users):  # getitem(call, i) -> getitem(node, i + 1)
                    user.args = (node, user.args[1] + 1)
            elif results:
                single = graph.call_function(operator.getitem, (node, 1))
                single.meta["val"] = val
                call.replace_all_uses_with(single)
        graph.erase_node(call)
    out = graph.output_node()
    out.args = ((token, *out.args[0]),)
    aot_sig.output_tokens[:] = [token.name]
    return [n for n in graph.nodes if n.op == "placeholder"][:1]


def _split_tokens(gm, aot_sig):
    """(effect-token placeholders, the others). Tokens no op threads (the trace adds one when an
    op it looked into, such as linalg_inv's error check, has effects) are taken out at once."""
    phs = [n for n in gm.graph.nodes if n.op == "placeholder"]
    tokens, rest = phs[:len(aot_sig.input_tokens)], phs[len(aot_sig.input_tokens):]
    out = gm.graph.output_node()
    outs = list(out.args[0])
    n_out = len(aot_sig.output_tokens)
    if tokens and all(o in tokens for o in outs[:n_out]) and all(set(t.users) <= {out} for t in tokens):
        out.args = (tuple(outs[n_out:]),)
        for t in tokens:
            gm.graph.erase_node(t)
        aot_sig.output_tokens.clear()
        tokens = []
    return tokens, rest


def _fake_mode(gm):
    """The program's fake mode, found as torch's retrace finds it: from the placeholders' fake
    tensors, else (a program without tensor inputs) from the other nodes' values; else a fresh mode
    on the ShapeEnv of the program's symbols, else on a fresh ShapeEnv. Retracing in another
    ShapeEnv than the one that made the graph's unbacked symbols (u0, ...) breaks the trace: the new
    env names its own data-dependent sizes u0, ... again, and rebinding them to the graph's
    ("u0 possible memo disaster") or reasoning across the two envs fails."""
    from torch._export.utils import _detect_fake_mode_from_gm
    from torch._subclasses.fake_tensor import FakeTensorMode
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
    """(the program's fake mode (_fake_mode), the placeholders' values detached in it)."""
    fake_mode = _fake_mode(gm)
    vals = [n.meta.get("val") for n in placeholders]
    with fake_mode:
        return fake_mode, [v.detach() if isinstance(v, torch.Tensor) else v for v in vals]


def _trace(gm, placeholders, table, above: bool = False):
    """aot_export_module above autograd: functionalized, ``table`` applied, on fresh fake inputs; with
    ``above``, the decompositions torch applies above functionalization are applied there
    (_AboveFunctionalization), else the whole table below it."""
    from torch._functorch.aot_autograd import aot_export_module

    fake_mode, args = _fake_inputs(gm, placeholders)
    modes = _AboveFunctionalization(_above_functionalization(table)) if above else contextlib.nullcontext()
    with fake_mode, torch.no_grad(), modes, _rng_tracker_outside_fake_mode():
        return aot_export_module(_prepared(gm), args, decompositions=table, trace_joint=False,
                                 pre_dispatch=True)


@contextlib.contextmanager
def _rng_tracker_outside_fake_mode():
    """aot_export resets torch's Philox RNG-state tracker (torch._decomp.decompositions_for_rng) twice
    per trace, inside its fake mode: twelve empty tensors, each converted to a fake one, a fifth of
    the time of a trace of one call (the node-local lowering traces small graphs often). The tracker's
    tensors are read only where torch._functorch.config.functionalize_rng_ops is on; where it is off
    (always, here), they are made as plain tensors outside the fake mode for the trace: nothing
    else changes."""
    from torch._decomp import decompositions_for_rng as rng
    from torch._functorch import config

    state = getattr(rng, "PhiloxState", None)
    reset = getattr(state, "reset", None)
    if config.functionalize_rng_ops or reset is None:
        yield
        return
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    def plain_reset(self):
        with unset_fake_temporarily():
            reset(self)

    state.reset = plain_reset
    try:
        yield
    finally:
        state.reset = reset


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
        """(a watch reset for a new trace, ``table`` wrapped by it); the wrapping (a closure per entry,
        about 20 ms for torch's table) is reused while the table is the same object."""
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


def _runs_cia_kernel(fn) -> bool:
    """Whether a table entry is torch's stand-in for an op's own CompositeImplicitAutograd kernel."""
    return isinstance(fn, functools.partial) and getattr(fn.func, "__name__", "") == "_special_op_to_decompose_cia"


def _functional_mode():
    from torch._ops import _get_dispatch_mode_pre_dispatch

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
        self.cia = frozenset(op for op, fn in table.items() if _runs_cia_kernel(fn)) \
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
    what it emits, instead of recording a stack trace per new node: a third of a lowering), with

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


def _rename(gm, old_phs, new_phs) -> None:
    """Placeholders take the program's names; other nodes move aside where they would clash."""
    from torch._export.utils import _name_hoo_subgraph_placeholders

    for old, new in zip(old_phs, new_phs):
        new.name = new.target = old.name
    taken = {n.name for n in new_phs}
    everything = {n.name for n in gm.graph.nodes}
    for node in gm.graph.nodes:
        if node.op == "placeholder":
            continue
        if node.name in taken:
            i = 1
            while f"{node.name}_{i}" in taken or f"{node.name}_{i}" in everything:
                i += 1
            node.name = f"{node.name}_{i}"
        taken.add(node.name)
    _name_hoo_subgraph_placeholders(gm)


def _insert_runtime_asserts(gm) -> None:
    """The deferred shape checks of a symbolic program, as torch's retrace inserts them."""
    from torch.export.exported_program import _get_shape_env
    from torch.fx.passes.runtime_assert import insert_deferred_runtime_asserts

    if torch._dynamo.config.do_not_emit_runtime_asserts:
        return
    shape_env = _get_shape_env(gm)
    if shape_env is not None:
        insert_deferred_runtime_asserts(gm, shape_env, "exported program", export=True)


def _signature(ep, gm, tokens, new_phs, aot_sig, traced_names):
    from torch.export.graph_signature import (ConstantArgument, ExportGraphSignature, InputKind, InputSpec,
                                              OutputKind, OutputSpec, SymBoolArgument, SymFloatArgument,
                                              SymIntArgument, TensorArgument, TokenArgument)

    def arg(old, node):
        if isinstance(old, ConstantArgument):
            return old
        for kind in (TensorArgument, SymIntArgument, SymFloatArgument, SymBoolArgument):
            if isinstance(old, kind):
                return kind(name=node.name)
        raise LoweringError(f"the program's signature holds an argument pt2b cannot retrace: {old!r}.")

    old_sig = ep.graph_signature
    outs = list(gm.graph.output_node().args[0])
    n_tok = len(aot_sig.output_tokens)
    input_specs = [InputSpec(InputKind.TOKEN, TokenArgument(name=t.name), None) for t in tokens]
    input_specs += [InputSpec(s.kind, arg(s.arg, new_phs[i]), s.target, s.persistent)
                    for i, s in enumerate(old_sig.input_specs)]
    output_specs = [OutputSpec(OutputKind.TOKEN, TokenArgument(name=o.name), None) for o in outs[:n_tok]]
    outs = outs[n_tok:]
    position = {name: i for i, name in enumerate(aot_sig.user_inputs)}
    # an in-place op that leaves its input as it was (conj_physical_ of a real tensor) returns the input
    # itself as the mutation's output: aot_sig names that placeholder as traced
    mutated = [(traced_names[o].name if o in traced_names else o, i) for o, i in aot_sig.user_inputs_to_mutate.items()]
    if [name for name, _ in mutated] != [n.name for n in outs[:len(mutated)]]:
        raise LoweringError("the retrace's mutation outputs are out of order.")
    for out_name, in_name in mutated:
        spec = old_sig.input_specs[position[in_name]]
        if spec.kind == InputKind.CONSTANT_TENSOR and isinstance(ep.constants.get(spec.target), torch.Tensor):
            # a plain tensor attribute the model updates in place (a static KV cache kept as an attribute,
            # not a buffer): eager keeps the update across calls, which a non-persistent buffer does;
            # torch's run_decompositions refuses it ("register it as buffer")
            i = position[in_name] + len(tokens)
            input_specs[i] = InputSpec(InputKind.BUFFER, input_specs[i].arg, spec.target, persistent=False)
            output_specs.append(OutputSpec(OutputKind.BUFFER_MUTATION, TensorArgument(name=out_name), spec.target))
        elif spec.kind == InputKind.BUFFER:
            output_specs.append(OutputSpec(OutputKind.BUFFER_MUTATION, TensorArgument(name=out_name), spec.target))
        elif spec.kind == InputKind.USER_INPUT:
            output_specs.append(OutputSpec(OutputKind.USER_INPUT_MUTATION, TensorArgument(name=out_name),
                                           spec.arg.name))
        elif spec.kind == InputKind.PARAMETER:  # `with torch.no_grad(): self.p.div_(2)`: as torch records it
            output_specs.append(OutputSpec(OutputKind.PARAMETER_MUTATION, TensorArgument(name=out_name), spec.target))
        else:
            raise LoweringError(f"the program mutates {spec.kind.name.lower()} {spec.target!r}, which pt2b "
                                f"cannot write back (only buffers and user inputs can be mutated).")
    renamed = {s.arg.name: new_phs[i].name for i, s in enumerate(old_sig.input_specs)
               if not isinstance(s.arg, ConstantArgument)}
    user_outs = list(old_sig.output_specs)
    if len(outs) != len(mutated) + len(user_outs):
        raise LoweringError(f"the retrace returns {len(outs)} values where {len(mutated) + len(user_outs)} "
                            f"are expected.")
    for i, s in enumerate(user_outs):
        output_specs.append(OutputSpec(s.kind, arg(s.arg, outs[len(mutated) + i]), renamed.get(s.target, s.target)))
    return ExportGraphSignature(input_specs=input_specs, output_specs=output_specs)


def _program(ep, gm, sig):
    from torch.export import ExportedProgram
    from torch.export.exported_program import _get_updated_module_call_graph, _get_updated_range_constraints

    gm.meta.update(ep.graph_module.meta)
    return ExportedProgram(
        root=gm, graph=gm.graph, graph_signature=sig, state_dict=ep.state_dict,
        range_constraints=_get_updated_range_constraints(gm, ep.range_constraints),
        module_call_graph=_get_updated_module_call_graph(ep.graph_module, ep.graph_signature, gm, sig,
                                                         ep.module_call_graph),
        example_inputs=ep.example_inputs, constants=ep.constants)

