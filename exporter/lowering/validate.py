"""Validation of a lowering on the artifact's own inputs: load_for_backend runs the lowered and the
unlowered program on the stored example inputs and compares their outputs in the audit's words
(verdicts.py), then checks a permuted second input op by op or on both programs, whichever costs
less, for the decompositions not right whatever the values (_value_free); on a wrong output it
checks each decomposition where it runs.
Why and the bounds: docs/lowering.md#a-lowering-is-validated-on-the-artifacts-own-inputs."""

from __future__ import annotations

import copy
import dataclasses
import json
import math
import time

import torch

from .._torch.pytree import pytree
from ..functionalize import LOCK
from .decompose import shared_trace_table
from ..graph_walk import call_nodes
from ..shared.regions import is_autocast_marker
from ..ops import op_name
from ..util import nesting

__all__ = ["SourceRuns", "Validation", "applied_decompositions", "bounds_for", "right_where_they_run",
           "rounding_explains", "validate", "where_defined", "widened_run"]


@dataclasses.dataclass
class Validation:
    """What validating a lowering found (LoweredProgram.validation)."""

    status: str  # "passed", "failed" or "skipped"
    verdict: str = ""  # the worst output, in the audit's words: exact, ulp, lossy, wrong
    max_rel: float = 0.0  # the largest relative difference from the unlowered program
    bound: float = 0.0  # a float output farther than this is wrong
    inputs: int = 0  # input sets checked (the stored example inputs, a derived one)
    # how the derived input was checked: "program" (both programs run on it) or "ops" (each decomposed
    # op against its decomposition on the values its first calls receive, permuted); "eager" where no
    # check is needed (each decomposition applied runs eager's kernels for its op, or lays out a view as
    # they do: _value_free); "" where it was not
    derived: str = ""
    seconds: float = 0.0
    why: str = ""  # what failed, or why it was skipped
    kept: dict = dataclasses.field(default_factory=dict)  # op -> why, kept undecomposed after a failure
    # where the outputs differ beyond the bound although every decomposition applied is right on the values
    # its op receives in this program (the program amplifies rounding): op -> that largest relative
    # difference, for the (up to three) ops that differ most there
    amplified: dict = dataclasses.field(default_factory=dict)

    def describe(self) -> str:
        if self.status == "skipped":
            return f"not validated: {self.why}"
        if self.amplified:
            ops = ", ".join(f"{op} {rel:.3g}" for op, rel in self.amplified.items())
            return (f"validation {self.status} on {self.inputs} input set(s) against the unlowered program: the outputs "
                    f"differ by up to {self.max_rel:.3g} (relative), more than float rounding explains (bound "
                    f"{self.bound:.3g}), yet every decomposition applied is right on the values its op receives in "
                    f"this program (the largest relative differences there: {ops}); the program amplifies or "
                    f"accumulates their float rounding (an op downstream rounds, as a quantize op does, or many "
                    f"layers compound it in a low-precision dtype), as any other implementation of the ops would; "
                    f"{self.seconds:.2f} s")
        word = {"ulp": "ulp (float rounding)", "lossy": "lossy (beyond float rounding, within the bound)"}
        how = {"ops": " (the derived one op by op)",
               "eager": " (no derived input needed: each decomposition applied runs the kernels eager runs for its "
                        "op, or lays out a view as they do)"
               }.get(self.derived, "")
        text = (f"validation {self.status} on {self.inputs} input set(s){how} against the unlowered program: "
                f"{word.get(self.verdict, self.verdict)}, largest relative difference {self.max_rel:.3g} (wrong beyond {self.bound:.3g}), "
                f"{self.seconds:.2f} s")
        if self.why:
            text += f"; {self.why}"
        for op, why in self.kept.items():
            text += f"; kept {op} undecomposed: {why}"
        return text

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> "Validation | None":
        try:
            if nesting.bracket_depth(text, '"') > 2:  # to_json writes maps of scalars in one map: read no deeper
                return None
            fields = json.loads(text)
            return cls(**{f.name: fields[f.name] for f in dataclasses.fields(cls) if f.name in fields})
        except (ValueError, TypeError, KeyError):
            return None


_RANK = {"exact": 0, "ulp": 1, "lossy": 2, "wrong": 3}


def _called_ops(ep) -> set:
    from ..graph_walk import iter_graphs

    return {n.target for g in iter_graphs(ep.graph_module) for n in g.nodes
            if n.op == "call_function" and isinstance(n.target, torch._ops.OpOverload)}


def _can_draw(node) -> bool:
    """Whether a node of a random op may draw: not a dropout whose ``train`` is False or whose
    probability (``p``, ``dropout_p``) is 0 (an eval-mode model's dropout and attention)."""
    schema = node.target._schema.arguments
    bound = {a.name: a.default_value for a in schema if a.has_default_value()}
    bound.update(zip((a.name for a in schema), node.args))
    bound.update(node.kwargs)
    if bound.get("train", True) is False:
        return False
    return not any(name in bound and bound[name] == 0 and not isinstance(bound[name], torch.fx.Node)
                   for name in ("p", "dropout_p"))


def _random_ops(ep) -> list[str]:
    """The random ops of the program that may draw (_can_draw), by name."""
    from ..graph_walk import iter_graphs

    return sorted({op_name(n.target) for g in iter_graphs(ep.graph_module) for n in g.nodes
                   if n.op == "call_function" and isinstance(n.target, torch._ops.OpOverload)
                   and torch.Tag.nondeterministic_seeded in n.target.tags and _can_draw(n)})


def applied_decompositions(source_ep, table: dict) -> list:
    """The ops of the program the table decomposes, in a stable order (not those the lowering keeps
    whatever the table says: decompose.trace_table)."""
    full = shared_trace_table(table)
    return sorted((op for op in _called_ops(source_ep) if op in table and op in full), key=op_name)


def where_defined(fn) -> str:
    """A decomposition's name in messages: module.qualname."""
    return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', type(fn).__name__)}"


def bounds_for(applied: list, source_ep=None) -> dict:
    """dtype -> the relative difference beyond which an output is wrong. A program with an enabled
    autocast region of a half-precision dtype computes part of its float32 and float64 values in that
    dtype: theirs is then its bound (an op in the region decomposed into steps that each round to
    bfloat16 is 0.1% off the op's one rounding: half precision's rounding, not an error)."""
    from . import verdicts

    extra = 0.0
    stored = verdicts.read()
    for op in applied:
        rec = (stored or {}).get("ops", {}).get(op_name(op), {})
        if rec.get("verdict") == "lossy":
            extra = max(extra, rec.get("worst", {}).get("err_vs_f64", 0.0))
    bounds = {dt: max(limit, extra) for dt, limit in verdicts.WRONG_REL.items()}
    if source_ep is not None:
        for half, depth in rounding_depths(source_ep.graph).items():
            bounds[half] = max(bounds[half], math.sqrt(depth) * torch.finfo(half).eps)
        for half in _autocast_dtypes(source_ep):
            for wide in (torch.float32, torch.float64):
                bounds[wide] = max(bounds[wide], bounds[half])
    return bounds


# Two right implementations of a program in a half-precision dtype each drift from the exact values by
# a rounding at every op that computes a value, and independent roundings grow as the square root of
# their number: a half-precision output's bound is sqrt(depth) machine epsilons of its dtype where that
# is above the audit's line, depth the most value-computing ops on one path from an input to an output.
HALF = (torch.bfloat16, torch.float16)


def rounding_depths(graph: torch.fx.Graph) -> dict:
    """Half-precision dtype -> the most ops computing a value of that dtype on one path of ``graph``
    (views and ops of other dtypes do not round in it, and pass on the roundings before them; a
    subgraph's call counts once)."""
    depth, found = {}, {}
    for node in graph.nodes:
        val = node.meta.get("val")
        here = {dt: max((depth.get(a, {}).get(dt, 0) for a in node.all_input_nodes), default=0) for dt in HALF}
        if node.op == "call_function" and not _views(node):  # rounds what it computes
            for dt in {t.dtype for t in pytree.tree_leaves(val) if isinstance(t, torch.Tensor)} & set(HALF):
                here[dt] += 1
        depth[node] = here
        for dt, n in here.items():
            if n:
                found[dt] = max(found.get(dt, 0), n)
    return found


def _views(node) -> bool:
    """Whether a call returns a view of its input, computing no value: an op whose schema says its
    result may alias an input, unless the result's dtype is another (``to(dtype)`` converts then)."""
    schema = getattr(node.target, "_schema", None)
    if schema is None or not any(r.alias_info is not None for r in schema.returns):
        return False
    first = node.args[0].meta.get("val") if node.args and isinstance(node.args[0], torch.fx.Node) else None
    out = node.meta.get("val")
    return not (isinstance(first, torch.Tensor) and isinstance(out, torch.Tensor) and first.dtype != out.dtype)


def _autocast_dtypes(source_ep) -> set:
    """The half-precision dtypes the program's enabled autocast regions compute in (`torch.autocast` in
    model code, as flat markers or as wrapped bodies)."""
    found = set()
    for node in call_nodes(source_ep.graph_module):
        if is_autocast_marker(node.target):
            _, dtype, enabled = (*node.args, None, None, None)[:3]
            if enabled and dtype in (torch.bfloat16, torch.float16):
                found.add(dtype)
    return found


# Above this many elements a tensor's values are rotated by a random offset instead of shuffled: a
# random permutation of a large weight costs more than the two runs of the program it checks
SHUFFLE_LIMIT = 1 << 20

# The copies a recording run keeps of the values the decomposed ops receive, at most (the calls past it
# are not recorded: a derived input is then checked on the whole programs)
RECORD_LIMIT = 256 << 20

# What checking a decomposition op by op costs per distinct call (its trace on fake tensors, the calls
# run), in seconds, as found on real models (docs/journal/code-notes.md): _derived_at_ops checks a
# derived input op by op where that costs less than BUDGET times
# the two programs' runs on the stored inputs (what running them on the derived input costs)
TRACE_ESTIMATE = 0.025
BUDGET = 1.0


def _derived(inputs):
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


def _written_placeholders(graph) -> set[str]:
    """The names of the placeholders ``graph`` writes in place, directly or through views of them
    (``with torch.no_grad(): self.p.div_(2)``; ``self.p[0].zero_()``)."""
    from ..mutation import is_mutating

    def writes(node):  # the arguments ``node`` writes
        if isinstance(node.target, torch._ops.HigherOrderOperator):  # a region whose body writes its operands:
            subs = [getattr(graph.owning_module, a.target) for a in node.args  # all of them, to be safe
                    if isinstance(a, torch.fx.Node) and a.op == "get_attr"]
            if any(isinstance(g, torch.fx.GraphModule) and _written_placeholders(g.graph) for g in subs):
                return [a for a in pytree.tree_leaves((node.args, node.kwargs))
                        if isinstance(a, torch.fx.Node) and a.op != "get_attr"]
            return []
        if not is_mutating(node.target):
            return []
        return [node.args[i] if i < len(node.args) else node.kwargs.get(a.name)
                for i, a in enumerate(node.target._schema.arguments) if a.alias_info is not None and a.alias_info.is_write]

    out = set()
    for node in graph.nodes:
        if node.op != "call_function":
            continue
        for base in writes(node):
            while isinstance(base, torch.fx.Node) and base.op == "call_function" and base.args and \
                    isinstance(base.target, torch._ops.OpOverload) and base.target._schema.returns and \
                    base.target._schema.returns[0].alias_info is not None:
                base = base.args[0]  # through a view of it
            if isinstance(base, torch.fx.Node) and base.op == "placeholder":
                out.add(base.name)
    return out


class _Runner:
    """Runs the program's graph module on the flat inputs its signature lists, from the program's
    stored state each time (buffers are copied before every run: an unlowered program updates them
    in place), and returns its user outputs. This skips ``ep.module()`` (unlifting its state is a
    large part of a validation, done twice); a program whose signature it cannot bind
    (tokens, script objects) runs through ``ep.module()`` as before. Either way the result is the
    list of output leaves (pytree.tree_leaves), so that the two programs compare leaf by leaf."""

    def __init__(self, ep):
        from torch.export.graph_signature import InputKind

        from ..lifted import Binding, Unbindable

        self.ep, self.module = ep, None
        self.in_spec = ep.call_spec.in_spec
        try:
            binding = Binding(ep)
        except Unbindable:
            self._fallback()
            return
        written = _written_placeholders(ep.graph)
        # per graph input: ("user", None) | ("state", tensor) | ("buffer", tensor: copied before each run)
        self.slots = [("user", None) if value is None
                      else ("buffer", value) if kind == InputKind.BUFFER or name in written  # a parameter written too
                      else ("state", value)
                      for kind, name, value in binding.inputs]
        self.user_outputs = binding.user_outputs

    def _fallback(self):
        self.module = self.ep.module()
        self.state = [(sub, name, buf) for sub in self.module.modules() for name, buf in list(sub._buffers.items())
                      if isinstance(buf, torch.Tensor)]

    def _flat(self, args, kwargs) -> list:
        from .._torch.pytree import fx_pytree

        user = iter(fx_pytree.tree_flatten_spec((args, kwargs), self.in_spec))
        return [next(user) if kind == "user" else value.detach().clone() if kind == "buffer" else value
                for kind, value in self.slots]

    def record(self, inputs, ops, seed: int = 0, limit: int = 8) -> tuple[list, dict]:
        """(the user outputs on ``inputs``, as __call__ gives them; op -> the (args, kwargs) of its first
        ``limit`` calls in the program's own graph, for each op of ``ops`` it calls there), from one run
        (copies of the values, but for the program's unwritten weights, which are shared; no more than
        RECORD_LIMIT bytes of copies, the calls past it left out). A program run through ep.module()
        records nothing ({})."""
        if self.module is not None:
            return self(inputs, seed), {}
        ops, calls = set(ops), {}
        shared = {id(value) for kind, value in self.slots if kind == "state"}
        room = [RECORD_LIMIT]

        def copied(v) -> bool:
            return isinstance(v, torch.Tensor) and id(v) not in shared

        def keep(v):
            return v.detach().clone() if copied(v) else v

        class Recorder(torch.fx.Interpreter):
            def call_function(self, target, args, kwargs):
                if target in ops and len(calls.setdefault(target, [])) < limit:
                    leaves = pytree.tree_leaves((args, kwargs))
                    need = sum(v.numel() * v.element_size() for v in leaves if copied(v))
                    # (a call inside a vmap region receives batched tensors, which mean nothing outside it)
                    if need <= room[0] and not any(isinstance(v, torch.Tensor) and _wrapped(v) for v in leaves):
                        room[0] -= need
                        calls[target].append(pytree.tree_map(keep, (args, kwargs)))
                return super().call_function(target, args, kwargs)

        args, kwargs = copy.deepcopy(inputs)
        torch.manual_seed(seed)
        with torch.no_grad():
            out = Recorder(self.ep.graph_module).run(*self._flat(args, kwargs))
        return self._user(out), {op: c for op, c in calls.items() if c}

    def _user(self, out) -> list:
        out = out if isinstance(out, (list, tuple)) else [out]
        return [out[i] for i in self.user_outputs]  # the leaves, as tree_leaves gives (None included)

    def __call__(self, inputs, seed: int = 0):
        args, kwargs = copy.deepcopy(inputs)
        torch.manual_seed(seed)
        with torch.no_grad():
            if self.module is not None:
                for sub, name, buf in self.state:
                    sub._buffers[name] = buf.detach().clone()
                return pytree.tree_leaves(self.module(*args, **kwargs))
            return self._user(self.ep.graph_module(*self._flat(args, kwargs)))


def _wider(dtype: torch.dtype) -> torch.dtype:
    """The dtype a widened run computes ``dtype``'s values in: half precision in float32 (complex32 in
    complex64); others as they are."""
    return torch.float32 if dtype in HALF else torch.complex64 if dtype == torch.complex32 else dtype


def _widen(v):
    if isinstance(v, torch.Tensor) and _wider(v.dtype) != v.dtype:
        return v.to(_wider(v.dtype))
    return _wider(v) if isinstance(v, torch.dtype) else v


def widened_run(ep, inputs) -> list | None:
    """The user outputs of ``ep`` on ``inputs`` with its half-precision values computed in float32 (its
    inputs and state converted once, each dtype an op is given widened, each result widened where an
    op still makes one in half precision): a reference nearer the exact values than the program's own
    run, to tell rounding from a wrong lowering. None where the program does not run so (dtypes mixed
    where an op needs one)."""
    from .._torch.dispatch import TorchDispatchMode

    class Widened(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **pytree.tree_map(_widen, kwargs or {}))
            return pytree.tree_map(_widen, out)

    runner = _Runner(ep)
    if runner.module is not None:
        return None
    args, kwargs = copy.deepcopy(inputs)
    try:
        flat = [_widen(v) for v in runner._flat(args, kwargs)]
        with torch.no_grad(), Widened():
            return runner._user(ep.graph_module(*flat))
    except Exception:  # noqa: BLE001 -- not runnable wider: nothing told
        return None


def rounding_explains(source_ep, failure: "Validation") -> bool:
    """Whether the lowered outputs of a failed comparison are as near the exact values as the unlowered
    program's own are, on the inputs it failed on (a run in float32 stands for the exact values): within
    twice the unlowered program's distance from it, on every float output. Then the difference between
    the two programs is rounding each makes, not a wrong lowering. Asked only of half-precision outputs
    (a float32 program's reference would be a float64 run, which costs many times a float32 one on a
    CPU, a float64 convolution most); False where the widened run cannot be made or any output is
    farther."""
    from . import verdicts

    inputs, want = failure.failed_on
    got = getattr(failure, "failed_got", None)
    differs = [b for a, b in zip(got or [], want) if isinstance(b, torch.Tensor) and b.is_floating_point()
               and not torch.equal(a, b)]
    if got is None or not differs or any(b.dtype not in HALF for b in differs):
        return False
    exact = widened_run(source_ep, inputs)
    if exact is None or len(exact) != len(want) or len(got) != len(want):
        return False
    for a, b, c in zip(got, want, exact):
        if not isinstance(b, torch.Tensor) or not b.is_floating_point() or torch.equal(a, b):
            continue
        ours, theirs = verdicts.relative_difference(a, c), verdicts.relative_difference(b, c)
        if not (theirs > 0 and ours <= 2 * theirs):
            return False
    return True


def _wrapped(t: torch.Tensor) -> bool:
    """Whether ``t`` is a functorch wrapper (a batched tensor of a vmap region, a grad-tracking one)."""
    return torch._C._functorch.is_functorch_wrapped_tensor(t)


def _same(a, b) -> bool:
    return all(torch.equal(x, y) if isinstance(x, torch.Tensor) else x == y
               for x, y in zip(pytree.tree_leaves(a), pytree.tree_leaves(b)))


def _output_bound(want, bounds: dict) -> float:
    """The bound of the outputs' float dtype (the widest bound where they mix): what describe() names."""
    found = [bounds.get(t.dtype, 1e-3) for t in pytree.tree_leaves(want)
             if isinstance(t, torch.Tensor) and t.is_floating_point()]
    return max(found) if found else bounds[torch.float32]


def _compare(got, want, bounds: dict) -> tuple[str, float, str]:
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


# A dynamic dim of the stored example inputs is validated at this size (at least its lower bound and 2):
# the lowered graph is one graph for every size in the dim's range (the lowering traces it symbolically),
# so a smaller input runs the same decompositions, in a fraction of the two programs' time
CUT_TO = 8


def smaller_inputs(source_ep):
    """The stored example inputs with each dynamic dim cut to CUT_TO (the first elements: the stored
    values), each dim derived from others (``s0 + 1``) to its expression's value; None where nothing is
    cut, a dim's expression names a symbol no input dim is, or a cut size is outside the stored one."""
    stored = source_ep.example_inputs
    if stored is None:
        return None
    flat, spec = pytree.tree_flatten(stored)
    names = set(source_ep.graph_signature.user_inputs)
    vals = [n.meta.get("val") for n in source_ep.graph.nodes if n.op == "placeholder" and n.name in names]
    if len(vals) != len(flat):
        return None
    dims = [(k, d, size.node.expr, real) for k, (val, x) in enumerate(zip(vals, flat))
            if isinstance(val, torch.Tensor) and isinstance(x, torch.Tensor) and val.dim() == x.dim()
            for d, (size, real) in enumerate(zip(val.shape, x.shape)) if isinstance(size, torch.SymInt)]
    chosen = {}
    for _, _, expr, real in dims:
        if getattr(expr, "is_Symbol", False):
            bounds = source_ep.range_constraints.get(expr)
            low = int(bounds.lower) if bounds is not None and bounds.lower.is_finite else 0
            chosen[expr] = max(low, 2, min(real, CUT_TO)) if real > CUT_TO else real
    cuts = {}
    for k, d, expr, real in dims:
        if not expr.free_symbols <= set(chosen):
            return None
        size = expr.subs(chosen)
        if not size.is_Integer or not 0 < int(size) <= real:
            return None
        if int(size) < real:
            cuts.setdefault(k, []).append((d, int(size)))
    if not cuts:
        return None
    for k, along in cuts.items():
        x = flat[k]
        for d, size in along:
            x = x.narrow(d, 0, size)
        flat[k] = x.detach().clone().requires_grad_(flat[k].requires_grad)
    return pytree.tree_unflatten(flat, spec)


class SourceRuns:
    """The unlowered program's side of a validation, computed once and shared by every validation of
    one request (the first, the one after a repair, the bisection's steps): its outputs on each input
    set (the stored example inputs, their dynamic dims cut to CUT_TO where the program runs on that
    (``cut``: those inputs, else None), and one derived from them; or the sets given with their outputs),
    each ("ok", outputs), ("random", None) where a second seed changes them, or ("error", exception),
    computed when first asked for (``result(i)``). The run on the stored inputs records the values the
    first calls of each op of ``record`` receive (``recorded``; the decomposed ops) and its time
    (``seconds``): what a check of the derived input op by op works on, and what it must cost less than.
    (Run in a thread beside the lowering instead, they made the default lowering slower on 2 cores:
    the kernels and the trace contend for the cores.)"""

    def __init__(self, source_ep, input_sets=None, wanted=None, record=()):
        self.ep, self.random, self.cut = source_ep, _random_ops(source_ep), None
        self.record, self.recorded, self.seconds, self._runner = list(record), None, 0.0, None
        self.given = input_sets is not None
        if self.given:  # with the outputs source_ep gave on them
            self.inputs = list(input_sets)
            self._results = [("ok", w) for w in wanted]
        else:  # the stored inputs, cut along their dynamic dims; the derived set made when first needed
            self.cut = smaller_inputs(source_ep)
            self.inputs = [self.cut or source_ep.example_inputs, None]
            self._results = []

    def result(self, i: int) -> tuple:
        """(outcome, outputs) of input set ``i`` (validate asks for the next set only after an "ok")."""
        while len(self._results) <= i:
            self._results.append(self._run(len(self._results)))
        return self._results[i]

    def _run(self, i: int) -> tuple:
        self._runner = self._runner or _Runner(self.ep)
        if i == 0 and self.cut is not None:
            outcome = self._ran(0)
            if outcome[0] != "error":
                return outcome
            self.inputs[0], self.cut = self.ep.example_inputs, None  # outside the program's domain: the stored
        return self._ran(i)

    def _ran(self, i: int) -> tuple:
        try:
            if self.inputs[i] is None:
                self.inputs[i] = _derived(self.inputs[0])
            if i == 0:
                t = time.perf_counter()
                want, self.recorded = self._runner.record(self.inputs[0], self.record)
                self.seconds = time.perf_counter() - t
                # an op that can draw (dropout, sdpa) may draw nothing (eval mode): a second seed tells
                if self.random and not _same(want, self._runner(self.inputs[0], seed=1)):
                    return "random", None
            else:
                want = self._runner(self.inputs[i])
            return "ok", want
        except Exception as e:  # noqa: BLE001 -- a derived input outside the program's domain (its own checks)
            return "error", e


def validate(source_ep, lowered_ep, table: dict, runs: SourceRuns | None = None) -> Validation:
    """Run ``lowered_ep`` on the stored example inputs (cut along dynamic dims: smaller_inputs) and compare
    with ``source_ep``'s outputs on them;
    then check a derived input, where a decomposition applied needs one: op by op where that costs less
    (_derived_at_ops), else by running both programs on it (docs/lowering.md#a-lowering-is-validated-on-the-artifacts-own-inputs). ``runs``
    given: on its input sets."""
    t0 = time.perf_counter()
    if source_ep.example_inputs is None:
        return Validation("skipped", why="the artifact stores no example inputs")
    applied = applied_decompositions(source_ep, table)
    bounds = bounds_for(applied, source_ep)
    result = Validation("passed", verdict="exact", bound=bounds[torch.float32])
    runs, theirs = runs or SourceRuns(source_ep, record=applied), None
    t_lowered = 0.0
    for i in range(len(runs.inputs)):
        if i == 1 and not runs.given:
            local = _derived_at_ops(runs, applied, table, bounds, budget=BUDGET * (runs.seconds + t_lowered))
            if local is not None:
                local, checked = local
                if not checked:  # each lowered form right whatever the values: nothing a derived input finds
                    result.derived = "eager"
                    break
                result.inputs += 1
                result.derived = "ops"
                wrong = [op for op in applied if op in local and local[op][0] is None]
                if wrong:
                    result.status, result.verdict = "failed", "wrong"
                    result.why = f"on a derived input, where {op_name(wrong[0])} runs: {local[wrong[0]][1]}"
                    result.culprits = wrong  # (not a field: for repair.validated())
                break
            result.derived = "program"
        outcome, want = runs.result(i)
        if outcome == "random":
            return Validation("skipped", why=f"the program's outputs are random ({', '.join(runs.random[:3])})",
                              seconds=time.perf_counter() - t0)
        if outcome == "error":
            if i == 0:
                return Validation("skipped", why="the unlowered program does not run on its example inputs",
                                  seconds=time.perf_counter() - t0)
            continue
        if i == 0:  # "wrong beyond" in the outputs' dtype: 0.05 for bfloat16, not float32's 0.001
            result.bound = _output_bound(want, bounds)
        inputs = runs.inputs[i]
        try:
            theirs = theirs or _Runner(lowered_ep)
            t = time.perf_counter()
            got = theirs(inputs)
            t_lowered = time.perf_counter() - t
        except Exception as e:  # noqa: BLE001 -- the lowered program fails where the unlowered one runs
            got = None
            verdict, rel, why = "wrong", float("inf"), f"the lowered program raises {type(e).__name__}: {str(e)[:200]}"
        else:
            verdict, rel, why = _compare(got, want, bounds)
        result.inputs += 1
        result.max_rel = max(result.max_rel, rel)
        if _RANK[verdict] > _RANK[result.verdict]:
            result.verdict = verdict
        if verdict == "wrong":
            result.status = "failed"
            result.why = ("on the stored example inputs: " if i == 0 else "on the derived input: ") + why
            result.failed_on = inputs, want  # (not a field: the inputs and the source's outputs, for validated())
            result.failed_got = got  # (the lowered outputs, None where it raised: for rounding_explains)
            break
    result.seconds = time.perf_counter() - t0
    return result


class _Decomposed:
    """Calls of decompositions as the lowering computes them: ``fn`` traced with the table applied to
    every op it calls in turn (the lowered form of one call), then run. A trace on fake tensors is kept
    per call signature (shapes, dtypes, strides and non-tensor arguments), so the calls of a repeated
    layer are traced once; a call that cannot be traced on fake tensors (its decomposition reads
    values) is traced on its own values, and one that cannot be traced at all runs fn as it is."""

    def __init__(self, table: dict):
        self.table, self.traced = table, {}

    @staticmethod
    def _split(args, kwargs):
        flat, spec = pytree.tree_flatten((args, kwargs))
        return flat, spec, [i for i, v in enumerate(flat) if isinstance(v, torch.Tensor)]

    def key(self, fn, args, kwargs):
        """What makes two calls of ``fn`` trace alike (None: no stable key, traced on their values)."""
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
        flat, spec, at = self._split(args, kwargs)

        def call(*tensors):
            values = list(flat)
            for i, t in zip(at, tensors):
                values[i] = t
            a, k = pytree.tree_unflatten(values, spec)
            return fn(*a, **k)

        tensors = [flat[i] for i in at]
        key = self._key(fn, flat, spec, at)
        gm = self.traced.get(key) if key is not None else None
        if gm is None:
            with LOCK:  # (a trace in another thread, another lowering's, sees this one's modes otherwise)
                gm = self._trace(call, tensors, key)
            if gm is None:
                return call(*tensors)
        return gm(*tensors)

    def _trace(self, call, tensors, key):
        """``call`` traced with the table, on fake tensors, else on ``tensors``; None where it cannot be."""
        from torch.fx.experimental.proxy_tensor import make_fx

        try:
            gm = make_fx(call, decomposition_table=self.table, tracing_mode="fake")(*tensors)
            if key is not None:
                self.traced[key] = gm
            return gm
        except Exception:  # noqa: BLE001 -- a decomposition that reads values: traced on these
            try:
                return make_fx(call, decomposition_table=self.table)(*[t.clone() for t in tensors])
            except Exception:  # noqa: BLE001 -- a call make_fx cannot trace: its first-level decomposition runs
                return None


def _check_call(op, fn, decomposed: _Decomposed, args, kwargs, bounds: dict) -> tuple[str, float, str] | None:
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
            torch.manual_seed(0)  # (an op that draws, drawing as the program's run does: same seed both sides)
            want = op(*want_in[0], **want_in[1])
        except Exception:  # noqa: BLE001 -- the op's own check
            return None
        try:
            torch.manual_seed(0)
            got = decomposed(fn, *got_in)
        except Exception as e:  # noqa: BLE001 -- this check cannot run it (the lowering's own trace did)
            return "error", float("inf"), f"its decomposition raises {type(e).__name__}: {str(e)[:200]}"
    if got is NotImplemented:  # the entry declines this call: the lowering keeps the op there
        return None
    if writes:
        want, got = (want, want_in), (got, got_in)
    if _uninitialized(op):  # its values are whatever memory held: the layout is all there is to compare
        want, got = (pytree.tree_map_only(torch.Tensor, torch.zeros_like, x) for x in (want, got))
    try:
        return _compare(got, want, bounds)
    except Exception as e:  # noqa: BLE001 -- values this cannot compare (float8 has no equal on CPU): nothing known
        return "error", float("inf"), f"its values cannot be compared here ({type(e).__name__}: {str(e)[:200]})"


def _uninitialized(op) -> bool:
    """Whether ``op`` returns memory it does not fill (aten::empty, empty_like, new_empty_strided, ...)."""
    return op.__name__.split(".")[0] in {"empty", "empty_like", "new_empty", "empty_strided", "new_empty_strided",
                                         "empty_permuted"}


def right_where_they_run(source_ep, ops, table: dict, bounds: dict, inputs, recorded: dict | None = None) -> dict:
    """op -> the largest relative difference of its decomposition (``table[op]``, lowered further with
    ``table``) from op itself on the values op receives when the program runs on ``inputs`` (its first
    calls, ``recorded`` where they are known already), or None where it is wrong on one (the
    decomposition is wrong where it runs). Ops not recorded (called in a subgraph only, or a program
    run through ep.module()) are left out."""
    full = shared_trace_table(table)  # each entry as the lowering applies it
    out, decomposed = {}, _Decomposed(full)
    if recorded is None:
        try:
            _, recorded = _Runner(source_ep).record(inputs, ops)
        except Exception:  # noqa: BLE001 -- not recorded: nothing known
            return out
    for op, calls in recorded.items():
        if op not in ops:
            continue
        for args, kwargs in calls:
            checked = _check_call(op, full[op], decomposed, args, kwargs, bounds)
            if checked is None:  # (the op ran on these values in the program, or the lowering keeps this call)
                continue
            verdict, rel, _ = checked
            if verdict == "error":  # not known: left out, as an op not recorded is
                out.pop(op, None)
                break
            out[op] = None if verdict == "wrong" else max(out.get(op, 0.0), rel)
            if out[op] is None:
                break
    return out


def _derived_at_ops(runs: SourceRuns, applied: list, table: dict, bounds: dict, budget: float) -> tuple | None:
    """(op -> (largest relative difference, "") or (None, why it is wrong), the ops checked): each
    decomposition applied against its op on the values the op's first calls received in the run on
    the stored inputs, each tensor's values permuted (_derived): the derived input, checked where the
    decompositions run; not those whose lowered form is right whatever the values (_value_free). None
    where this cannot stand for running both programs on a derived input (no op is decomposed, or an
    op applied was not recorded: it runs in a subgraph, or the recording was full), or costs more than
    ``budget`` seconds (the traces, TRACE_ESTIMATE each by the count of distinct calls, or as measured
    on the way; past it, finished where the calls left cost less than ``budget`` at the rate measured)."""
    from .._torch.dispatch import FakeTensorMode

    t0 = time.perf_counter()
    recorded = runs.recorded
    if not applied or recorded is None or any(op not in recorded for op in applied):
        return None  # (no decomposition applied: what the derived input checks is the rest of the lowering)
    full = shared_trace_table(table)  # each entry as the lowering applies it
    decomposed = _Decomposed(full)
    mode = FakeTensorMode()
    needed = [op for op in applied if not _value_free(op, table[op], full, recorded[op], decomposed, mode)]
    if not needed:
        return {}, needed
    keys = {decomposed.key(full[op], *call) for op in needed for call in recorded[op]}
    if len(keys) * TRACE_ESTIMATE > budget - (time.perf_counter() - t0):
        return None
    out, deadline = {}, budget
    for op in needed:
        fn = full[op]
        for args, kwargs in recorded[op]:
            spent = time.perf_counter() - t0
            if spent > deadline:  # past the estimate: finish where what is left costs less than the programs
                done = len(decomposed.traced)
                left = spent / done * max(len(keys) - done, 0) if done else float("inf")
                if deadline > budget or left > budget:  # (extended once already, or finishing costs more)
                    return None
                deadline = spent + 2 * left
            try:
                derived = _derived((args, kwargs))
            except Exception:  # noqa: BLE001 -- values this cannot permute: the whole programs run instead
                return None
            checked = _check_call(op, fn, decomposed, *derived, bounds)
            if checked is None:  # permuted values outside the op's own domain: not a check
                continue
            verdict, rel, why = checked
            if verdict == "error":  # the whole programs run on the derived input instead
                return None
            if verdict == "wrong":
                where = where_defined(table[op])  # (the table's entry, as the user or the preset gave it)
                out[op] = (None, f"its decomposition ({where}) differs from it: {why or 'a value differs'}")
                break
            out[op] = (max(out.get(op, (0.0,))[0], rel), "")
    return out, needed


def _eagers_own(op, fn) -> bool:
    """Whether ``fn`` is op's own CompositeImplicitAutograd kernel as torch's table holds it
    (functionalize.runs_cia_kernel: the lowering's trace runs that C++ kernel, and the ops it calls from
    C++ are decomposed by their own C++ kernels too, as in eager), and the code eager runs for op: op
    has no kernel of a device's own (native_channel_shuffle has a CPU one, which eager runs instead)."""
    from ..functionalize import runs_cia_kernel

    has = torch._C._dispatch_has_kernel_for_dispatch_key
    return (runs_cia_kernel(fn) and fn.keywords.get("kernel") is op
            and has(op.name(), "CompositeImplicitAutograd") and not has(op.name(), "CPU") and not has(op.name(), "CUDA"))


def _same_layout_view(want, got) -> bool:
    """Whether ``got`` and ``want`` are each the same view of the same storage (shape, strides, offset):
    the same elements whatever they hold. Two values computed anew are not (each has its own storage)."""
    w, g = pytree.tree_leaves(want), pytree.tree_leaves(got)
    return len(w) == len(g) and all(
        isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor) and x.shape == y.shape and x.dtype == y.dtype
        and x.stride() == y.stride() and x.storage_offset() == y.storage_offset()
        and x.untyped_storage()._cdata == y.untyped_storage()._cdata for x, y in zip(w, g))


def _value_free(op, fn, full: dict, calls: list, decomposed: _Decomposed, mode=None) -> bool:
    """Whether op's lowered form computes what op does whatever the values, on the shapes of ``calls``,
    as told on fake tensors (shapes, no values): ``fn`` is eager's own kernel for op (_eagers_own), or op
    is not a composite one, and every op that eager dispatches for op and the table decomposes (op
    itself, where it is not composite) returns a view its decomposition lays out as the op's own
    kernel does (the same elements of the same storage, whatever they hold: linear's t, which the
    lowering makes a permute; transpose), and the same ops with the Python dispatcher on as without it
    (a trace may run the Python kernel matmul has where eager runs C++); or no call has a tensor
    argument (arange). A derived input
    can find nothing wrong there that the stored one does not (a trace cannot branch on values). False
    where this cannot be told, for an op that writes in place, and for any that computes values anew.
    ``mode``: the FakeTensorMode to run in (one for all the ops of a program: the weights made fake once)."""
    from .._torch.dispatch import FakeTensorMode, TorchDispatchMode, enable_python_dispatcher
    from ..mutation import is_mutating

    if not any(isinstance(v, torch.Tensor) for call in calls for v in pytree.tree_leaves(call)):
        return True  # (arange, ones: the derived input gives these calls the arguments the stored one did)
    if is_mutating(op) or not (_eagers_own(op, fn) or not torch._C._dispatch_has_kernel_for_dispatch_key(
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
                    if got is not NotImplemented and not _same_layout_view(out, got):
                        bad.append(func)
            return out

    done = set()
    for args, kwargs in calls:
        key = decomposed.key(fn, args, kwargs)
        if key is not None and key in done:
            continue
        done.add(key)
        try:
            mode = mode or FakeTensorMode()
            with LOCK, mode:
                fake = pytree.tree_map_only(torch.Tensor, mode.from_tensor, (args, kwargs))
                with Views():
                    op(*fake[0], **fake[1])
                plain, seen[:] = list(seen), []
                # a trace may run the Python kernels some composite ops have (matmul's) where eager runs
                # C++: the same calls either way, or not known (the decompositions' own calls included:
                # the second run checks the layouts again so that its calls compare with the first's)
                with enable_python_dispatcher(), Views():
                    op(*fake[0], **fake[1])
        except Exception:  # noqa: BLE001 -- not known: checked as any other
            return False
        if bad or key is None or seen != plain:
            return False
        seen.clear()
    return True
