"""StableHLO through torchax (the PyTorch/XLA line's exporter) and JAX: torchax's own op registry and
decompositions, its StableHLO export of the program (a ``jax.export.Exported``) and JAX's run of it.

The op list is ``torchax.ops.all_aten_jax_ops()`` (an op registered by its packet is every overload of
it), the decompositions ``torchax.decompositions.DECOMPOSITIONS``. The hand-off is what
``torchax.export.exported_program_to_stablehlo(program)`` does, made from torchax's parts with three of
its defects routed around (``_jax_function``, ``_avals``): the weights as JAX arrays and the
``Exported`` (``.mlir_module()`` is the StableHLO module), run on JAX's default device (the CPU with
jax[cpu]).

pip install 'torchax>=0.0.14.dev0' 'jax[cpu]'  (torch 2.13 needs torchax's pre-release)
"""

from __future__ import annotations

import torch

from . import Backend, calling, first_line, retraceable
from ..errors import BackendRunError


def _supported_ops() -> tuple[str, ...]:
    """The overloads torchax lowers to JAX functions, read from its registry; its other entries (the
    in-place forms it runs through torch's dispatcher) are no StableHLO."""
    from torchax.ops import all_aten_jax_ops

    from ..ops import op_name

    ops = set()
    for key in all_aten_jax_ops():
        if isinstance(key, torch._ops.OpOverload):
            ops.add(op_name(key))
        elif isinstance(key, torch._ops.OpOverloadPacket):  # torchax looks a missing overload up by its packet
            ops.update(op_name(getattr(key, overload)) for overload in key.overloads())
    return retraceable(sorted(ops))


def _table() -> dict:
    from torchax.decompositions import DECOMPOSITIONS

    return {op: fn for op, fn in DECOMPOSITIONS.items() if isinstance(op, torch._ops.OpOverload)}


def _avals(ep, names: dict | None = None) -> list:
    """The abstract values of ``ep``'s user inputs for ``jax.export``, every dynamic dim a symbol of ONE
    scope holding every range constraint: torchax's own ``extract_avals`` gives each constrained symbol
    a scope of its own, which ``jax.export`` refuses for a program with two dynamic dims ("Invalid
    mixing of symbolic scopes"). ``names``: torch's symbol -> the name to give it (the user's Dim)."""
    import re

    import jax
    import sympy
    from torchax.ops.mappings import t2j_dtype

    named = lambda text: re.sub(r"\b\w+\b", lambda m: (names or {}).get(m[0], m[0]), text)  # noqa: E731
    bounds = []
    for sym, r in ep.range_constraints.items():
        # jax takes every dim as at least 1; the other bounds are torch's (its unbounded end, int_oo, is
        # no sympy Integer)
        if isinstance(sym, sympy.Symbol):
            bounds += [named(f"{sym} >= {int(r.lower)}")] if r.lower.is_Integer and r.lower > 1 else []
            bounds += [named(f"{sym} <= {int(r.upper)}")] if r.upper.is_Integer else []
    scope = jax.export.SymbolicScope(bounds)
    dim = lambda d: d if isinstance(d, int) else jax.export.symbolic_shape(named(str(d)), scope=scope)[0]  # noqa: E731
    user = {s.arg.name for s in ep.graph_signature.input_specs if s.kind.name == "USER_INPUT"}
    avals = []
    for node in ep.graph.nodes:
        if node.op == "placeholder" and node.name in user:
            val = node.meta["val"]
            avals.append(jax.ShapeDtypeStruct([dim(d) for d in val.shape], t2j_dtype(val.dtype))
                         if isinstance(val, torch.Tensor) else jax.ShapeDtypeStruct([], type(val)))
    return avals


def _full_conv_padding(ep) -> None:
    """Each ``aten.convolution`` of ``ep`` whose padding is one element written out for every spatial
    dim (``[0]`` as ``[0, 0]``: the same convolution), in place. torchax widens such a padding by
    writing into the list it is given, and the fx interpreter it runs gives it fx's immutable list
    ("'immutable_list' object does not support mutation"): ``Conv2d(padding="valid")``, in every SigLIP
    vision tower."""
    from ..graph_walk import walk_graphs

    for _, sub in walk_graphs(ep.graph_module):
        for node in sub.graph.nodes:
            if node.op == "call_function" and node.target is torch.ops.aten.convolution.default:
                stride, padding = node.args[3], node.args[4]
                if len(padding) == 1 < len(stride):
                    node.args = (*node.args[:4], list(padding) * len(stride), *node.args[5:])
        sub.recompile()


def _jax_function(ep) -> tuple:
    """(weights, func): torchax's JAX function of ``ep``, as ``torchax.export.exported_program_to_jax``
    makes it (torch's default decompositions, torchax's over them, torchax's interpreter of the graph),
    ``func(weights, [user inputs])`` returning the program's outputs but the buffers it writes. Two of
    its defects routed around: it takes the weights as parameters, then buffers, then constants, where
    torch's decompositions may put the constants before the buffers (d_fine's program: a buffer of 4
    values read as one of 2), so each weight goes where the program's signature puts it; and
    ``_full_conv_padding``."""
    from torch.export.graph_signature import InputKind, OutputKind
    from torchax import default_env
    from torchax.decompositions import DECOMPOSITIONS
    from torchax.export import JaxInterpreter

    ep = ep.run_decompositions().run_decompositions(DECOMPOSITIONS)  # a new program: its graph is ours
    _full_conv_padding(ep)
    values = {**ep.state_dict, **ep.constants}
    specs = ep.graph_signature.input_specs
    weights = default_env().t2j_copy([values[s.target] for s in specs if s.kind != InputKind.USER_INPUT])
    kept = [s.kind != OutputKind.BUFFER_MUTATION for s in ep.graph_signature.output_specs]
    gm = ep.graph_module

    def func(weights, inputs):  # inputs: ([user inputs],), as torchax's own function takes them
        given, taken = iter(weights), iter(inputs[0])
        args = [next(taken) if s.kind == InputKind.USER_INPUT else next(given) for s in specs]
        out = JaxInterpreter(gm).run(*args, enable_io_processing=False)
        return [value for value, keep in zip(out, kept) if keep]

    return weights, func


def hand_off(ep):
    """What ``torchax.export.exported_program_to_stablehlo(ep)`` does, its defects routed around
    (``_jax_function``, ``_avals``): the ``jax.export.Exported`` of torchax's JAX function of the
    program (``.mlir_module()`` is the StableHLO module), ``ep``, and the weights it takes as its first
    argument. 64-bit types are on while it traces: JAX otherwise narrows int64 and float64 to 32 bits."""
    import jax

    with jax.enable_x64(True):
        weights, func = _jax_function(ep)
        exported = jax.export.export(jax.jit(func))(weights, (_avals(ep),))
    return exported, ep, weights


def run(exported, ep, args, kwargs, plan=None):
    """``plan``: the weights hand_off made. The module takes (weights, ([user inputs],)) and returns the
    program's outputs, those that update the caller's inputs first, not the buffers it writes."""
    import jax
    from torch.export.graph_signature import OutputKind
    from torchax.ops.mappings import t2j

    leaves = calling.flat_inputs(ep, args, kwargs)
    with jax.enable_x64(True):
        inputs = [t2j(leaf) if isinstance(leaf, torch.Tensor) else leaf for leaf in leaves]
        try:
            result = exported.call(plan, (inputs,))
        except ValueError as e:  # jax.export's check of the call's shapes and dtypes against the module's
            raise BackendRunError(f"the StableHLO module refused the call: {first_line(e)}; call it as the "
                                  f"exported model was called, within its dynamic dims' ranges.") from None
    specs = [s for s in calling.computed_specs(ep) if s.kind != OutputKind.BUFFER_MUTATION]
    if len(result) != len(specs):
        raise BackendRunError(f"StableHLO returned {len(result)} outputs for the program's {len(specs)}.")
    # a copy: the arrays are JAX's, immutable, and the caller may write into what it gets
    produced = {s.arg.name: torch.from_dlpack(v).clone() if isinstance(v, jax.Array) else v
                for s, v in zip(specs, result) if hasattr(s.arg, "name")}
    return calling.user_outputs(ep, produced, leaves)


def save(compiled, path: str) -> None:
    """A ``jax.export`` serialization of the module with the weights in it as constants: the StableHLO
    module (portable, versioned) and its calling convention, its dynamic dims named as the user named
    them at export (``batch``, not torch's ``s31``), which ``jax.export.deserialize(bytes)`` loads and
    ``.call(*inputs)`` runs, no torch needed. Its inputs are the program's user inputs in order, then a
    carried state's buffers; its outputs the program's, then the buffers' new values."""
    import jax

    exported, weights = compiled.native, compiled.plan
    with jax.enable_x64(True):
        whole = jax.export.export(jax.jit(lambda *inputs: exported.call(weights, (list(inputs),))))(
            *_avals(compiled.program, compiled.dim_names))
        data = whole.serialize()
    with open(path, "wb") as f:
        f.write(data)


def backend() -> Backend:
    from importlib.metadata import version

    return Backend("stablehlo", f"{version('torchax')}+jax{version('jax')}", _supported_ops(),
                   "torchax.ops.all_aten_jax_ops() (its registry of ATen ops lowered to JAX)", _table, hand_off, run,
                   "JAX's default device (the CPU with jax[cpu]), 64-bit types on", save=save, file_suffix=".jax_exported",
                   holds_state=False)  # the module returns no buffer it writes: pt2b lifts them (state.py)
