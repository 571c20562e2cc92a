"""Each decomposition a lowering applied, checked against its op call by call without running either
program: once per call signature, on values of the call's own shapes (the program's own where they are
cheap to compute, random ones elsewhere), then on those values permuted. Why and what it proves:
docs/lowering.md#when-the-programs-runs-cost-more-than-the-lowering."""

from __future__ import annotations

import copy
import dataclasses
import functools

import torch

from .._torch.pytree import fx_pytree, pytree
from ..functionalize import LOCK
from ..graph_walk import attr_of, iter_graphs
from ..mutation import is_mutating

__all__ = ["RANK", "Decomposed", "OpChecks", "check_call", "check_calls", "compare", "eagers_own", "input_sizes",
           "is_wrapped", "permuted", "rounding", "same", "same_layout_view", "signatures", "uninitialized",
           "user_input_values", "value_free", "where_defined"]

# A value a checked call reads is the program's own where what computes it from the program's inputs
# and weights is cheap: no op torch counts FLOPs for (a matmul, a convolution), no random op, nothing
# written in place on the way, and at most this many elements made; elsewhere it is drawn at random
CONE_LIMIT = 1 << 22
POOL_MIN = 1 << 16  # values in _Values's pool of random ones, at the least


@dataclasses.dataclass
class OpChecks:
    """What checking the decompositions call by call found: op -> (largest relative difference, "") or
    (None, why it is wrong), the calls checked (distinct signatures), the ops checked (those whose
    lowered form is not right whatever the values), and how many values were the program's own."""

    local: dict
    calls: int
    ops: list
    own_values: int = 0
    random_values: int = 0
    verdict: str = "exact"  # the worst call's, in the audit's words


def input_sizes(source_ep, inputs) -> dict | None:
    """symbol -> the size it has in ``inputs`` (the program's (args, kwargs)), from the placeholders'
    recorded shapes; None where a placeholder does not match its input."""
    return _sizes(source_ep, fx_pytree.tree_flatten_spec(tuple(inputs), source_ep.call_spec.in_spec))


def user_input_values(source_ep) -> list:
    """The recorded value of each flat user input of the program, in order (a constant argument's own
    value: ``use_cache=False`` stays what it was at export)."""
    from torch.export.graph_signature import InputKind

    placeholders = {n.name: n for n in source_ep.graph.nodes if n.op == "placeholder"}
    out = []
    for spec in source_ep.graph_signature.input_specs:
        if spec.kind == InputKind.USER_INPUT:
            node = placeholders.get(getattr(spec.arg, "name", None))
            out.append(node.meta.get("val") if node is not None else getattr(spec.arg, "value", None))
    return out


def _sizes(source_ep, inputs) -> dict | None:
    """input_sizes of the program's flat user inputs."""
    vals = user_input_values(source_ep)
    if len(vals) != len(inputs):
        return None
    out = {}
    for val, x in zip(vals, inputs):
        if isinstance(val, torch.Tensor) != isinstance(x, torch.Tensor):
            return None
        if isinstance(val, torch.Tensor):
            if val.dim() != x.dim():
                return None
            for size, real in zip(val.shape, x.shape):
                if isinstance(size, torch.SymInt) and getattr(size.node.expr, "is_Symbol", False):
                    out[size.node.expr] = int(real)
        elif isinstance(val, torch.SymInt) and getattr(val.node.expr, "is_Symbol", False):
            out[val.node.expr] = int(x)
    return out


def _concrete(v, sizes: dict):
    """A size (int or SymInt) as an int under ``sizes``; None where a symbol is not among them."""
    if isinstance(v, int):
        return v
    if isinstance(v, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        expr = v.node.expr
        if not expr.free_symbols <= set(sizes):
            return None
        got = expr.xreplace(sizes)
        kind = {torch.SymInt: int, torch.SymFloat: float, torch.SymBool: bool}[type(v)]
        try:
            return kind(got)
        except (TypeError, ValueError):
            return None
    return v


def _layout(val, sizes: dict):
    """(shape, stride) of a recorded tensor under ``sizes``; None where one is unknown."""
    shape = [_concrete(s, sizes) for s in val.shape]
    stride = [_concrete(s, sizes) for s in val.stride()]
    return None if None in shape or None in stride else (tuple(shape), tuple(stride))


class _Values:
    """The values the checked calls read: the program's weights and (cut) example inputs, values cheap to
    compute from them (CONE_LIMIT), random ones of the recorded layout elsewhere (float and bool
    tensors only: an integer tensor made by costly ops is not drawn, its call is not checked)."""

    def __init__(self, source_ep, inputs, sizes: dict, heavy: frozenset):
        from ..lifted import Binding

        self.ep, self.sizes, self.heavy = source_ep, sizes, heavy
        self.env: dict = {}
        users = iter(inputs)
        for (kind, name, value), node in zip(Binding(source_ep).inputs,
                                             (n for n in source_ep.graph.nodes if n.op == "placeholder")):
            self.env[node] = next(users) if value is None else value
        self.written = _written_bases(source_ep.graph)
        self.gen = torch.Generator().manual_seed(0)
        self.own = self.drawn = 0
        self.pool = None

    def _normal(self, n: int) -> torch.Tensor:
        """``n`` standard normal float32 values: a window, at an offset drawn per call, of a pool drawn once
        (twice the largest draw, at least POOL_MIN values): drawing each value anew was most of the op
        checks of a convolutional net whose activations are drawn (docs/journal/code-notes.md); two
        windows of one pool hold the same values shifted, which no op's decomposition can tell from
        independent ones."""
        if self.pool is None or self.pool.numel() < 2 * n:
            self.pool = torch.randn(max(2 * n, POOL_MIN), generator=self.gen, dtype=torch.float32)
        at = int(torch.randint(0, self.pool.numel() - n + 1, (), generator=self.gen))
        return self.pool[at:at + n]

    def of(self, node):
        """``node``'s value, or raise LookupError where it can be neither computed cheaply nor drawn."""
        if node in self.env:
            return self.env[node]
        val = node.meta.get("val")
        if isinstance(val, (torch.SymInt, torch.SymFloat, torch.SymBool)):
            got = _concrete(val, self.sizes)
            if got is None:
                raise LookupError(f"{node.name}: a size of symbols the inputs do not fix")
            return got
        cone = self._cheap_cone(node)
        if cone is not None and self._computed(cone):
            self.own += 1
            return self.env[node]
        if not isinstance(val, torch.Tensor) or not (val.is_floating_point() or val.dtype == torch.bool):
            raise LookupError(f"{node.name}: a value made by costly ops that is not drawn ({type(val).__name__})")
        layout = _layout(val, self.sizes)
        if layout is None or val.is_sparse or val.is_quantized or val.is_complex():
            raise LookupError(f"{node.name}: a layout this cannot draw")
        shape, stride = layout
        out = torch.empty_strided(shape, stride, dtype=val.dtype, device="cpu")
        normal = self._normal(torch.Size(shape).numel()).view(shape)
        out.copy_(normal > 0 if val.dtype == torch.bool else normal)
        self.drawn += 1
        self.env[node] = out
        return out

    def _computed(self, cone: list) -> bool:
        """Whether computing ``cone`` gives each node a value laid out as the program recorded it (its
        dtype and shape: a call the program makes in a mode this does not set would not); the values
        kept where it does, none where it does not."""
        made = []
        try:
            for n in cone:
                if n in self.env:
                    continue
                args, kwargs = pytree.tree_map_only(torch.fx.Node, self.of, (n.args, dict(n.kwargs)))
                with torch.no_grad():
                    value = n.target(*args, **kwargs) if n.op == "call_function" else attr_of(self.ep.graph_module, n)
                self.env[n] = value
                made.append(n)
                if not _as_recorded(value, n.meta.get("val"), self.sizes):
                    raise LookupError(n.name)
        except LookupError:
            for n in made:
                del self.env[n]
            return False
        return True

    def _cheap_cone(self, node) -> list | None:
        """The calls that compute ``node`` from values known already, in program order, where they are
        cheap (CONE_LIMIT); None elsewhere."""
        cone, stack, elements = set(), [node], 0
        while stack:
            n = stack.pop()
            if n in cone or n in self.env:
                continue
            if n.op == "get_attr":
                cone.add(n)
                continue
            if n.op != "call_function" or n in self.written or n.name in self.heavy:
                return None
            t = n.target
            if isinstance(t, torch._ops.OpOverload):
                if is_mutating(t) or torch.Tag.nondeterministic_seeded in t.tags:
                    return None
            elif isinstance(t, torch._ops.HigherOrderOperator):
                return None
            for v in pytree.tree_leaves(n.meta.get("val")):
                if isinstance(v, torch.Tensor):
                    layout = _layout(v, self.sizes)
                    if layout is None:
                        return None
                    elements += torch.Size(layout[0]).numel()
            if elements > CONE_LIMIT:
                return None
            cone.add(n)
            stack += n.all_input_nodes
        order = {n: i for i, n in enumerate(self.ep.graph.nodes)}
        return sorted(cone, key=order.__getitem__)


def _as_recorded(value, recorded, sizes: dict) -> bool:
    """Whether a computed value has the dtypes and shapes of the value the program recorded."""
    got, want = pytree.tree_leaves(value), pytree.tree_leaves(recorded)
    if len(got) != len(want):
        return False
    for g, w in zip(got, want):
        if isinstance(w, torch.Tensor):
            layout = _layout(w, sizes)
            if not isinstance(g, torch.Tensor) or g.dtype != w.dtype or layout is None or tuple(g.shape) != layout[0]:
                return False
    return True


def _written_bases(graph) -> set:
    """The nodes whose values some call writes in place (through views of them too): a value read
    before and after such a write differs, so none of them is computed apart from the program's run."""
    out = set()
    for node in graph.nodes:
        if node.op != "call_function" or not is_mutating(node.target):
            continue
        for i, a in enumerate(node.target._schema.arguments):
            if a.alias_info is None or not a.alias_info.is_write:
                continue
            base = node.args[i] if i < len(node.args) else node.kwargs.get(a.name)
            while isinstance(base, torch.fx.Node):
                out.add(base)
                nxt = base.args[0] if base.op == "call_function" and base.args and isinstance(
                    base.target, torch._ops.OpOverload) and base.target._schema.returns and \
                    base.target._schema.returns[0].alias_info is not None else None
                base = nxt
    return out


def signatures(source_ep, applied: list, sizes: dict) -> dict | None:
    """op -> {call signature: its first node} for each op of ``applied`` the program's graph calls (the
    layers of a model share theirs); None where an op of ``applied`` is called in a subgraph (no value
    of its own shapes is known there)."""
    from ..functionalize import signature_of

    wanted = set(applied)
    top = [n for n in source_ep.graph.nodes if n.op == "call_function" and n.target in wanted]
    for g in iter_graphs(source_ep.graph_module):
        if g is not source_ep.graph and any(n.op == "call_function" and n.target in wanted for n in g.nodes):
            return None
    out: dict = {}
    for node in top:
        def sig(v):
            if isinstance(v, torch.fx.Node):
                val = v.meta.get("val")
                if isinstance(val, torch.Tensor):
                    layout = _layout(val, sizes)
                    return ("tensor", layout, val.dtype) if layout is not None else ("unknown", v.name)
                return ("size", _concrete(val, sizes)) if val is not None else ("node", v.name)
            return signature_of(v)

        key = repr(pytree.tree_map(sig, (node.args, dict(node.kwargs)), is_leaf=lambda x: isinstance(x, torch.fx.Node)))
        out.setdefault(node.target, {}).setdefault(key, node)
    return out


def check_calls(source_ep, applied: list, table: dict, bounds: dict, inputs, forced: dict | None = None,
                heavy: frozenset | None = None, calls: dict | None = None) -> OpChecks | None:
    """Each decomposition of ``applied`` against its op, once per call signature, on the values of
    _Values (``inputs``: the program's (args, kwargs) the values are computed from), then on those
    values permuted; not the ops whose lowered form is right whatever the values (validate._value_free).
    ``forced``: op -> what every lowering decomposes it with, whatever the table says (batch_norm's
    kernel: functionalize.forced_decompositions), for the ops of ``applied`` the table lacks. ``heavy``:
    the names of the nodes that do FLOPs (run_cost.Work.heavy), and ``calls`` the signatures of
    ``applied`` at the inputs' sizes: computed here where not given.
    None where this cannot speak for running the programs: an op called in a subgraph, a value it
    cannot draw, a call that raises on the values drawn, a decomposition this cannot run."""
    from .._torch.dispatch import FakeTensorMode
    from .decompose import shared_trace_table

    flat = fx_pytree.tree_flatten_spec(tuple(inputs), source_ep.call_spec.in_spec)
    sizes = _sizes(source_ep, flat)
    if sizes is None:
        return None
    calls = calls if calls is not None else signatures(source_ep, applied, sizes)
    if calls is None:
        return None
    if heavy is None:
        from .run_cost import program_work

        heavy = program_work(source_ep, sizes).heavy
    try:
        values = _Values(source_ep, flat, sizes, heavy)
    except Exception:  # noqa: BLE001 -- a signature lifted.Binding cannot bind (tokens, script objects)
        return None
    full = shared_trace_table(table)
    given = {**(forced or {}), **table}  # the entry as the table (or the trace) gives it, for messages
    fns = {op: full.get(op, given.get(op)) for op in applied}  # ...and as the lowering applies it
    decomposed, mode = Decomposed(full), FakeTensorMode()
    chosen = {}
    try:
        for op, nodes in calls.items():
            chosen[op] = [pytree.tree_map_only(torch.fx.Node, values.of, (n.args, dict(n.kwargs))) for n in nodes.values()]
    except LookupError:
        return None
    except Exception:  # noqa: BLE001 -- a cheap value the program computes otherwise in its run: not known here
        return None
    needed = [op for op in applied if op in chosen and not value_free(op, given[op], full, chosen[op], decomposed, mode)]
    local, checked, worst = {}, 0, "exact"
    for op in needed:
        fn = fns[op]
        for args, kwargs in chosen[op]:
            for k, (a, kw) in enumerate(((args, kwargs), permuted((args, kwargs)))):
                got = check_call(op, fn, decomposed, a, kw, bounds)
                if got is None:
                    if k == 0:  # (the op itself refuses the values: nothing is known of this call)
                        return None
                    continue
                verdict, rel, why = got
                if verdict == "error":
                    return None
                checked += k == 0
                worst = verdict if RANK[verdict] > RANK[worst] else worst
                if verdict == "wrong":
                    local[op] = (None, f"its decomposition ({where_defined(given[op])}) differs from it on a call of "
                                       f"shapes the program calls it with: {why or 'a value differs'}")
                    break
                local[op] = (max(local.get(op, (0.0,))[0], rel), "")
            if op in local and local[op][0] is None:
                break
    return OpChecks(local, checked, needed, values.own, values.drawn, worst)


RANK = {"exact": 0, "ulp": 1, "lossy": 2, "wrong": 3}


def where_defined(fn) -> str:
    """A decomposition's name in messages: module.qualname."""
    return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', type(fn).__name__)}"


# Above this many elements a tensor's values are rotated by a random offset instead of shuffled: a
# random permutation of a large weight costs more than the two runs of the program it checks
SHUFFLE_LIMIT = 1 << 20


def permuted(inputs):
    """``inputs`` with each tensor's values permuted (a fixed permutation per tensor: shuffled, or
    rotated by a random offset when larger than SHUFFLE_LIMIT)."""
    gen = torch.Generator().manual_seed(0)

    def permute(x):
        if not isinstance(x, torch.Tensor) or x.numel() < 2 or x.is_sparse:
            return x
        flat = x.detach().reshape(-1)
        if flat.numel() > SHUFFLE_LIMIT:
            shift = int(torch.randint(1, flat.numel(), (), generator=gen))
            return flat.roll(shift).reshape(x.shape).contiguous()
        return flat[torch.randperm(flat.numel(), generator=gen)].reshape(x.shape).clone()

    return pytree.tree_map(permute, inputs)


def is_wrapped(t: torch.Tensor) -> bool:
    """Whether ``t`` is a functorch wrapper (a batched tensor of a vmap region, a grad-tracking one)."""
    return torch._C._functorch.is_functorch_wrapped_tensor(t)


def same(a, b) -> bool:
    return all(torch.equal(x, y) if isinstance(x, torch.Tensor) else x == y
               for x, y in zip(pytree.tree_leaves(a), pytree.tree_leaves(b)))


def compare(got, want, bounds: dict) -> tuple[str, float, str]:
    """(verdict, largest relative difference, why) of the lowered outputs ``got`` against ``want``."""
    from . import verdicts

    entry = verdicts.compare(got, want, None, ulps=False)  # (wrong or exact: the distance is measured below)
    if entry["verdict"] == "wrong":
        return "wrong", float("inf"), entry.get("why", "")
    verdict, worst, beyond_rounding = entry["verdict"], 0.0, False
    if verdict == "exact":  # every output equal: nothing to measure
        return verdict, worst, ""
    for a, b in zip(pytree.tree_leaves(got), pytree.tree_leaves(want)):
        if not isinstance(b, torch.Tensor) or not b.is_floating_point() or b.numel() == 0 or torch.equal(a, b):
            continue
        dtype = b.dtype
        rel = verdicts.relative_difference(a, b)  # (in float32, float64 only for float64 outputs)
        worst = max(worst, rel)
        if rel > bounds.get(dtype, 1e-3):
            return "wrong", rel, f"a {str(dtype).removeprefix('torch.')} output differs by {rel:.3g} (relative)"
        beyond_rounding = beyond_rounding or rel > rounding(dtype, bounds)
    # a whole program's outputs are judged on the relative difference the bound uses: an element near
    # zero a few of its own ulps off (what makes the element-wise verdict "lossy") is rounding here
    return ("lossy" if beyond_rounding else "ulp"), worst, ""


def rounding(dtype, bounds: dict) -> float:
    """The relative difference a program's output may show from float rounding alone: 16 machine
    epsilons of its dtype (1.9e-6 for float32), at most a tenth of the bound beyond which it is wrong
    (0.005 for bfloat16)."""
    return min(16 * torch.finfo(dtype).eps, bounds.get(dtype, 1e-3) / 10)


class Decomposed:
    """Calls of decompositions as the lowering computes them: ``fn`` run with the table applied to every op
    it calls in turn, on the call's own values (a dispatch mode that hands each op the table holds to its
    entry, and a composite op reaching it to its own kernel, as the lowering's trace does; the Python
    dispatcher on, as there: some composite ops have Python kernels, matmul's). The same kernels on the
    same arguments as a trace of the call run on them, without the trace, which was most of a check
    (docs/journal/code-notes.md)."""

    def __init__(self, table: dict):
        self.table = table

    @staticmethod
    def _split(args, kwargs):
        flat, spec = pytree.tree_flatten((args, kwargs))
        return flat, spec, [i for i, v in enumerate(flat) if isinstance(v, torch.Tensor)]

    def key(self, fn, args, kwargs):
        """What makes two calls of ``fn`` lower alike (None: no stable key, each checked on its own)."""
        return self._key(fn, *self._split(args, kwargs))

    @staticmethod
    def _key(fn, flat, spec, at):
        try:
            key = (fn, str(spec), tuple((flat[i].shape, flat[i].dtype, flat[i].stride(), flat[i].device) for i in at),
                   repr([v for i, v in enumerate(flat) if i not in at]))
            hash(key)
        except Exception:  # noqa: BLE001 -- an argument without a stable key
            return None
        return key

    def __call__(self, fn, args, kwargs):
        """``fn(*args, **kwargs)`` lowered as the lowering lowers it; what it raises is raised (check_call
        reports it, and the calls' check gives way to the programs' runs)."""
        from .._torch.dispatch import enable_python_dispatcher

        with enable_python_dispatcher(), _lowering_mode()(self.table):
            return fn(*args, **kwargs)


@functools.cache
def _lowering_mode():
    """The class of Decomposed's dispatch mode (made on first use: the dispatch module is imported where a
    check runs)."""
    from .._torch.dispatch import TorchDispatchMode

    class Lowering(TorchDispatchMode):
        def __init__(self, table: dict):
            super().__init__()
            self.table = table

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            entry = self.table.get(func)
            if entry is not None:
                with self:
                    out = entry(*args, **kwargs)
                if out is not NotImplemented:
                    return out
            if torch._C._dispatch_has_kernel_for_dispatch_key(func.name(), "CompositeImplicitAutograd"):
                with self:
                    out = func.decompose(*args, **kwargs)
                if out is not NotImplemented:
                    return out
            return func(*args, **kwargs)

    return Lowering


def seed(value: int = 0) -> None:
    """What torch.manual_seed(value) sets for the runs here: the CPU's generator and, where CUDA is
    initialized, its devices' (no tensor is on CUDA otherwise). torch.manual_seed also queues a call for
    each lazy device module not initialized (CUDA, XPU, MTIA), its stack formatted each time, twice per op
    check (docs/journal/code-notes.md)."""
    torch.random.default_generator.manual_seed(value)
    if torch.cuda.is_initialized():
        torch.cuda.manual_seed_all(value)


def check_call(op, fn, decomposed: Decomposed, args, kwargs, bounds: dict) -> tuple[str, float, str] | None:
    """(verdict, largest relative difference, why) of ``fn`` (op's decomposition, lowered further as
    ``decomposed`` does) against ``op`` on one call's values, what an in-place op writes compared too;
    None where op itself raises on them (values outside its domain) or ``fn`` declines the call (the
    lowering keeps the op there): no check; verdict "error" where
    the decomposition cannot be run here (the lowering traced it its own way: nothing known)."""
    from ..mutation import is_mutating

    writes = is_mutating(op)  # (a functional op's arguments are shared by both calls)
    want_in, got_in = ((copy.deepcopy((args, kwargs)), copy.deepcopy((args, kwargs))) if writes
                       else ((args, kwargs), (args, kwargs)))
    with torch.no_grad():
        try:
            seed(0)  # (an op that draws, drawing as the program's run does: same seed both sides)
            want = op(*want_in[0], **want_in[1])
        except Exception:  # noqa: BLE001 -- the op's own check
            return None
        try:
            seed(0)
            got = decomposed(fn, *got_in)
        except Exception as e:  # noqa: BLE001 -- this check cannot run it (the lowering's own trace did)
            return "error", float("inf"), f"its decomposition raises {type(e).__name__}: {str(e)[:200]}"
    if got is NotImplemented:  # the entry declines this call: the lowering keeps the op there
        return None
    if writes:
        want, got = (want, want_in), (got, got_in)
    if uninitialized(op):  # its values are whatever memory held: the layout is all there is to compare
        want, got = (pytree.tree_map_only(torch.Tensor, torch.zeros_like, x) for x in (want, got))
    try:
        return compare(got, want, bounds)
    except Exception as e:  # noqa: BLE001 -- values this cannot compare (float8 has no equal on CPU): nothing known
        return "error", float("inf"), f"its values cannot be compared here ({type(e).__name__}: {str(e)[:200]})"


def uninitialized(op) -> bool:
    """Whether ``op`` returns memory it does not fill (aten::empty, empty_like, new_empty_strided, ...)."""
    return op.__name__.split(".")[0] in {"empty", "empty_like", "new_empty", "empty_strided", "new_empty_strided",
                                         "empty_permuted"}


def eagers_own(op, fn) -> bool:
    """Whether ``fn`` is op's own CompositeImplicitAutograd kernel as torch's table holds it
    (functionalize.runs_cia_kernel: the lowering's trace runs that C++ kernel, and the ops it calls from
    C++ are decomposed by their own C++ kernels too, as in eager), and the code eager runs for op: op
    has no kernel of a device's own (native_channel_shuffle has a CPU one, which eager runs instead)."""
    from ..functionalize import runs_cia_kernel

    has = torch._C._dispatch_has_kernel_for_dispatch_key
    return (runs_cia_kernel(fn) and fn.keywords.get("kernel") is op
            and has(op.name(), "CompositeImplicitAutograd") and not has(op.name(), "CPU") and not has(op.name(), "CUDA"))


def same_layout_view(want, got) -> bool:
    """Whether ``got`` and ``want`` are each the same view of the same storage (shape, strides, offset):
    the same elements whatever they hold. Two values computed anew are not (each has its own storage)."""
    w, g = pytree.tree_leaves(want), pytree.tree_leaves(got)
    return len(w) == len(g) and all(
        isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor) and x.shape == y.shape and x.dtype == y.dtype
        and x.stride() == y.stride() and x.storage_offset() == y.storage_offset()
        and x.untyped_storage()._cdata == y.untyped_storage()._cdata for x, y in zip(w, g))


def value_free(op, fn, full: dict, calls: list, decomposed: Decomposed, mode=None) -> bool:
    """Whether op's lowered form computes what op does whatever the values, on the shapes of ``calls``,
    as told on fake tensors (shapes, no values): ``fn`` is eager's own kernel for op (eagers_own), or op
    is not a composite one, and every op that eager dispatches for op and the table decomposes (op
    itself, where it is not composite) returns a view its decomposition lays out as the op's own
    kernel does (the same elements of the same storage, whatever they hold: linear's t, which the
    lowering makes a permute; transpose), and the same ops with the Python dispatcher on as without it
    (a trace may run the Python kernel matmul has where eager runs C++); or no call has a tensor
    argument (arange). A derived input
    can find nothing wrong there that the stored one does not (a trace cannot branch on values). False
    where this cannot be told, and for any op that computes values anew; an op that writes in place is
    value-free only as _writes_kept_variant tells.
    ``mode``: the FakeTensorMode to run in (one for all the ops of a program: the weights made fake once)."""
    from .._torch.dispatch import FakeTensorMode, TorchDispatchMode, enable_python_dispatcher
    from ..mutation import is_mutating

    if not any(isinstance(v, torch.Tensor) for call in calls for v in pytree.tree_leaves(call)):
        return True  # (arange, ones: the derived input gives these calls the arguments the stored one did)
    if is_mutating(op):
        return _writes_kept_variant(op, fn, full, calls, decomposed, mode)
    if not (eagers_own(op, fn) or not torch._C._dispatch_has_kernel_for_dispatch_key(
            op.name(), "CompositeImplicitAutograd")):
        return False
    bad, seen = [], []

    class Views(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            out = func(*args, **kwargs)
            seen.append((func, [(t.shape, t.stride()) for t in pytree.tree_leaves(out) if isinstance(t, torch.Tensor)]))
            if func in full and not bad:
                if is_mutating(func):
                    bad.append(func)
                else:
                    with self:  # (its decomposition's own calls checked alike)
                        got = full[func](*args, **kwargs)
                    if got is not NotImplemented and not same_layout_view(out, got):
                        bad.append(func)
            return out

    try:
        for key, fake in _faked_signatures(fn, calls, decomposed, mode or FakeTensorMode()):
            with Views():
                op(*fake[0], **fake[1])
            plain, seen[:] = list(seen), []
            # a trace may run the Python kernels some composite ops have (matmul's) where eager runs
            # C++: the same calls either way, or not known (the decompositions' own calls included:
            # the second run checks the layouts again so that its calls compare with the first's)
            with enable_python_dispatcher(), Views():
                op(*fake[0], **fake[1])
            if bad or key is None or seen != plain:
                return False
            seen.clear()
    except Exception:  # noqa: BLE001 -- not known: checked as any other
        return False
    return True


def _faked_signatures(fn, calls: list, decomposed: Decomposed, mode):
    """(key, (args, kwargs) with every tensor made fake in ``mode``) of the first call of each signature of
    ``calls`` (as decomposed.key tells them apart; each call without a key), yielded inside ``mode``."""
    done = set()
    for args, kwargs in calls:
        key = decomposed.key(fn, args, kwargs)
        if key is not None and key in done:
            continue
        done.add(key)
        with LOCK, mode:
            yield key, pytree.tree_map_only(torch.Tensor, mode.from_tensor, (args, kwargs))


def _writes_kept_variant(op, fn, full: dict, calls: list, decomposed: Decomposed, mode=None) -> bool:
    """Whether the in-place ``op``'s lowered form (``fn``) is its functional variant, which the lowering
    keeps (eager's own kernel computes it), copied into the argument op writes, on the shapes of ``calls``
    (fake tensors): a variant's result of that argument's shape and dtype, and no other call (torch's
    register_inplace entries, relu_ or leaky_relu_). Right whatever the values: the kernel is eager's, the
    copy moves its result as it is."""
    from .._torch.dispatch import FakeTensorMode, TorchDispatchMode
    from ..mutation import functional_variant

    variant = functional_variant(op)
    if variant is None or variant in full:
        return False
    seen: list = []

    class Calls(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func.namespace != "prim":  # (prim.device and its kind read metadata, never values)
                seen.append((func, args))
            return func(*args, **(kwargs or {}))

    try:
        for key, fake in _faked_signatures(fn, calls, decomposed, mode or FakeTensorMode()):
            if key is None:
                return False
            with Calls():
                fn(*fake[0], **fake[1])
            written = fake[0][0] if fake[0] else None
            if len(seen) != 2 or seen[0][0] is not variant or seen[1][0] is not torch.ops.aten.copy_.default:
                return False
            target, value = seen[1][1][:2]
            if target is not written or not isinstance(value, torch.Tensor) or \
                    value.shape != written.shape or value.dtype != written.dtype:
                return False
            seen.clear()
    except Exception:  # noqa: BLE001 -- not known: checked as any other
        return False
    return True
