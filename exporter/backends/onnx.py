"""ONNX through torch.onnx (onnxscript's torchlib) and onnxruntime: the ops torchlib translates, as
torch.onnx's own registry lists them (``ONNXRegistry.from_torchlib()``) plus the names onnxscript
declares that this torch lacks (reported, not fatal), plus the ops transformers' ONNX translation
table converts where transformers is installed (library_tables); no decompositions of its own
(torch.onnx decomposes with torch's table what torchlib lacks, as pt2b does); the hand-off is
``torch.onnx.export(program)`` with that table, an ``ONNXProgram``; onnxruntime runs it.

pip install pt2b[onnx]  (onnx, onnxscript, onnxruntime)
"""

from __future__ import annotations

import functools

import torch

from . import Backend, calling, library_tables, quiet_logger, retraceable
from .._torch.pytree import pytree


def _qualified(name: str) -> str:
    """torchlib writes the default overload without its name ('aten::abs'); pt2b names it."""
    ns, _, rest = name.partition("::")
    return name if "." in rest else f"{name}.default"


@functools.cache
def _registry():
    from .._torch.compilers import ONNX_REGISTRATION, onnx_torchlib_registry

    with quiet_logger(ONNX_REGISTRATION):  # its "torchvision is not installed" warnings concern no op pt2b reads
        return onnx_torchlib_registry()


def _supported_ops(library: library_tables.LibraryTable) -> tuple[str, ...]:
    from onnxscript import _framework_apis

    from .._torch.compat import TORCH_OWN_LIBRARIES, load_torch_own_libraries
    from ..ops import op_name

    # torchlib registers an op only where the running torch defines it: torch's own libraries
    # (quantized_decomposed) loaded first, the list is the same whatever was imported before
    load_torch_own_libraries(TORCH_OWN_LIBRARIES)
    registry = _registry()
    ops = set()
    for targets in registry.functions.values():
        for meta in targets:
            if isinstance(meta.fx_target, torch._ops.OpOverload):
                ops.add(op_name(meta.fx_target))
    # onnxscript's own declarations, as they come: names this torch lacks are reported by the lowering
    api = getattr(_framework_apis, "torch_2_5")
    ops.update(_qualified(meta.qualified_name) for meta in api.get_torchlib_ops()
               if meta.qualified_name.startswith(("aten::", "prims::")))
    # the library's translations: torch.onnx.export takes them as it takes torchlib's (hand_off passes them)
    ops.update(library.ops)
    return retraceable(sorted(ops))


def hand_off(ep, *, opset_version: int | None = None, optimize: bool = True,
             custom_translation_table: dict | None = None, library: library_tables.LibraryTable | None = None):
    """``torch.onnx.export`` of ``ep`` with ``library``'s translation table (transformers', where it is
    installed) and ``custom_translation_table`` over it: an ``ONNXProgram`` (``.model_proto``,
    ``.save(path)``), and the program torch.onnx translated (after its own decompositions, a no-op on
    pt2b's lowering)."""
    options = {"opset_version": opset_version} if opset_version is not None else {}
    table = {**(library.entries if library else {}), **(custom_translation_table or {})}
    if table:
        options["custom_translation_table"] = table
    with quiet_logger("torch.onnx"):
        onnx_program = torch.onnx.export(ep, (), dynamo=True, optimize=optimize, verbose=False, **options)
    return onnx_program, onnx_program.exported_program


def run(onnx_program, ep, args, kwargs):
    """Run on onnxruntime's CPU provider (ONNXProgram's own session); inputs by graph input name (an input
    the translation made a constant, such as a size export specialized, is no graph input), outputs by
    graph output name."""
    leaves = calling.flat_inputs(ep, args, kwargs)
    names = [s.arg.name for s in ep.graph_signature.input_specs if s.kind.name == "USER_INPUT"]
    by_name = dict(zip(names, leaves))
    graph_inputs = [v.name for v in onnx_program.model.graph.inputs]
    fed = [by_name[n] for n in graph_inputs] if all(n in by_name for n in graph_inputs) else leaves
    outs = onnx_program(*fed)
    produced = dict(zip((v.name for v in onnx_program.model.graph.outputs), outs))
    return calling.user_outputs(ep, produced, leaves)


def backend() -> Backend:
    import onnxruntime
    import onnxscript

    library = library_tables.transformers_table("onnx")
    version = f"{onnxscript.__version__}+ort{onnxruntime.__version__}"
    source = "torch.onnx's ONNXRegistry.from_torchlib() (onnxscript torchlib)"
    if library:  # the table changes what the backend makes of a program: the version (and key) names it
        version += f"+{library.library}"
        source += f" and {library.library}'s translation table ({library.where})"
    return Backend("onnx", version, _supported_ops(library), source, dict,
                   functools.partial(hand_off, library=library), run, save=save, file_suffix=".onnx")


def save(compiled, path: str) -> None:
    """The ONNX model (ONNXProgram.save: the graph and its initializers), run by onnxruntime, its
    dynamic dims named as the user named them at export (``batch``, not torch's ``s31``). A carried
    state (the buffers the program writes, lifted) comes in as inputs ``state.<buffer>`` after the
    user's own and goes out as outputs ``state_out.<buffer>`` after the user's own: the caller feeds
    each output back as the next call's input."""
    model = compiled.native.model
    _name_dims(model, compiled.dim_names)
    inputs = [v.name for v in model.graph.inputs]  # what run() feeds the session by
    made = [v.name for v in model.graph.outputs]  # what run() maps the session's outputs by
    _name_outputs(model, compiled.program, _state_names(compiled))
    try:
        compiled.native.save(path)
    finally:
        for value, name in zip(model.graph.inputs, inputs):
            value.name = name
        for value, name in zip(model.graph.outputs, made):
            value.name = name


def _state_names(compiled) -> list[str]:
    """The carried buffers' names, in the order the lifted program takes them (none: no state carried)."""
    return list(compiled.carry.names) if compiled.carry is not None else []


def _name_outputs(model, ep, state: list[str]) -> None:
    """Name the graph's outputs by where each sits in the program's output structure ("logits",
    "past_key_values.0.1"; one tensor: "output"), not by the node that made it ("linear_14"), where
    the graph returns exactly the program's outputs; a lifted program's ``state`` (buffer names): its
    inputs ``state.<name>`` and the new values ``state_out.<name>``."""
    spec = ep.call_spec.out_spec
    outputs = model.graph.outputs
    if spec is None or spec.num_leaves != len(outputs):
        return
    if state:  # (the user's outputs, {buffer: new value}) and (*args, {buffer: value}), kwargs
        written = spec.child(1).context
        spec = spec.child(0)
        user = [s.arg.name for s in ep.graph_signature.input_specs if s.kind.name == "USER_INPUT"]
        by_name = dict(zip(user[len(user) - len(state):], state))
        for value in model.graph.inputs:
            if value.name in by_name:
                value.name = f"state.{by_name[value.name]}"
    paths, _ = pytree.tree_flatten_with_path(pytree.tree_unflatten(list(range(spec.num_leaves)), spec))
    names = [".".join(str(getattr(k, "key", getattr(k, "idx", getattr(k, "name", k)))) for k in path) or "output"
             for path, _ in paths]
    if state:
        names += [f"state_out.{n}" for n in written]
    taken = {v.name for v in model.graph.inputs} | set(model.graph.initializers) | {
        v.name for node in model.graph.all_nodes() for v in node.outputs if v not in outputs}
    if len(set(names)) != len(names) or taken & set(names):
        return
    for value, name in zip(outputs, names):
        value.name = name


def _name_dims(model, names: dict) -> None:
    """Rename the symbolic dims of every value of ``model`` (an onnx_ir.Model) by ``names`` (torch's
    symbol -> the user's Dim name)."""
    import onnx_ir as ir

    if not names:
        return

    def renamed(value):
        shape = value.shape
        if shape is None or not any(isinstance(d, ir.SymbolicDim) and d.value in names for d in shape):
            return
        value.shape = ir.Shape([ir.SymbolicDim(names[d.value]) if isinstance(d, ir.SymbolicDim) and d.value in names
                                else d for d in shape])

    graph = model.graph
    for value in (*graph.inputs, *graph.outputs):
        renamed(value)
    for node in graph.all_nodes():
        for value in node.outputs:
            renamed(value)
