"""Validation of a lowering on the artifact's own inputs: load_for_backend runs the lowered and the
unlowered program on the stored example inputs and compares their outputs in the audit's words
(verdicts.py), then checks a permuted second input op by op or on both programs, whichever costs
less, for the decompositions not right whatever the values (value_free); on a wrong output it
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
from .decompose import shared_trace_table
from ..graph_walk import call_nodes
from ..shared.regions import is_autocast_marker
from ..ops import op_name
from ..util import nesting
from .random_draws import drawing_ops
from .op_checks import (RANK, Decomposed, check_call, compare, is_wrapped, permuted, same, user_input_values,
                        value_free, where_defined, seed as seed_runs)

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
    # they do: value_free); "" where it was not
    derived: str = ""
    seconds: float = 0.0
    why: str = ""  # what failed, or why it was skipped
    kept: dict = dataclasses.field(default_factory=dict)  # op -> why, kept undecomposed after a failure
    # where the outputs differ beyond the bound although every decomposition applied is right on the values
    # its op receives in this program (the program amplifies rounding): op -> that largest relative
    # difference, for the (up to three) ops that differ most there
    amplified: dict = dataclasses.field(default_factory=dict)
    # "program": both programs ran on the input sets; "ops": their runs would cost more than the lowering,
    # and each decomposition applied was checked against its op call by call instead (op_checks.py)
    scope: str = "program"
    calls: int = 0  # (scope "ops") the distinct calls checked

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
        if self.scope == "ops":
            text = (f"validation {self.status} op by op: each decomposition applied against its op on {self.calls} "
                    f"distinct call(s) of the program's shapes, on values computed from its inputs where cheap and "
                    f"drawn elsewhere, and on those values permuted (the two programs' runs would cost more than "
                    f"the lowering): {word.get(self.verdict, self.verdict)}, largest relative difference "
                    f"{self.max_rel:.3g} (wrong beyond {self.bound:.3g}), {self.seconds:.2f} s")
            return text + (f"; {self.why}" if self.why else "")
        how = {"ops": " (the derived one op by op)",
               "eager": " (no derived input needed: each decomposition applied runs the kernels eager runs for its "
                        "op, lays out a view as they do, or writes back what eager's kernel computes)"
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


def _called_ops(ep) -> set:
    from ..graph_walk import iter_graphs

    return {n.target for g in iter_graphs(ep.graph_module) for n in g.nodes
            if n.op == "call_function" and isinstance(n.target, torch._ops.OpOverload)}


def applied_decompositions(source_ep, table: dict) -> list:
    """The ops of the program the table decomposes, in a stable order (not those the lowering keeps
    whatever the table says: decompose.trace_table)."""
    full = shared_trace_table(table)
    return sorted((op for op in _called_ops(source_ep) if op in table and op in full), key=op_name)


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

# The copies a recording run keeps of the values the decomposed ops receive, at most (the calls past it
# are not recorded: a derived input is then checked on the whole programs)
RECORD_LIMIT = 256 << 20

# What checking a decomposition op by op costs per distinct call (the op and its lowered form run on the
# call's values, then on them permuted), in seconds, as found on real models (docs/journal/code-notes.md):
# _derived_at_ops checks a derived input op by op where that costs less than BUDGET times
# the two programs' runs on the stored inputs (what running them on the derived input costs)
CHECK_ESTIMATE = 0.01
BUDGET = 1.0

# What validating on the programs costs, in runs of each program as run_cost estimates them: both
# programs on the stored inputs and, where a decomposition needs it, on a derived input (the lowered
# program priced on its own: a decomposed attention writes its score matrices where the op does not)
PROGRAM_RUNS = 2
# Runs estimated to cost less than this are made whatever the lowering cost (an estimate this small is
# mostly per-call overhead the count of FLOPs and bytes leaves out)
RUNS_ALWAYS = 0.02


def _written_placeholders(graph) -> set[str]:
    """The names of the placeholders ``graph`` writes in place, directly or through views of them
    (``with torch.no_grad(): self.p.div_(2)``; ``self.p[0].zero_()``)."""
    from ..mutation import written_args

    def writes(node):  # the arguments ``node`` writes
        if isinstance(node.target, torch._ops.HigherOrderOperator):  # a region whose body writes its operands:
            subs = [getattr(graph.owning_module, a.target) for a in node.args  # all of them, to be safe
                    if isinstance(a, torch.fx.Node) and a.op == "get_attr"]
            if any(isinstance(g, torch.fx.GraphModule) and _written_placeholders(g.graph) for g in subs):
                return [a for a in pytree.tree_leaves((node.args, node.kwargs))
                        if isinstance(a, torch.fx.Node) and a.op != "get_attr"]
            return []
        return written_args(node)

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
                    if need <= room[0] and not any(isinstance(v, torch.Tensor) and is_wrapped(v) for v in leaves):
                        room[0] -= need
                        calls[target].append(pytree.tree_map(keep, (args, kwargs)))
                return super().call_function(target, args, kwargs)

        out = self._interpreted(Recorder, inputs, seed)
        return self._user(out), {op: c for op, c in calls.items() if c}

    def perturbed(self, inputs, scales: dict, seed: int = 0) -> list | None:
        """The user outputs on ``inputs`` with each float result of a call to an op of ``scales`` (op ->
        relative size) moved by that size times a seeded uniform draw in [-1, 1] per element, relative to
        magnitudes above 1 and absolute below (amplification_explains); an op writing in place moves what
        it writes. None for a program run through ep.module()."""
        from ..mutation import is_mutating

        if self.module is not None:
            return None
        gen = torch.Generator().manual_seed(seed)

        def moved(v, scale, in_place):
            if not isinstance(v, torch.Tensor) or not v.is_floating_point() or v.numel() == 0:
                return v
            draw = torch.rand(v.shape, generator=gen, dtype=torch.float32).mul_(2).sub_(1)
            step = (draw * v.detach().float().abs().clamp_min(1.0) * scale).to(v.dtype)
            return v.add_(step) if in_place else v + step

        class Perturbed(torch.fx.Interpreter):
            def call_function(self, target, args, kwargs):
                out = super().call_function(target, args, kwargs)
                if target in scales:
                    in_place = is_mutating(target)
                    out = pytree.tree_map(lambda v: moved(v, scales[target], in_place), out)
                return out

        return self._user(self._interpreted(Perturbed, inputs, seed))

    def _interpreted(self, interpreter, inputs, seed: int):
        """The graph's outputs on (a copy of) ``inputs``, run node by node by ``interpreter`` (a
        torch.fx.Interpreter class), seeded, without grad."""
        args, kwargs = copy.deepcopy(inputs)
        seed_runs(seed)
        with torch.no_grad():
            return interpreter(self.ep.graph_module).run(*self._flat(args, kwargs))

    def _user(self, out) -> list:
        out = out if isinstance(out, (list, tuple)) else [out]
        return [out[i] for i in self.user_outputs]  # the leaves, as tree_leaves gives (None included)

    def __call__(self, inputs, seed: int = 0):
        args, kwargs = copy.deepcopy(inputs)
        seed_runs(seed)
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
    rel = verdicts.relative_difference
    return all(_within_twice(rel(a, c), rel(b, c)) for a, b, c in _differing_floats(got, want, exact))


def _differing_floats(got: list, want: list, other: list) -> list:
    """(lowered, unlowered, ``other``'s) output of each float output where the lowered and unlowered differ."""
    return [(a, b, c) for a, b, c in zip(got, want, other)
            if isinstance(b, torch.Tensor) and b.is_floating_point() and not torch.equal(a, b)]


def _within_twice(ours: float, theirs: float) -> bool:
    """Whether the lowered program's distance is at most twice the unlowered one's, which is above 0: the
    rounding both make (rounding_explains, amplification_explains)."""
    return theirs > 0 and ours <= 2 * theirs


def amplification_explains(source_ep, failure: "Validation", local: dict, seed: int = 0) -> bool:
    """Whether the unlowered program itself moves its outputs as far as the lowering did when each call of
    a decomposed op is given a difference of the size its decomposition makes (``local``: op -> the largest
    relative difference found where it runs; those above 0 are given it): one run of the unlowered program
    on the inputs it failed on, each such call's float result moved by that relative difference times a
    seeded draw in [-1, 1] per element (relative to magnitudes above 1, absolute below, as differences
    are measured). Where the lowered outputs are within twice that run's distance, on every float output
    that differs, the program amplifies rounding-sized differences this far: the lowering's difference is
    theirs, not a wrong lowering. One run, where the lowering that keeps every decomposition costs a
    lowering and a run; False where the run cannot be made, no decomposition differs, or an output is
    farther."""
    from . import verdicts

    inputs, want = failure.failed_on
    got = getattr(failure, "failed_got", None)
    scales = {op: rel for op, rel in local.items() if rel is not None and rel > 0}
    if got is None or not scales or len(got) != len(want):
        return False
    try:
        moved = _Runner(source_ep).perturbed(inputs, scales, seed)
    except Exception:  # noqa: BLE001 -- not run: nothing told
        return False
    if moved is None or len(moved) != len(want):
        return False
    differing, rel = _differing_floats(got, want, moved), verdicts.relative_difference
    return bool(differing) and all(_within_twice(rel(a, b), rel(c, b)) for a, b, c in differing)


def _output_bound(want, bounds: dict) -> float:
    """The bound of the outputs' float dtype (the widest bound where they mix): what describe() names."""
    found = [bounds.get(t.dtype, 1e-3) for t in pytree.tree_leaves(want)
             if isinstance(t, torch.Tensor) and t.is_floating_point()]
    return max(found) if found else bounds[torch.float32]


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
    vals = user_input_values(source_ep)
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
        self.ep, self.random, self.cut = source_ep, drawing_ops(source_ep), None
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
                self.inputs[i] = permuted(self.inputs[0])
            if i == 0:
                t = time.perf_counter()
                want, self.recorded = self._runner.record(self.inputs[0], self.record)
                self.seconds = time.perf_counter() - t
                # an op that can draw (dropout, sdpa) may draw nothing (eval mode): a second seed tells
                if self.random and not same(want, self._runner(self.inputs[0], seed=1)):
                    return "random", None
            else:
                want = self._runner(self.inputs[i])
            return "ok", want
        except Exception as e:  # noqa: BLE001 -- a derived input outside the program's domain (its own checks)
            return "error", e


def validate(source_ep, lowered_ep, table: dict, runs: SourceRuns | None = None, budget: float | None = None
             ) -> Validation:
    """Run ``lowered_ep`` on the stored example inputs (cut along dynamic dims: smaller_inputs) and compare
    with ``source_ep``'s outputs on them;
    then check a derived input, where a decomposition applied needs one: op by op where that costs less
    (_derived_at_ops), else by running both programs on it (docs/lowering.md#a-lowering-is-validated-on-the-artifacts-own-inputs). ``runs``
    given: on its input sets. ``budget`` (seconds: the lowering's own time): where the two runs are
    estimated to cost more, each decomposition is checked call by call instead, where that can speak
    for them (_by_ops)."""
    t0 = time.perf_counter()
    if source_ep.example_inputs is None:
        return Validation("skipped", why="the artifact stores no example inputs")
    applied = applied_decompositions(source_ep, table)
    bounds = bounds_for(applied, source_ep)
    result = Validation("passed", verdict="exact", bound=bounds[torch.float32])
    runs, theirs = runs or SourceRuns(source_ep, record=applied), None
    if budget is not None and not runs.given:
        by_ops = _by_ops(source_ep, lowered_ep, applied, table, bounds, budget, runs.inputs[0])
        if by_ops is not None:
            by_ops.seconds = time.perf_counter() - t0
            return by_ops
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
            verdict, rel, why = compare(got, want, bounds)
        result.inputs += 1
        result.max_rel = max(result.max_rel, rel)
        if RANK[verdict] > RANK[result.verdict]:
            result.verdict = verdict
        if verdict == "wrong":
            result.status = "failed"
            result.why = ("on the stored example inputs: " if i == 0 else "on the derived input: ") + why
            result.failed_on = inputs, want  # (not a field: the inputs and the source's outputs, for validated())
            result.failed_got = got  # (the lowered outputs, None where it raised: for rounding_explains)
            break
    result.seconds = time.perf_counter() - t0
    return result


def _by_ops(source_ep, lowered_ep, applied: list, table: dict, bounds: dict, budget: float, inputs
            ) -> Validation | None:
    """The Validation of checking each decomposition applied call by call (op_checks.check_calls), where the
    programs' runs (PROGRAM_RUNS of each on ``inputs``, as run_cost estimates them) cost more
    than ``budget`` and the checks (CHECK_ESTIMATE per distinct call) less; None where the runs fit,
    or the checks cannot speak for them: no decomposition applied, a program that draws random values
    or writes its state or inputs back (what functionalization does there is the programs' to show),
    an op in a subgraph, a value that cannot be drawn."""
    from ..functionalize import forced_decompositions
    from . import run_cost
    from .op_checks import check_calls, input_sizes, signatures

    if not applied or drawing_ops(source_ep) or _has_autocast(source_ep):
        return None  # (a call in an autocast region computes in its dtype: the program's run knows where)
    sig = source_ep.graph_signature
    if sig.buffers_to_mutate or sig.user_inputs_to_mutate or _written_placeholders(source_ep.graph):
        return None
    try:
        sizes = input_sizes(source_ep, inputs)
        if sizes is None:
            return None
        # the lowered program first: its calls are core ops that torch's formulas price directly (the
        # unlowered one's composite ops are priced by running their decompositions on meta tensors), and
        # it does at least the unlowered one's work, so where twice its runs fit, both programs' do
        lowered = PROGRAM_RUNS * run_cost.program_work(lowered_ep, sizes).seconds(run_cost.rates())
        if 2 * lowered <= max(budget, RUNS_ALWAYS):
            return None
        # (and what every lowering decomposes whatever the table says, which the programs' runs would check)
        forced = {op: fn for op, fn in forced_decompositions().items() if op not in table}
        ops = applied + sorted((op for op in _called_ops(source_ep) if op in forced), key=op_name)
        calls = signatures(source_ep, ops, sizes)
        # the checks against the most the runs can cost (twice the lowered program's): where they cost
        # more, the unlowered program is not priced (its composite ops run their decompositions on meta
        # tensors to be priced, the estimate's larger half)
        checking = sum(map(len, calls.values())) * CHECK_ESTIMATE if calls is not None else 0.0
        if calls is None or checking >= 2 * lowered:
            return None
        work = run_cost.program_work(source_ep, sizes)
        runs = lowered + PROGRAM_RUNS * work.seconds(run_cost.rates())
    except Exception:  # noqa: BLE001 -- not estimated: the programs run
        return None
    if runs <= max(budget, RUNS_ALWAYS) or checking >= runs:
        return None
    checks = check_calls(source_ep, ops, table, bounds, inputs, forced, work.heavy, calls)
    if checks is None:
        return None
    wanted = [n.meta.get("val") for n in _user_output_nodes(source_ep)]
    got = [n.meta.get("val") for n in _user_output_nodes(lowered_ep)]
    floats = {v.dtype for v in wanted if isinstance(v, torch.Tensor) and v.is_floating_point()}
    result = Validation("passed", verdict=checks.verdict, bound=max((bounds.get(dt, 0.0) for dt in floats),
                                                                    default=bounds[torch.float32]),
                        inputs=2, derived="ops", scope="ops", calls=checks.calls)
    result.max_rel = max((rel for rel, _ in checks.local.values() if rel is not None), default=0.0)
    differs = _outputs_differ(wanted, got)
    wrong = [op for op in applied if op in checks.local and checks.local[op][0] is None]
    if wrong:
        result.status, result.verdict = "failed", "wrong"
        result.why = f"where {op_name(wrong[0])} runs: {checks.local[wrong[0]][1]}"
        result.culprits = wrong  # (not a field: for repair.validated())
    elif differs:
        result.status, result.verdict, result.why = "failed", "wrong", f"the lowered program's outputs {differs}"
    return result


def _has_autocast(source_ep) -> bool:
    """Whether the program has an autocast region (markers, or a region wrapped as a subgraph)."""
    return any(is_autocast_marker(n.target) or "autocast" in str(n.target) for n in call_nodes(source_ep.graph_module))


def _user_output_nodes(ep) -> list:
    """The nodes of ``ep``'s user outputs, in order."""
    from torch.export.graph_signature import OutputKind

    out = ep.graph.output_node().args[0]
    return [v for v, spec in zip(out, ep.graph_signature.output_specs) if spec.kind == OutputKind.USER_OUTPUT]


def _outputs_differ(wanted: list, got: list) -> str:
    """What differs in the recorded outputs of two programs (their number, a tensor's dtype or rank, a
    static size); "" where nothing does."""
    if len(wanted) != len(got):
        return f"are {len(got)} where the program's are {len(wanted)}"
    for i, (w, g) in enumerate(zip(wanted, got)):
        if isinstance(w, torch.Tensor) != isinstance(g, torch.Tensor):
            return f"[{i}] is {type(g).__name__} where the program's is {type(w).__name__}"
        if isinstance(w, torch.Tensor):
            static = all(isinstance(a, int) and isinstance(b, int) for a, b in zip(w.shape, g.shape))
            if w.dtype != g.dtype or w.dim() != g.dim() or (static and tuple(w.shape) != tuple(g.shape)):
                return (f"[{i}] is {tuple(g.shape)} {g.dtype} where the program's is {tuple(w.shape)} {w.dtype}")
    return ""


def right_where_they_run(source_ep, ops, table: dict, bounds: dict, inputs, recorded: dict | None = None) -> dict:
    """op -> the largest relative difference of its decomposition (``table[op]``, lowered further with
    ``table``) from op itself on the values op receives when the program runs on ``inputs`` (its first
    calls, ``recorded`` where they are known already), or None where it is wrong on one (the
    decomposition is wrong where it runs); 0 without running those whose lowered form is right whatever
    the values (value_free: eager's own kernels compute op's result bit for bit). Ops not recorded
    (called in a subgraph only, or a program run through ep.module()) are left out."""
    from .._torch.dispatch import FakeTensorMode

    full = shared_trace_table(table)  # each entry as the lowering applies it
    out, decomposed, mode = {}, Decomposed(full), FakeTensorMode()
    if recorded is None:
        try:
            _, recorded = _Runner(source_ep).record(inputs, ops)
        except Exception:  # noqa: BLE001 -- not recorded: nothing known
            return out
    for op, calls in recorded.items():
        if op not in ops:
            continue
        if op in table and value_free(op, table[op], full, calls, decomposed, mode):
            out[op] = 0.0  # (eager's own kernels: op's result bit for bit)
            continue
        for args, kwargs in calls:
            checked = check_call(op, full[op], decomposed, args, kwargs, bounds)
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
    the stored inputs, each tensor's values permuted (permuted): the derived input, checked where the
    decompositions run; not those whose lowered form is right whatever the values (value_free). None
    where this cannot stand for running both programs on a derived input (no op is decomposed, or an
    op applied was not recorded: it runs in a subgraph, or the recording was full), or costs more than
    ``budget`` seconds (the checks, CHECK_ESTIMATE each by the count of distinct calls, or as measured
    on the way; past it, finished where the calls left cost less than ``budget`` at the rate measured)."""
    from .._torch.dispatch import FakeTensorMode

    t0 = time.perf_counter()
    recorded = runs.recorded
    if not applied or recorded is None or any(op not in recorded for op in applied):
        return None  # (no decomposition applied: what the derived input checks is the rest of the lowering)
    full = shared_trace_table(table)  # each entry as the lowering applies it
    decomposed = Decomposed(full)
    mode = FakeTensorMode()
    needed = [op for op in applied if not value_free(op, table[op], full, recorded[op], decomposed, mode)]
    if not needed:
        return {}, needed
    keys = {decomposed.key(full[op], *call) for op in needed for call in recorded[op]}
    if len(keys) * CHECK_ESTIMATE > budget - (time.perf_counter() - t0):
        return None
    out, deadline, checked_keys = {}, budget, set()
    for op in needed:
        fn = full[op]
        for args, kwargs in recorded[op]:
            key = decomposed.key(fn, args, kwargs)
            if key is not None and key in checked_keys:  # (one call per signature: repeated layers share one check)
                continue
            checked_keys.add(key)
            spent = time.perf_counter() - t0
            if spent > deadline:  # past the estimate: finish where what is left costs less than the programs
                done = len(checked_keys) - 1  # (the signatures checked before this one)
                left = spent / done * max(len(keys) - done, 0) if done else float("inf")
                if deadline > budget or left > budget:  # (extended once already, or finishing costs more)
                    return None
                deadline = spent + 2 * left
            try:
                derived = permuted((args, kwargs))
            except Exception:  # noqa: BLE001 -- values this cannot permute: the whole programs run instead
                return None
            checked = check_call(op, fn, decomposed, *derived, bounds)
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
