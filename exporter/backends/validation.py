"""A backend's result validated: its compiled program run on the artifact's stored example inputs and
compared, output by output, with the lowered program's own run (the reference) within the dtype's bound."""

from __future__ import annotations

import dataclasses

import torch

from .._torch.pytree import pytree
from ..errors import BackendResultError
from ..lowering.random_draws import drawn_results
from ..lowering.verdicts import real_parts, relative_difference

__all__ = ["HandOffValidation", "reference_outputs", "tied_nodes", "tied_picks", "validated_hand_off"]


@dataclasses.dataclass(frozen=True)
class HandOffValidation:
    """How the backend's outputs compared with the reference's (``Compiled.validation``)."""

    status: str  # "passed", or "skipped" (``why`` says why)
    max_rel: float = 0.0  # the largest relative difference of a float output
    bound: float = 0.0  # the bound beyond which it would be wrong (the outputs' widest dtype's)
    outputs: int = 0  # output leaves compared
    state: int = 0  # carried buffers compared after the run (Compiled.state)
    why: str = ""
    random: tuple = ()  # the values computed from random draws, compared by shape and dtype only
    draws: tuple = ()  # the drawing ops they are computed from

    def describe(self) -> str:
        if self.status != "passed":
            return f"hand-off validation {self.status}: {self.why}"
        also = f" and {self.state} carried buffer(s)" if self.state else ""
        random = (f"; of them {', '.join(self.random)} computed from random draws ({', '.join(self.draws)}), "
                  f"compared by shape and dtype only: the backend's generator is not torch's") if self.random else ""
        return (f"hand-off validation passed: {self.outputs} output(s){also} on the stored example inputs, largest "
                f"relative difference {self.max_rel:.3g} from the lowered program (wrong beyond {self.bound:.3g})"
                f"{random}")


def reference_outputs(ep, args: tuple, kwargs: dict):
    """``ep``'s outputs on ``args``/``kwargs``, run by its own module from its stored state, with the
    buffers it writes copied first: the program's own state is left as it was."""
    return _reference(ep, args, kwargs)[0]


def _reference(ep, args: tuple, kwargs: dict) -> tuple:
    """(``ep``'s outputs, the buffers it writes as the run left them, by qualified name)."""
    module = ep.module()
    written = set(ep.graph_signature.buffers_to_mutate.values())
    buffers = {name: b.clone() for name, b in module.named_buffers() if name in written}
    with torch.no_grad():
        return torch.func.functional_call(module, buffers, args, kwargs), buffers


def _leaf_name(path) -> str:
    return "output" + "".join(f"[{k.idx}]" if hasattr(k, "idx") else f"[{k.key!r}]" if hasattr(k, "key")
                              else f".{getattr(k, 'name', k)}" for k in path)


def _input_name(path) -> str:
    """A leaf of (args, kwargs) as a caller names it: ``args[0]``, ``kwargs['mask']``."""
    return ("args" if path[0].idx == 0 else "kwargs") + _leaf_name(path[1:]).removeprefix("output")


def validated_hand_off(compiled, ep, bounds: dict) -> HandOffValidation:
    """``compiled`` (a Compiled of ``ep``) run on ``ep``'s stored example inputs and compared with
    ``ep``'s own run; BackendResultError naming the first output that differs beyond ``bounds`` (dtype
    -> relative bound, as validation's), or that has another shape or dtype. A state the Compiled
    carries runs from the program's own values, its new values are compared too (``state[name]``), and
    it is left as it was before; where the program writes its inputs in place, the caller's tensors
    after the call are compared too (``input[...]``: a backend that computes the writes but never makes
    them is found here). A value computed from a random draw (random_draws) is compared by shape and
    dtype only: the backend's generator is not torch's."""
    key = compiled.backend.key
    carried = getattr(compiled, "carry", None)
    if ep.example_inputs is None:
        return HandOffValidation("skipped", why="the program stores no example inputs")
    if not compiled.backend.runs_here:
        return HandOffValidation("skipped", why=f"{key} does not run on this system: {compiled.backend.settings}")
    if ep.graph_signature.buffers_to_mutate and compiled.backend.holds_state and carried is None:
        if compiled.backend.load is None:
            return HandOffValidation("skipped", why=f"the program writes its buffers and {key} holds them: a run "
                                                     f"to compare would change the state its first call starts from")
        # a runtime of its own, loaded afresh: its first call starts from the state the caller's first call will
        compiled = dataclasses.replace(compiled, plan=compiled.backend.load(compiled.native))
    fresh = lambda: pytree.tree_map(lambda t: t.clone() if isinstance(t, torch.Tensor) else t,  # noqa: E731
                                    ep.example_inputs)  # (a program may write its inputs)
    ref_args, ref_kwargs = fresh()
    want, want_state = _reference(ep, ref_args, ref_kwargs)
    args, kwargs = fresh()
    kept = carried.state.snapshot() if carried is not None else None
    try:
        if carried is not None:
            carried.state.reset()  # the program's own values, as the reference starts from
        with torch.no_grad():
            got = compiled(*args, **kwargs)
        got_state = {name: carried.state[name].clone() for name in want_state} if carried is not None else {}
    finally:
        if kept is not None:
            carried.state.store(kept)
    wanted, _ = pytree.tree_flatten_with_path(want)
    gotten = pytree.tree_leaves(got)
    if len(wanted) != len(gotten):
        raise BackendResultError(f"{key} returns {len(gotten)} output(s) where the lowered program returns "
                                 f"{len(wanted)}; to_backend(..., validate=False) hands it over unchecked.")
    drawn = drawn_results(ep)
    pairs = [(_leaf_name(path), w, g, i in drawn.outputs) for i, ((path, w), g) in enumerate(zip(wanted, gotten))]
    pairs += [(f"state[{name!r}]", w, got_state[name], name in drawn.buffers)
              for name, w in want_state.items() if name in got_state]
    if ep.graph_signature.user_inputs_to_mutate:  # what the program writes into the caller's tensors
        written, _ = pytree.tree_flatten_with_path((ref_args, ref_kwargs))
        pairs += [(_input_name(path), w, g, i in drawn.inputs)
                  for i, ((path, w), g) in enumerate(zip(written, pytree.tree_leaves((args, kwargs))))
                  if isinstance(w, torch.Tensor)]
    worst, widest, random = 0.0, 0.0, []
    for name, w, g, from_draws in pairs:
        if from_draws:  # (its shape and dtype below, not its values)
            random.append(name)
        if not isinstance(w, torch.Tensor):
            if from_draws:
                continue
            if w != g:
                raise BackendResultError(f"{key}: {name} is {g!r} where the lowered program gives {w!r} on the "
                                         f"stored example inputs; to_backend(..., validate=False) hands it over unchecked.")
            continue
        if not isinstance(g, torch.Tensor) or g.shape != w.shape or g.dtype != w.dtype:
            what = f"{tuple(g.shape)} {g.dtype}" if isinstance(g, torch.Tensor) else type(g).__name__
            raise BackendResultError(f"{key}: {name} is {what} where the lowered program gives {tuple(w.shape)} "
                                     f"{w.dtype}; to_backend(..., validate=False) hands it over unchecked.")
        if from_draws:
            continue
        dtype = w.dtype
        if w.is_complex():  # (compared as its real and imaginary parts, within their dtype's bound)
            w, g = real_parts(w), real_parts(g)
        if not w.is_floating_point():
            if not torch.equal(g, w):
                raise BackendResultError(f"{key}: {name} ({dtype}) differs from the lowered program's on the "
                                         f"stored example inputs; to_backend(..., validate=False) hands it over "
                                         f"unchecked.")
            continue
        bound = bounds.get(w.dtype, bounds[torch.float32])
        widest = max(widest, bound)
        if w.numel() == 0 or torch.equal(g, w):
            continue
        if not torch.equal(g.isnan(), w.isnan()) or not torch.equal(g.isinf() & (g > 0), w.isinf() & (w > 0)):
            raise BackendResultError(f"{key}: {name} has NaN or infinite values where the lowered program's does "
                                     f"not (or the reverse); to_backend(..., validate=False) hands it over unchecked.")
        rel = relative_difference(g, w)
        worst = max(worst, rel)
        if rel > bound and name.startswith(("args", "kwargs")):
            raise BackendResultError(
                f"{key}: the program writes its input {name} in place, and after the call the caller's tensor "
                f"differs from what the lowered program leaves there by {rel:.3g} (relative): the backend does "
                f"not make the write. Return the new value instead of writing the input, or run the program "
                f"where writes reach the caller (runtime_ref, inductor); to_backend(..., validate=False) hands "
                f"it over unchecked.")
        if rel > bound:
            ties = tied_picks(ep, *fresh())
            if ties:
                raise BackendResultError(
                    f"{key}: {name} ({dtype}) differs from the lowered program's by {rel:.3g} (relative), beyond "
                    f"{bound:.3g}, on the stored example inputs, where the program's {ties} picks among equal "
                    f"values: which of equal values comes first is unspecified, and a backend may pick others, so "
                    f"what is computed from the pick may differ with neither wrong. Check with inputs and weights "
                    f"that hold no such ties (weights as trained, not constant); to_backend(..., validate=False) "
                    f"hands it over unchecked.")
            raise BackendResultError(
                f"{key}: {name} ({dtype}) differs from the lowered program's by {rel:.3g} (relative), beyond "
                f"{bound:.3g}, on the stored example inputs: the backend computes something else. Report it to "
                f"the backend; to_backend(..., validate=False) hands it over unchecked.")
    return HandOffValidation("passed", worst, widest or bounds[torch.float32], len(wanted), state=len(got_state),
                             random=tuple(random), draws=drawn.ops if random else ())


_aten = torch.ops.aten


def _top_ties(x, k, dim, largest):
    """Whether topk's pick is ambiguous: two of the k + 1 first values in its order are equal."""
    n = x.shape[dim] if x.dim() else 1
    if k == 0 or n < 2:
        return False
    first = x.sort(dim=dim, descending=largest).values.narrow(dim % max(x.dim(), 1), 0, min(k + 1, n))
    return bool((first.diff(dim=dim) == 0).any())


def _extreme_ties(x, dim, largest=True):
    """Whether an arg-extreme's index is ambiguous: the extreme is held twice along ``dim``."""
    if x.numel() < 2:
        return False
    if dim is None:
        x, dim = x.reshape(-1), 0
    extreme = x.amax(dim, keepdim=True) if largest else x.amin(dim, keepdim=True)
    return bool(((x == extreme).sum(dim) > 1).any())


def _sort_ties(x, dim, stable=None):
    """Whether a sort's order of indices is ambiguous: not stable, and two values equal."""
    if stable or x.numel() < 2 or x.dim() == 0:
        return False
    return bool((x.sort(dim=dim).values.diff(dim=dim) == 0).any())


# ops whose output picks among values (indices, or values by index) -> whether the inputs make the pick
# ambiguous (ties), read from the op's own arguments
_PICKS = {
    _aten.topk.default: lambda x, k, dim=-1, largest=True, sorted=True: _top_ties(x, k, dim, largest),
    _aten.sort.default: lambda x, dim=-1, descending=False: _sort_ties(x, dim),
    _aten.sort.stable: lambda x, *, stable=None, dim=-1, descending=False: _sort_ties(x, dim, stable=stable),
    _aten.argsort.default: lambda x, dim=-1, descending=False: _sort_ties(x, dim),
    _aten.argmax.default: lambda x, dim=None, keepdim=False: _extreme_ties(x, dim),
    _aten.argmin.default: lambda x, dim=None, keepdim=False: _extreme_ties(x, dim, largest=False),
    _aten.max.dim: lambda x, dim, keepdim=False: _extreme_ties(x, dim),
    _aten.min.dim: lambda x, dim, keepdim=False: _extreme_ties(x, dim, largest=False),
}


def tied_nodes(gm: torch.fx.GraphModule, inputs: list) -> frozenset:
    """The names of ``gm``'s nodes that pick among equal values (_PICKS) in its run on ``inputs`` (its
    placeholders' values, in order): one run on the reference, each pick's arguments read as it runs."""
    found = set()

    class Picks(torch.fx.Interpreter):
        def run_node(self, node):
            check = _PICKS.get(node.target) if node.op == "call_function" else None
            if check is not None:
                args, kwargs = self.fetch_args_kwargs_from_env(node)
                if isinstance(args[0], torch.Tensor) and not args[0].is_complex() and check(*args, **kwargs):
                    found.add(node.name)
            return super().run_node(node)

    with torch.no_grad():
        Picks(gm).run(*inputs)
    return frozenset(found)


def tied_picks(ep, args: tuple, kwargs: dict) -> str:
    """The ops of ``ep`` that pick among equal values in its run on ``args``/``kwargs`` (topk at a tie of
    its k-th value, an argmax of a maximum held twice, a sort that is not stable over equal values), as
    "topk (2 calls), argmax": where they are, which of the equal values comes first is unspecified, and a
    backend may order them otherwise than torch. "" where there is none. Run only when a backend's output
    differs (one more run of the program, on the reference)."""
    from .._torch.dispatch import TorchDispatchMode
    from ..ops import op_name

    found = {}

    class Picks(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            check = _PICKS.get(func)
            if check is not None and isinstance(args[0], torch.Tensor) and not args[0].is_complex():
                if check(*args, **kwargs):
                    name = op_name(func).split("::")[-1].split(".")[0]
                    found[name] = found.get(name, 0) + 1
            return func(*args, **kwargs)

    try:
        with Picks():
            _reference(ep, args, kwargs)
    except Exception:  # noqa: BLE001 -- a diagnosis of a failure already found: none rather than another error
        return ""
    return ", ".join(f"{op} ({n} calls)" if n > 1 else op for op, n in found.items())
