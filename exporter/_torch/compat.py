"""What differs between the torch releases pt2b supports (pyproject.toml's range), in one place: each
difference is detected from the running torch (what its export schema defines, what its modules
hold), never from its version number, and the rest of pt2b asks here. The differences and who asks:
docs/releases.md#what-differs-between-releases-and-where-it-is-handled."""

from __future__ import annotations

import dataclasses
import functools
import inspect

import torch

from .serde import schema as _S


@functools.cache
def schema_union_members(cls) -> frozenset[str]:
    """The members of the export-schema union ``cls`` (e.g. Argument) in this torch's schema."""
    return frozenset(f.name for f in dataclasses.fields(cls))


def schema_lacks(what: str) -> str:
    """The sentence that says the running torch's export schema cannot hold ``what``."""
    return (f"this torch ({torch.__version__}) has no {what} in its export schema "
            f"(torch._export.serde.schema {'.'.join(map(str, _schema_version()))}); a newer torch reads it")


def _schema_version() -> tuple[int, ...]:
    from .serializer import SCHEMA_VERSION

    return tuple(SCHEMA_VERSION)


def torch_serialized_program(ep) -> _S.ExportedProgram:
    """torch's own ``ExportedProgramSerializer().serialize(ep).exported_program``, weights, constants
    and example inputs left out where this torch's serialize() can leave them out."""
    from .serializer import ExportedProgramSerializer

    serialize = ExportedProgramSerializer().serialize
    skip = ("serialize_state_dict", "serialize_constants", "serialize_example_inputs")
    kwargs = {k: False for k in skip if k in inspect.signature(serialize).parameters}
    return serialize(ep, **kwargs).exported_program


@functools.cache
def lstm_decomposition_drops_batch() -> bool:
    """Whether this torch's one_layer_lstm returns a batch of 2's final hidden state as (1, 2, H)
    instead of (2, H) (torch 2.11, 2.12). Asked first inside a lowering's trace: the probe runs
    eagerly, on tiny CPU tensors, with the trace's modes set aside."""
    from .dispatch import disable_current_modes as _disable_current_modes
    from .tracing import decompositions as d

    with _disable_current_modes(), torch._C.DisableTorchFunction(), torch.no_grad():
        h, w_ih, w_hh, b = torch.zeros(2, 1), torch.zeros(4, 1), torch.zeros(4, 1), torch.zeros(4)
        _, (hx, _) = d.one_layer_lstm(torch.zeros(1, 2, 1), (h, h), (w_ih, w_hh, b, b), True)
        return hx.shape != h.shape


def one_layer_lstm():
    """torch's one_layer_lstm (one layer of aten.lstm.input's decomposition), repaired where it
    misplaces the batch dimension of the final hidden states (``lstm_decomposition_drops_batch``)."""
    from .tracing import decompositions as d

    if not lstm_decomposition_drops_batch():
        return d.one_layer_lstm
    return _one_layer_lstm_keeping_batch


def _one_layer_lstm_keeping_batch(inp, hidden, params, has_biases, reverse=False):
    from .tracing import decompositions as d

    out, (hx, cx) = d.one_layer_lstm(inp, hidden, params, has_biases, reverse)
    # (1, batch, H) where hidden holds (batch, H); a batch of one already came back as (1, H)
    if hx.dim() > hidden[0].dim():
        hx, cx = hx.squeeze(0), cx.squeeze(0)
    return out, (hx, cx)


@functools.cache
def functional_mode_decides_per_object() -> bool:
    """Whether FunctionalTensorMode asks a method of the mode object (``_can_decompose``) whether it
    decomposes an op itself (2.12 on); 2.11 decides in a local function of its __torch_dispatch__."""
    from torch._subclasses.functional_tensor import FunctionalTensorMode

    return callable(getattr(FunctionalTensorMode, "_can_decompose", None))


@functools.cache
def lazy_graph_module_class():
    """torch.fx's _LazyGraphModule (a graph module whose code is generated on first use), or None where
    this torch lacks it (every supported release has it: _torch/deferred_codegen.py)."""
    try:
        from torch.fx._lazy_graph_module import _LazyGraphModule
    except ImportError:  # pragma: no cover -- every supported release has it
        return None
    return _LazyGraphModule


def lazy_graph_modules_forbidden() -> bool:
    """Whether torch's own switch (torch.fx._lazy_graph_module._force_skip_lazy_graph_module_flag) says
    graph modules must not be lazy now; False where this torch has no such switch."""
    import torch.fx._lazy_graph_module as lazy_module

    return bool(getattr(lazy_module, "_force_skip_lazy_graph_module_flag", False))


def quantized_decomposed_kernels():
    """The module holding the Python kernels of quantized_decomposed::* (torch.ao.quantization.fx.
    _decomposed), or None for a torch built without the quantization package (lowering/tables.py)."""
    try:
        from torch.ao.quantization.fx import _decomposed as kernels
    except ImportError:  # a torch built without the quantization package
        return None
    return kernels


# op libraries torch itself defines in a module it does not import at start-up: namespace -> the loader
# that imports it. An artifact whose op table names one of these namespaces has it loaded before its ops
# are looked up (an allowlist: no module name is ever read from a file)
TORCH_OWN_LIBRARIES = {"quantized_decomposed": quantized_decomposed_kernels}


def load_torch_own_libraries(namespaces) -> None:
    """Import the op libraries torch defines for ``namespaces`` (TORCH_OWN_LIBRARIES; others ignored)."""
    for ns in set(namespaces) & set(TORCH_OWN_LIBRARIES):
        TORCH_OWN_LIBRARIES[ns]()


def functions_of(wanted: dict[str, tuple[str, ...]]) -> list:
    """The callables among ``wanted`` (module name -> function names) this torch has: a module or a
    name it lacks is left out (serialize/read/untrusted.py's pre-dispatch region functions)."""
    import importlib

    found = []
    for module_name, function_names in wanted.items():
        try:
            module = importlib.import_module(module_name)
        except ImportError:
            continue
        found.extend(fn for fn in (getattr(module, name, None) for name in function_names) if callable(fn))
    return found


def hinted_expressions(shape_env):
    """The expressions ``shape_env`` holds a hint for (ShapeEnv.backed_var_to_val); empty where this torch
    names that otherwise (serialize/read/deserialize.py then takes torch's own path)."""
    return getattr(shape_env, "backed_var_to_val", None) or ()


def hop_takes_operator(hop: str, op) -> bool:
    """Whether the higher-order op ``hop`` takes the operator ``op``, by torch's own rule for it:
    with_effects an op with effects, auto_functionalized(_v2) an op it can make functional, out_dtype
    one of its allowed ops. True where this torch has no such rule (serialize/read/untrusted.py)."""
    import importlib

    try:
        if hop == "with_effects":
            return bool(importlib.import_module("torch._higher_order_ops.effects").has_effects(op))
        if hop in ("auto_functionalized", "auto_functionalized_v2"):
            return bool(importlib.import_module("torch._higher_order_ops.auto_functionalize").can_auto_functionalize(op))
        if hop == "out_dtype":
            return op in importlib.import_module("torch._higher_order_ops.out_dtype").ALLOWABLE_OPS
    except (ImportError, AttributeError, TypeError):
        return True
    return True


def guards_code(ep) -> list[str]:
    """The input guards torch.export recorded for ``ep`` (``ExportedProgram._guards_code``: the relations
    of derived dims, ``x.size(0) - 1 == y.size(0)``), which its module() checks at every call."""
    return list(getattr(ep, "_guards_code", None) or [])


def check_call_structure(args, kwargs, in_spec) -> list:
    """torch's own check of a call's (args, kwargs) against a program's input spec, as its module()
    makes it (keywords in any order, a torch.Size for a tuple): the flat inputs with their paths, or
    torch's ValueError where the structures differ."""
    from torch.export._unlift import _check_inputs_match

    return _check_inputs_match(args, kwargs, in_spec)


def check_module_inputs(module, args, kwargs) -> None:
    """torch's check of a call's inputs against the placeholders and ranges of ``module`` (an
    ``ep.module()``), which its own forward pre-hook makes when the module has no guard function:
    torch's RuntimeError naming the input where one does not match."""
    from torch.export._unlift import _check_input_constraints_for_module

    _check_input_constraints_for_module(module, args, kwargs)


def with_guards_of(made, source):
    """``made`` (a program built from ``source``, with the same inputs) checking the input guards
    ``source`` records: the ExportedProgram constructor takes none, and a program without them runs
    inputs that break a derived dim's relation into a shape error deep inside."""
    if guards_code(source) and not guards_code(made):
        made._guards_code = guards_code(source)
    return made


def as_aten_dialect(ep):
    """``ep`` (a functional program pt2b lowered) declaring the ATen dialect and its verifier, as
    torch's own run_decompositions output does (``ep.dialect == "ATEN"``): consumers that take a
    lowered program (coremltools) refuse one that still says "TRAINING"; its tensor metadata filled
    (``with_tensor_meta``). Returns ``ep``."""
    from .serializer import load_verifier

    ep._verifiers = [load_verifier("ATEN")]
    with_tensor_meta(ep.graph_module)
    return ep


def with_tensor_meta(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """Each input's and call node's ``meta["tensor_meta"]`` in ``gm`` and its subgraphs filled from its
    ``meta["val"]`` where missing, as torch's own passes leave them (StableHLO exporters and torch-mlir's
    importer read it). Returns ``gm``."""
    from torch.fx.passes.shape_prop import _extract_tensor_metadata

    for module in gm.modules():
        if not isinstance(module, torch.fx.GraphModule):
            continue
        for node in module.graph.nodes:
            val = node.meta.get("val")
            if node.op in ("placeholder", "call_function") and "tensor_meta" not in node.meta \
                    and isinstance(val, torch.Tensor):
                node.meta["tensor_meta"] = _extract_tensor_metadata(val)
    return gm
