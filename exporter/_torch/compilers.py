"""The private tables of the compilers inside torch that pt2b's backends read: Inductor's lowerings,
fallbacks and decompositions, torch.onnx's torchlib registry and assertion pass. Each imports on call."""

from __future__ import annotations

__all__ = ["ONNX_REGISTRATION", "inductor_decompositions", "inductor_lowerings", "onnx_assertion_pass",
           "onnx_torchlib_registry"]

ONNX_REGISTRATION = "torch.onnx._internal.exporter._registration"  # its module, and its logger's name


def inductor_lowerings() -> tuple:
    """(lowerings, fallbacks): the ops Inductor lowers itself and those it falls back to ATen for
    (torch._inductor.lowering)."""
    from torch._inductor.lowering import fallbacks, lowerings

    return lowerings, fallbacks


def inductor_decompositions() -> dict:
    """The decompositions Inductor applies itself (torch._inductor.decomposition.select_decomp_table)."""
    from torch._inductor.decomposition import select_decomp_table

    return select_decomp_table()


def onnx_torchlib_registry():
    """torch.onnx's ONNXRegistry.from_torchlib(): the ops onnxscript's torchlib translates."""
    from torch.onnx._internal.exporter import _registration

    return _registration.ONNXRegistry.from_torchlib()


def onnx_assertion_pass():
    """torch.onnx's pass that erases the runtime assertions of a GraphModule (and of its submodules)
    before translating it: ``remove_assertion_nodes(graph_module)``, in place."""
    from torch.onnx._internal.exporter import _fx_passes

    return _fx_passes.remove_assertion_nodes
