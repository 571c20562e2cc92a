"""What pt2b calls in torch._functorch: aot_export_module, its config's RNG switch, the unwrapping of
subclass weights and the pre-dispatch region functions. The first three import torch._dynamo: on call."""

from __future__ import annotations

__all__ = ["aot_export_module", "functionalizes_rng_ops", "predispatch_functions",
           "unwrap_tensor_subclass_parameters"]


def aot_export_module(*args, **kwargs):
    """torch._functorch.aot_autograd.aot_export_module, imported on the first call."""
    from torch._functorch.aot_autograd import aot_export_module as export

    return export(*args, **kwargs)


def functionalizes_rng_ops() -> bool:
    """torch._functorch.config.functionalize_rng_ops: whether traces read the Philox RNG-state tracker."""
    from torch._functorch import config

    return bool(config.functionalize_rng_ops)


def unwrap_tensor_subclass_parameters(module):
    """torch's unwrapping of ``module``'s tensor-subclass weights into their plain inner tensors, in place
    (torch._functorch._aot_autograd.subclass_parametrization), as run_decompositions does."""
    from torch._functorch._aot_autograd.subclass_parametrization import unwrap_tensor_subclass_parameters as unwrap

    return unwrap(module)


def predispatch_functions(*names: str) -> frozenset:
    """The functions of torch._functorch.predispatch named ``names`` (vmap and jvp region markers) that
    this torch defines; a name it lacks is left out."""
    import torch._functorch.predispatch as predispatch

    return frozenset(f for f in (getattr(predispatch, n, None) for n in names) if f is not None)
