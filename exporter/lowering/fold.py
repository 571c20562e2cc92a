"""A call outside a backend's op set whose value the program fixes (its inputs are constants of the
program and literals, through deterministic ops only) computed once at lowering, by torch's own
kernels, and given to the backend as the ``full`` of that value: the same value, from an op backends
have. Gemma 3n's activation sparsity takes ``Normal(0, 1).icdf`` of a constant, an ``erf_inv`` that no
decomposition reaches and ONNX and ExecuTorch lack. Only values one ``full`` makes (a 0-d tensor, or
every element equal) are folded; a seeded random op (``randn``) is never folded: each run draws anew."""

from __future__ import annotations

import math
import operator

import torch
import torch.fx

from .opset_check import refused_nodes

__all__ = ["NUMBER_CALLS", "fixed_tensors", "fixed_value", "fixed_values_folded"]


# the Python arithmetic torch.export records on numbers (sizes, values read from tensors): of fixed
# numbers, a fixed number
NUMBER_CALLS = frozenset({
    operator.add, operator.sub, operator.mul, operator.truediv, operator.floordiv, operator.mod, operator.pow,
    operator.neg, operator.pos, operator.abs, operator.eq, operator.ne, operator.lt, operator.le, operator.gt,
    operator.ge, operator.and_, operator.or_, operator.not_, math.ceil, math.floor, math.trunc, math.sqrt,
    torch.sym_max, torch.sym_min, torch.sym_not, torch.sym_ite, torch.sym_float, torch.sym_int})


def _deterministic(node: torch.fx.Node) -> bool:
    target = node.target
    if target in NUMBER_CALLS:
        return True
    if not isinstance(target, torch._ops.OpOverload):
        return False
    return torch.Tag.nondeterministic_seeded not in target.tags and not target._schema.is_mutable


def fixed_value(node, constants: dict, memo: dict):
    """The value of ``node`` where the program fixes it (a constant tensor input, literals, and
    deterministic ops of those), else None; ``constants``: placeholder name -> value, ``memo`` the
    values found so far."""
    if node not in memo:
        memo[node] = None
        if node.op == "placeholder":
            memo[node] = constants.get(node.name)
        elif node.op == "call_function" and _deterministic(node) and not any(
                isinstance(a, (list, tuple)) and any(isinstance(x, torch.fx.Node) for x in a) for a in node.args):
            known = lambda a: fixed_value(a, constants, memo) if isinstance(a, torch.fx.Node) else a  # noqa: E731
            args = [known(a) for a in node.args]
            kwargs = {k: known(v) for k, v in node.kwargs.items()}
            given = [*node.args, *node.kwargs.values()]
            if all(v is not None for v, a in zip([*args, *kwargs.values()], given) if isinstance(a, torch.fx.Node)):
                with torch.no_grad():
                    memo[node] = node.target(*args, **kwargs)
    return memo[node]


def fixed_tensors(ep: torch.export.ExportedProgram, unwritten_buffers: bool = False) -> dict:
    """Placeholder name -> value of the program's constant tensors, and with ``unwritten_buffers`` of
    the buffers it never writes (fixed_value's ``constants``)."""
    from torch.export.graph_signature import InputKind

    written = set(ep.graph_signature.buffers_to_mutate.values())
    fixed = {}
    for spec in ep.graph_signature.input_specs:
        if spec.kind == InputKind.CONSTANT_TENSOR:
            value = ep.constants.get(spec.target)
        elif spec.kind == InputKind.BUFFER and unwritten_buffers and spec.target not in written:
            value = ep.state_dict.get(spec.target, ep.constants.get(spec.target))
        else:
            continue
        if isinstance(value, torch.Tensor):
            fixed[spec.arg.name] = value
    return fixed


def fixed_values_folded(ep: torch.export.ExportedProgram, accepts) -> torch.export.ExportedProgram:
    """``ep`` with each call of an op ``accepts(op)`` rejects, whose value the program fixes and one
    ``full`` makes, replaced by that ``full`` (in place: ``ep`` is the lowering's own new program).
    Returns ``ep``."""
    gm = ep.graph_module
    refused = refused_nodes(gm, accepts)
    if not refused:
        return ep
    constants = fixed_tensors(ep)
    memo: dict = {}
    changed = False
    for node in refused:
        value = fixed_value(node, constants, memo)
        if not isinstance(value, torch.Tensor) or value.is_complex() or value.numel() == 0:
            continue
        flat = value.reshape(-1)
        if not bool((flat == flat[0]).all()) and not bool(flat.isnan().all()):
            continue
        with gm.graph.inserting_before(node):
            made = gm.graph.call_function(torch.ops.aten.full.default, (list(value.shape), flat[0].item()),
                                          {"dtype": value.dtype, "device": value.device})
        made.meta.update({k: v for k, v in node.meta.items() if k in ("val", "tensor_meta", "stack_trace",
                                                                         "nn_module_stack", "from_node")})
        node.replace_all_uses_with(made)
        changed = True
    if changed:
        gm.graph.eliminate_dead_code()
        gm.recompile()
    return ep
