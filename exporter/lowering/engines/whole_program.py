"""The whole-program retrace: an ExportedProgram functionalized with a decomposition table applied,
in one trace of its whole graph (exporter/functionalize.py's functionalize_graph, after its functorch
regions are flattened: functorch_regions.py), rebuilt as a new ATen-dialect ExportedProgram: its
inputs renamed back, effect tokens threaded as torch's retrace leaves them, mutations returned per the
graph signature. The engine every other one falls back to (lowering/engines/__init__.py)."""

from __future__ import annotations

import contextlib

import torch

from ...errors import LoweringError
from ...functionalize import (LOCK, forced_decompositions, functionalize_graph, insert_runtime_asserts,
                              materialize_conj, program_fake_mode)
from ...mutation import may_mutate
from . import functorch_regions

__all__ = ["needs_functionalization", "retrace"]


def retrace(ep, table: dict | None = None):
    """``ep`` functionalized, with ``table`` (op -> decomposition, applied exactly as given, in the
    same trace) as a new ATen-dialect ExportedProgram. Without a table only the decompositions every
    retrace applies (forced_ops) are, and ``ep`` itself is returned when it has no mutation."""
    if table is None:
        if not needs_functionalization(ep):
            return ep
        table = forced_decompositions()
    with LOCK:
        try:
            return _retraced(ep, table)
        except LoweringError:
            raise
        except Exception as e:
            raise LoweringError(f"decomposition failed: {type(e).__name__}: {e}") from e


def needs_functionalization(ep) -> bool:
    """Whether retrace(ep) (no table) changes ``ep``: it may write in place or holds a functorch region."""
    return may_mutate(ep) or functorch_regions.has_regions(ep.graph_module)


def _retraced(ep, table: dict):
    gm = ep.graph_module
    old_phs = [n for n in gm.graph.nodes if n.op == "placeholder"]
    if functorch_regions.has_regions(gm):
        gm = functorch_regions.flatten_regions(gm, program_fake_mode(gm))
    new_gm, aot_sig = functionalize_graph(gm, old_phs, table)
    # as torch's retrace does, an unused random draw is dead code too
    new_gm.graph.eliminate_dead_code(is_impure_node=lambda n: n.is_impure(impure_random=False))
    materialize_conj(new_gm)
    tokens, new_phs = _split_tokens(new_gm, aot_sig)
    if not tokens:
        tokens = _thread_effects(new_gm, aot_sig)
    if len(new_phs) != len(old_phs):
        raise LoweringError(f"the retrace has {len(new_phs)} inputs where the program has {len(old_phs)}.")
    traced_names = {ph.name: ph for ph in new_phs}  # aot_sig names the inputs as traced, before _rename
    _rename(new_gm, old_phs, new_phs)
    insert_runtime_asserts(new_gm)  # (ExportedProgram generates the code once, in _program)
    sig = _signature(ep, new_gm, tokens, new_phs, aot_sig, traced_names)
    for old, new in zip(old_phs, new_phs):
        if not isinstance(old.meta.get("val"), torch.Tensor):
            new.meta["val"] = old.meta.get("val")
        if new.target in sig.inputs_to_parameters or new.target in sig.inputs_to_buffers:
            new.meta.update(old.meta)
    return _program(ep, new_gm, sig)  # threaded effect tokens stay, as in torch's result


def _thread_effects(gm, aot_sig) -> list:
    """Side-effecting ops (linalg's error checks, prints) called through with_effects on a token
    that the program takes and returns, as torch's retrace below autograd leaves them (above it
    they stay plain calls). [the token placeholder] or []."""
    import operator

    from ..._torch.tracing import detect_fake_mode_from_gm as _detect_fake_mode_from_gm
    from ..._torch.tracing import has_effects, with_effects

    calls = [n for n in gm.graph.nodes if n.op == "call_function" and isinstance(n.target, torch._ops.OpOverload)
             and has_effects(n.target)]
    if not calls:
        return []
    graph = gm.graph
    fake_mode = _detect_fake_mode_from_gm(gm)  # also a program without tensor inputs
    with graph.inserting_before(next(iter(graph.nodes))):
        token = graph.placeholder("token")
    with fake_mode or contextlib.nullcontext():
        token.meta["val"] = torch.empty(0)
    for call in calls:
        val = call.meta.get("val")
        results = () if val is None else tuple(val) if isinstance(val, (tuple, list)) else (val,)
        with graph.inserting_before(call):
            node = graph.call_function(with_effects, (token, call.target, *call.args), dict(call.kwargs))
            node.meta.update(call.meta)
            node.meta["val"] = (token.meta["val"], *results)
            token = graph.call_function(operator.getitem, (node, 0))
            token.meta["val"] = node.meta["val"][0]
            if isinstance(val, (tuple, list)):
                for user in list(call.users):  # getitem(call, i) -> getitem(node, i + 1)
                    user.args = (node, user.args[1] + 1)
            elif results:
                single = graph.call_function(operator.getitem, (node, 1))
                single.meta["val"] = val
                call.replace_all_uses_with(single)
        graph.erase_node(call)
    out = graph.output_node()
    out.args = ((token, *out.args[0]),)
    aot_sig.output_tokens[:] = [token.name]
    return [n for n in graph.nodes if n.op == "placeholder"][:1]


def _split_tokens(gm, aot_sig):
    """(effect-token placeholders, the others). Tokens no op threads (the trace adds one when an
    op it looked into, such as linalg_inv's error check, has effects) are taken out at once."""
    phs = [n for n in gm.graph.nodes if n.op == "placeholder"]
    tokens, rest = phs[:len(aot_sig.input_tokens)], phs[len(aot_sig.input_tokens):]
    out = gm.graph.output_node()
    outs = list(out.args[0])
    n_out = len(aot_sig.output_tokens)
    if tokens and all(o in tokens for o in outs[:n_out]) and all(set(t.users) <= {out} for t in tokens):
        out.args = (tuple(outs[n_out:]),)
        for t in tokens:
            gm.graph.erase_node(t)
        aot_sig.output_tokens.clear()
        tokens = []
    return tokens, rest


def _rename(gm, old_phs, new_phs) -> None:
    """Placeholders take the program's names; other nodes move aside where they would clash."""
    from ..._torch.tracing import name_hoo_subgraph_placeholders as _name_hoo_subgraph_placeholders

    for old, new in zip(old_phs, new_phs):
        new.name = new.target = old.name
    taken = {n.name for n in new_phs}
    everything = {n.name for n in gm.graph.nodes}
    for node in gm.graph.nodes:
        if node.op == "placeholder":
            continue
        if node.name in taken:
            i = 1
            while f"{node.name}_{i}" in taken or f"{node.name}_{i}" in everything:
                i += 1
            node.name = f"{node.name}_{i}"
        taken.add(node.name)
    _name_hoo_subgraph_placeholders(gm)


def _signature(ep, gm, tokens, new_phs, aot_sig, traced_names):
    from torch.export.graph_signature import (ConstantArgument, ExportGraphSignature, InputKind, InputSpec,
                                              OutputKind, OutputSpec, SymBoolArgument, SymFloatArgument,
                                              SymIntArgument, TensorArgument, TokenArgument)

    def arg(old, node):
        if isinstance(old, ConstantArgument):
            return old
        for kind in (TensorArgument, SymIntArgument, SymFloatArgument, SymBoolArgument):
            if isinstance(old, kind):
                return kind(name=node.name)
        raise LoweringError(f"the program's signature holds an argument pt2b cannot retrace: {old!r}.")

    old_sig = ep.graph_signature
    outs = list(gm.graph.output_node().args[0])
    n_tok = len(aot_sig.output_tokens)
    input_specs = [InputSpec(InputKind.TOKEN, TokenArgument(name=t.name), None) for t in tokens]
    input_specs += [InputSpec(s.kind, arg(s.arg, new_phs[i]), s.target, s.persistent)
                    for i, s in enumerate(old_sig.input_specs)]
    output_specs = [OutputSpec(OutputKind.TOKEN, TokenArgument(name=o.name), None) for o in outs[:n_tok]]
    outs = outs[n_tok:]
    position = {name: i for i, name in enumerate(aot_sig.user_inputs)}
    # an in-place op that leaves its input as it was (conj_physical_ of a real tensor) returns the input
    # itself as the mutation's output: aot_sig names that placeholder as traced
    mutated = [(traced_names[o].name if o in traced_names else o, i) for o, i in aot_sig.user_inputs_to_mutate.items()]
    if [name for name, _ in mutated] != [n.name for n in outs[:len(mutated)]]:
        raise LoweringError("the retrace's mutation outputs are out of order.")
    for out_name, in_name in mutated:
        spec = old_sig.input_specs[position[in_name]]
        if spec.kind == InputKind.CONSTANT_TENSOR and isinstance(ep.constants.get(spec.target), torch.Tensor):
            # a plain tensor attribute the model updates in place (a static KV cache kept as an attribute,
            # not a buffer): eager keeps the update across calls, which a non-persistent buffer does;
            # torch's run_decompositions refuses it ("register it as buffer")
            i = position[in_name] + len(tokens)
            input_specs[i] = InputSpec(InputKind.BUFFER, input_specs[i].arg, spec.target, persistent=False)
            output_specs.append(OutputSpec(OutputKind.BUFFER_MUTATION, TensorArgument(name=out_name), spec.target))
        elif spec.kind == InputKind.BUFFER:
            output_specs.append(OutputSpec(OutputKind.BUFFER_MUTATION, TensorArgument(name=out_name), spec.target))
        elif spec.kind == InputKind.USER_INPUT:
            output_specs.append(OutputSpec(OutputKind.USER_INPUT_MUTATION, TensorArgument(name=out_name),
                                           spec.arg.name))
        elif spec.kind == InputKind.PARAMETER:  # `with torch.no_grad(): self.p.div_(2)`: as torch records it
            output_specs.append(OutputSpec(OutputKind.PARAMETER_MUTATION, TensorArgument(name=out_name), spec.target))
        else:
            raise LoweringError(f"the program mutates {spec.kind.name.lower()} {spec.target!r}, which pt2b "
                                f"cannot write back (only buffers and user inputs can be mutated).")
    renamed = {s.arg.name: new_phs[i].name for i, s in enumerate(old_sig.input_specs)
               if not isinstance(s.arg, ConstantArgument)}
    user_outs = list(old_sig.output_specs)
    if len(outs) != len(mutated) + len(user_outs):
        raise LoweringError(f"the retrace returns {len(outs)} values where {len(mutated) + len(user_outs)} "
                            f"are expected.")
    for i, s in enumerate(user_outs):
        output_specs.append(OutputSpec(s.kind, arg(s.arg, outs[len(mutated) + i]), renamed.get(s.target, s.target)))
    return ExportGraphSignature(input_specs=input_specs, output_specs=output_specs)


def _program(ep, gm, sig):
    from torch.export import ExportedProgram
    from ..._torch.tracing import get_updated_module_call_graph as _get_updated_module_call_graph
    from ..._torch.tracing import get_updated_range_constraints as _get_updated_range_constraints

    gm.meta.update(ep.graph_module.meta)
    return ExportedProgram(
        root=gm, graph=gm.graph, graph_signature=sig, state_dict=ep.state_dict,
        range_constraints=_get_updated_range_constraints(gm, ep.range_constraints),
        module_call_graph=_get_updated_module_call_graph(ep.graph_module, ep.graph_signature, gm, sig,
                                                         ep.module_call_graph),
        example_inputs=ep.example_inputs, constants=ep.constants)
