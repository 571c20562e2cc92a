"""The decompositions the running torch offers, gathered once per process from
torch.export's default table, torch._decomp's registry and CompositeImplicitAutograd kernels."""

from __future__ import annotations

import functools
import threading

import torch

from .._torch import compat
from .._torch.tracing import collect_all_valid_cia_ops_for_aten_namespace as _collect_all_valid_cia_ops_for_aten_namespace
from .._torch.tracing import decomposition_table as _REGISTRY
from .._torch.tracing import get_decomp_for_cia as _get_decomp_for_cia
from ..mutation import is_mutating
from ..ops import op_name

# Registered decompositions that produce a non-functional graph (prims.copy_to, in-place batch
# norm) which torch's functionalizing tracer rejects; the default table's choice is kept instead.
NON_FUNCTIONAL = {
    "aten::_native_batch_norm_legit_no_training.default",
    "aten::_native_batch_norm_legit.default",
    "aten::_native_batch_norm_legit.no_stats",
    "aten::native_batch_norm.default",
    "aten::constant_pad_nd.default",  # torch._refs.constant_pad_nd writes into a view (copy_to)
}


def _register_known_namespaces() -> None:
    """Import the torch modules that register ops the presets name, so that what this process can
    decompose does not depend on what it imported before: torch.export's serializer imports
    torch._dynamo, which registers c10d_functional::* (its CompositeImplicitAutograd ops); pt2b imports
    that serializer only when it builds a program."""
    import importlib

    if torch.distributed.is_available():
        importlib.import_module("torch.distributed._functional_collectives")


@functools.cache
def _default_table() -> dict:
    _register_known_namespaces()
    return dict(torch.export.default_decompositions().items())


@functools.cache
def _all_available() -> dict:
    table = dict(_default_table())
    for op, fn in _REGISTRY.items():  # in-place/out= entries beyond torch's table emit prims.copy_to
        if isinstance(op, torch._ops.OpOverload) and op not in table and not is_mutating(op):
            table[op] = fn
    for op in _collect_all_valid_cia_ops_for_aten_namespace():
        if op not in table and not is_mutating(op):
            table[op] = _get_decomp_for_cia(op)
    table.update(quantized_decompositions())
    # torch's own in-place/out= entries stay: decompositions emit in-place ops whose own
    # decomposition makes them functional again
    return {op: fn for op, fn in table.items() if isinstance(op, torch._ops.OpOverload)
            and not (op_name(op) in NON_FUNCTIONAL and op not in _default_table())}


@functools.cache
def quantized_decompositions() -> dict:
    """quantized_decomposed::* (PT2E quantization's ops) -> the Python kernel torch registers for each
    (CompositeExplicitAutograd, in torch/ao/quantization/fx/_decomposed.py), which computes it with
    aten ops: what lets ``max`` and a float-only ``supported_ops`` reach them. torch's own tables have
    none (its core keeps these ops, and so does pt2b's). The kernel of ``name.overload`` is the
    module's function ``name_overload`` (``name`` for the default overload); an op without one stays."""
    kernels = compat.quantized_decomposed_kernels()
    if kernels is None:  # a torch built without the quantization package
        return {}
    table = {}
    for qualified in torch._C._dispatch_get_all_op_names():
        ns, _, rest = qualified.partition("::")
        if ns != "quantized_decomposed":
            continue
        name, _, overload = rest.partition(".")
        fn = getattr(kernels, name if not overload else f"{name}_{overload}", None)
        if fn is None or not torch._C._dispatch_has_kernel_for_dispatch_key(qualified, "CompositeExplicitAutograd"):
            continue
        table[getattr(getattr(torch.ops.quantized_decomposed, name), overload or "default")] = fn
    return table


def torch_default_table() -> dict:
    """torch.export.default_decompositions() as a plain dict (what run_decompositions() uses)."""
    return dict(_default_table())


def available_decompositions() -> dict:
    """Every op the running torch can decompose -> its decomposition (a fresh dict)."""
    return dict(_all_available())


def available_names() -> dict[str, object]:
    return {op_name(op): op for op in _all_available()}


def is_core(op) -> bool:
    return isinstance(op, torch._ops.OpOverload) and torch.Tag.core in op.tags


_ROUTING = threading.local()  # .ops: the PrimTorch views whose ATen implementation this thread traces


@functools.cache
def view_prims_via_aten() -> dict:
    """Every PrimTorch op that returns a view of its input (prims::broadcast_in_dim, prims::squeeze,
    prims::collapse_view, ...) -> its own ATen implementation, the CompositeExplicitAutograd kernel
    torch._prims registers for it (broadcast_in_dim: unsqueeze, then expand). torch's references emit
    these views (aten::var.correction -> prims::var + prims::broadcast_in_dim), nothing in torch's
    tables decomposes them, and no backend can be handed a program that holds one: every hand-off
    retraces the program, and torch's functionalization refuses a non-ATen op whose output aliases
    an input. A supported_ops closure uses these to reach the ATen views a backend accepts (a route
    that would come back to the same prim declines, and the prim stays: an OpsetError names it)."""
    from ..mutation import returns_alias

    routes = {}
    for qualified in torch._C._dispatch_get_all_op_names():
        ns, _, rest = qualified.partition("::")
        if ns != "prims" or not torch._C._dispatch_has_kernel_for_dispatch_key(qualified, "CompositeExplicitAutograd"):
            continue
        name, _, overload = rest.partition(".")
        op = getattr(getattr(torch.ops.prims, name), overload or "default")
        if returns_alias(op) and not op._schema.is_mutable:
            routes[op] = _via_aten(op)
    return routes


def _via_aten(op):
    def decomposition(*args, **kwargs):
        routing = _ROUTING.__dict__.setdefault("ops", set())  # per thread: lowerings run in several at once
        if op in routing:  # its ATen route came back to it: no route, the prim stays
            return NotImplemented
        routing.add(op)
        try:
            return op._op_dk(torch._C.DispatchKey.CompositeExplicitAutograd, *args, **kwargs)
        finally:
            routing.discard(op)

    decomposition.__name__ = f"{op._opname}_via_aten"
    return decomposition


def _is_all_true(t):
    # the op's own kernel is `self.all()` on a bool tensor and refuses any other dtype: the
    # decomposition declines there rather than accept what the op does not
    if t.dtype != torch.bool:
        return NotImplemented
    return torch.ops.aten.all.default(t)


@functools.cache
def runtime_check_decompositions() -> dict:
    """The ops torch's runtime assertions record that torch registers no decomposition for -> one
    into ops backends list: aten::_is_all_true (what torch._check_tensor_all and transformers'
    torch_compilable_check record: a 0-dim bool, the tensor's all()) -> aten::all, its own kernel's
    one call, so the same value, dtype and shape. What becomes of the assertion that reads it is
    the backend's (lowering/assertions.py reports it)."""
    return {torch.ops.aten._is_all_true.default: _is_all_true}


def pt2b_decompositions() -> dict:
    """pt2b's own decompositions of ops torch leaves undecomposed, which an op-list lowering applies
    where the backend lacks the op: those of runtime assertions' ops and the exact rewrites (rewrites.py)."""
    from .rewrites import written_decompositions

    return {**runtime_check_decompositions(), **written_decompositions()}


def closure_decompositions() -> dict:
    """What a supported_ops closure decomposes with (a fresh dict): every decomposition the running torch
    offers (available_decompositions), the ATen implementations of the PrimTorch views its references
    emit (view_prims_via_aten), and pt2b's own for the ops of runtime assertions
    (runtime_check_decompositions) and its exact rewrites of ops torch leaves undecomposed
    (rewrites.py), used only for ops the backend does not accept."""
    table = available_decompositions()
    for op, fn in {**view_prims_via_aten(), **pt2b_decompositions()}.items():
        table.setdefault(op, fn)
    return table
