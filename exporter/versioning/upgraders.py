"""Registered op upgraders: each rewrites, in place, the serialized node (torch's
``torch._export.serde.schema.Node``) of an op recorded with an OLD schema so that it calls the
running torch's op. Keyed by qualified op name + overload + the old schema string (matched by
exporter/versioning/schema_drift.py on PARSED schemas, never as text).

Every upgrader here comes from a real change in PyTorch's release history
(docs/op-schema-history.md, row numbers in ``history``). Changes that only add
arguments with defaults need no upgrader: schema_drift accepts them as compatible drift.
"""

from __future__ import annotations

import dataclasses
from typing import Callable

from .._torch.serde import schema as S


class UpgraderError(ValueError):
    """A node cannot be rewritten (its inputs are not what the old schema allowed)."""


@dataclasses.dataclass
class Context:
    """What an upgrader may touch besides its node: the graph that holds it (for new values)."""

    graph: S.Graph
    where: str
    _taken: set | None = None

    def fresh_name(self, base: str) -> str:
        """A value/node name unused in this graph."""
        if self._taken is None:
            g = self.graph
            self._taken = {n.name for n in g.nodes} | set(g.tensor_values) | set(g.sym_int_values) \
                | set(g.sym_bool_values) | set(getattr(g, "sym_float_values", {}) or {}) \
                | set(getattr(g, "custom_obj_values", {}) or {})
            for n in g.nodes:
                for o in n.outputs:
                    v = o.value
                    for t in (v if isinstance(v, list) else [v]):
                        if isinstance(t, S.TensorArgument):
                            self._taken.add(t.name)
        name, i = base, 0
        while name in self._taken:
            i += 1
            name = f"{base}_{i}"
        self._taken.add(name)
        return name


@dataclasses.dataclass(frozen=True)
class Upgrader:
    op: str               # qualified name, "aten::linspace"
    overload: str         # "default" for the unnamed overload
    old_schema: str       # verbatim from the release that wrote it
    new_schema: str       # the schema the rewritten node conforms to (may name another op)
    rewrite: Callable[[S.Node, Context], None]
    summary: str          # what the rewrite does, for load notes
    history: str          # where the change comes from

    @property
    def name(self) -> str:
        return f"{self.rewrite.__module__.rsplit('.', 1)[-1]}.{self.rewrite.__name__}"


# (qualified name, overload) -> upgraders for that overload, one per old schema.
REGISTRY: dict[tuple[str, str], list[Upgrader]] = {}


def register(op: str, overload: str, *, old: str, new: str, summary: str, history: str):
    def deco(fn):
        REGISTRY.setdefault((op, overload or "default"), []).append(
            Upgrader(op, overload or "default", old, new, fn, summary, history))
        return fn
    return deco


def candidates(op: str, overload: str) -> list[Upgrader]:
    return list(REGISTRY.get((op, overload or "default"), ()))


# ---- helpers on serialized nodes ----
def find_input(node: S.Node, name: str) -> S.NamedArgument | None:
    for inp in node.inputs:
        if inp.name == name:
            return inp
    return None


def set_input(node: S.Node, name: str, arg: S.Argument, kind=S.ArgumentKind.POSITIONAL, *,
              after: str | None = None) -> None:
    """Set (or add, after the input named ``after`` or at the end) input ``name``."""
    inp = find_input(node, name)
    if inp is not None:
        inp.arg, inp.kind = arg, kind
        return
    new = S.NamedArgument(name=name, arg=arg, kind=kind)
    names = [i.name for i in node.inputs]
    at = names.index(after) + 1 if after in names else len(node.inputs)
    node.inputs.insert(at, new)


def rename_input(node: S.Node, old: str, new: str) -> None:
    inp = find_input(node, old)
    if inp is None:
        raise UpgraderError(f"node {node.name or '?'} has no input {old!r} to rename to {new!r}")
    if find_input(node, new) is not None:
        raise UpgraderError(f"node {node.name or '?'} has both {old!r} and {new!r}")
    inp.name = new


def bool_input(node: S.Node, name: str) -> S.NamedArgument | None:
    """Input ``name`` (None where the node omits it); UpgraderError unless it holds a bool."""
    inp = find_input(node, name)
    if inp is not None and inp.arg.type != "as_bool":
        raise UpgraderError(f"node {node.name or '?'}: {name} is {inp.arg.type}, expected a bool")
    return inp


def _is_none(arg: S.Argument) -> bool:
    return arg.type == "as_none"


# ---- rows 3 and 4: linspace/logspace `int? steps=None` (None meant 100) -> `int steps` (1.11) ----
def _steps_default_100(node: S.Node, ctx: Context) -> None:
    inp = find_input(node, "steps")
    if inp is None or _is_none(inp.arg):
        set_input(node, "steps", S.Argument.create(as_int=100), after="end")
    elif inp.arg.type not in ("as_int", "as_sym_int"):
        raise UpgraderError(f"node {node.name or '?'}: steps is {inp.arg.type}, expected an int or None")
    else:
        inp.kind = S.ArgumentKind.POSITIONAL


register(
    "aten::linspace", "default",
    old="aten::linspace(Scalar start, Scalar end, int? steps=None, *, ScalarType? dtype=None, "
        "Layout? layout=None, Device? device=None, bool? pin_memory=None) -> Tensor",
    new="aten::linspace(Scalar start, Scalar end, int steps, *, ScalarType? dtype=None, "
        "Layout? layout=None, Device? device=None, bool? pin_memory=None) -> Tensor",
    summary="steps became required in torch 1.11; an omitted/None steps meant 100, written as steps=100",
    history="facts row 3: torch 1.11, operator version 8, issue #55951",
)(_steps_default_100)

register(
    "aten::logspace", "default",
    old="aten::logspace(Scalar start, Scalar end, int? steps=None, float base=10.0, *, ScalarType? dtype=None, "
        "Layout? layout=None, Device? device=None, bool? pin_memory=None) -> Tensor",
    new="aten::logspace(Scalar start, Scalar end, int steps, float base=10., *, ScalarType? dtype=None, "
        "Layout? layout=None, Device? device=None, bool? pin_memory=None) -> Tensor",
    summary="steps became required in torch 1.11; an omitted/None steps meant 100, written as steps=100",
    history="facts row 4: torch 1.11, operator version 9",
)(_steps_default_100)


# ---- row 6: gelu_backward argument `grad` renamed `grad_output` (+ approximate kwarg, 1.12) ----
@register(
    "aten::gelu_backward", "default",
    old="aten::gelu_backward(Tensor grad, Tensor self) -> Tensor",
    new='aten::gelu_backward(Tensor grad_output, Tensor self, *, str approximate="none") -> Tensor',
    summary="input 'grad' renamed 'grad_output' (approximate='none' is the old exact gelu)",
    history="facts row 6: torch 1.12 (PR #61439), 1.11 schema from Declarations-v1.11.0",
)
def gelu_backward_grad_renamed(node: S.Node, ctx: Context) -> None:
    rename_input(node, "grad", "grad_output")


# ---- row 12: var/std(_mean).correction `int? correction` -> `Scalar? correction` (2.1) ----
def _int_correction_is_scalar(node: S.Node, ctx: Context) -> None:
    inp = find_input(node, "correction")
    if inp is not None and inp.arg.type not in ("as_none", "as_int", "as_sym_int"):
        raise UpgraderError(f"node {node.name or '?'}: correction is {inp.arg.type}, the old schema took int?")
    # An int is a valid Scalar and torch 2.13 itself writes an int Scalar as as_int: nothing to change.


for _op, _ret in (("var", "Tensor"), ("std", "Tensor"), ("var_mean", "(Tensor, Tensor)"),
                  ("std_mean", "(Tensor, Tensor)")):
    register(
        f"aten::{_op}", "correction",
        old=f"aten::{_op}.correction(Tensor self, int[1]? dim=None, *, int? correction=None, "
            f"bool keepdim=False) -> {_ret}",
        new=f"aten::{_op}.correction(Tensor self, int[1]? dim=None, *, Scalar? correction=None, "
            f"bool keepdim=False) -> {_ret}",
        summary="correction widened int? -> Scalar?; the recorded int correction is kept as a Scalar",
        history="facts row 12: torch 2.1 (var.correction read in Declarations-v2.0.0; std/var_mean/"
                "std_mean.correction changed the same way)",
    )(_int_correction_is_scalar)


# ---- row 9: _scaled_dot_product_efficient_attention (2.0 -> 2.1): positional `attn_bias`
# inserted before compute_log_sumexp, dropout_p/scale added, outputs 2 -> 4 ----
@register(
    "aten::_scaled_dot_product_efficient_attention", "default",
    old="aten::_scaled_dot_product_efficient_attention(Tensor query, Tensor key, Tensor value, "
        "bool compute_log_sumexp, bool is_causal=False) -> (Tensor, Tensor)",
    new="aten::_scaled_dot_product_efficient_attention(Tensor query, Tensor key, Tensor value, "
        "Tensor? attn_bias, bool compute_log_sumexp, float dropout_p=0., bool is_causal=False, *, "
        "float? scale=None) -> (Tensor output, Tensor log_sumexp, Tensor philox_seed, Tensor philox_offset)",
    summary="attn_bias=None inserted before compute_log_sumexp (dropout_p=0. as before); two unused "
            "int64 scalar outputs philox_seed/philox_offset appended",
    history="facts row 9: 2.0 schema from Declarations-v2.0.0, changed by 2.1 (PR #102038)",
)
def efficient_attention_attn_bias(node: S.Node, ctx: Context) -> None:
    if find_input(node, "compute_log_sumexp") is None:
        raise UpgraderError(f"node {node.name or '?'} lacks the required input compute_log_sumexp")
    set_input(node, "attn_bias", S.Argument.create(as_none=True), after="value")
    if len(node.outputs) != 2:
        raise UpgraderError(f"node {node.name or '?'} has {len(node.outputs)} outputs; the 2.0 op had 2")
    first = node.outputs[0].value
    ref = ctx.graph.tensor_values.get(first.name) if isinstance(first, S.TensorArgument) else None
    device = ref.device if ref is not None else S.Device(type="cpu")
    base = node.name or "_scaled_dot_product_efficient_attention"
    for what in ("philox_seed", "philox_offset"):
        name = ctx.fresh_name(f"{base}_{what}")
        ctx.graph.tensor_values[name] = S.TensorMeta(
            dtype=S.ScalarType.LONG, sizes=[], requires_grad=False, device=device, strides=[],
            storage_offset=S.SymInt.create(as_int=0), layout=S.Layout.Strided)
        node.outputs.append(S.Argument.create(as_tensor=S.TensorArgument(name=name)))


# ---- row 15: _cdist_backward / _pdist_backward input `grad` renamed `grad_output` (2.14); both
# directions: a 2.13 artifact on 2.14+ (upgrade), a 2.14+ artifact on 2.13 or older (downgrade) ----
def _grad_renamed(node: S.Node, ctx: Context) -> None:
    rename_input(node, "grad", "grad_output")


def _grad_output_renamed_back(node: S.Node, ctx: Context) -> None:
    rename_input(node, "grad_output", "grad")


for _op, _args in (("_cdist_backward", "Tensor x1, Tensor x2, float p, Tensor cdist"),
                   ("_pdist_backward", "Tensor self, float p, Tensor pdist")):
    _old, _new = (f"aten::{_op}(Tensor {g}, {_args}) -> Tensor" for g in ("grad", "grad_output"))
    register(f"aten::{_op}", "default", old=_old, new=_new,
             summary="input 'grad' renamed 'grad_output' (torch 2.14)",
             history="facts row 15: torch 2.14.1's registry against 2.13.0's (schemas/ops/registry@*.json)",
             )(_grad_renamed)
    register(f"aten::{_op}", "default", old=_new, new=_old,
             summary="input 'grad_output' renamed back 'grad' (an artifact of torch 2.14 or later)",
             history="facts row 15, downgrade: torch 2.13.0's registry against 2.14.1's",
             )(_grad_output_renamed_back)


# ---- row 16: aten::cholesky and aten::qr removed in 2.14; linalg_cholesky and linalg_qr compute
# them (both exist since 1.8) ----
def cholesky_to_linalg(node: S.Node, ctx: Context) -> None:
    inp = bool_input(node, "upper")
    if inp is not None:
        inp.kind = S.ArgumentKind.KEYWORD


def qr_to_linalg(node: S.Node, ctx: Context) -> None:
    rename_input(node, "self", "A")
    inp = bool_input(node, "some")
    if inp is None:
        return
    inp.name, inp.arg = "mode", S.Argument.create(as_string="reduced" if inp.arg.value else "complete")


for _op, _old, _new, _summary, _fn in (
        ("cholesky", "(Tensor self, bool upper=False) -> Tensor", "aten::linalg_cholesky(Tensor self, *, bool "
         "upper=False) -> Tensor", "cholesky(A, upper) became linalg_cholesky(A, upper=upper)", cholesky_to_linalg),
        ("qr", "(Tensor self, bool some=True) -> (Tensor Q, Tensor R)", 'aten::linalg_qr(Tensor A, str mode="reduced") '
         "-> (Tensor Q, Tensor R)", "qr(A, some) became linalg_qr(A, mode='reduced' if some else 'complete')",
         qr_to_linalg)):
    register(f"aten::{_op}", "default", old=f"aten::{_op}{_old}", new=_new,
             summary=f"{_summary} ({_op} removed in torch 2.14)",
             history=f"facts row 16: torch 2.14.1's registry has no aten::{_op} (2.13.0's has)")(_fn)
