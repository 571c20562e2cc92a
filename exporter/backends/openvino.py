"""OpenVINO: ``openvino.convert_model(exported_program)`` reads a torch.export program through its
PyTorch frontend, which first runs torch's default decompositions minus the ops it translates itself
(``export_decompositions.ops_to_not_decompose()``) and translates whatever that leaves. The preset does
the same: that table, read from the installed torch and OpenVINO, and every op it leaves accepted (an
op OpenVINO then has no translator for is OpenVINO's gap, as it is on torch.export's own program). The
ops it names are the core ATen ops (torch.Tag.core) plus that list, plus, where transformers is installed,
the ops its conversion extensions translate that the table leaves (library_tables; convert_model gets
the extensions). The hand-off is an ``openvino.CompiledModel`` for the CPU device, in float32
(``INFERENCE_PRECISION_HINT=f32``: on CPUs with AMX or AVX512-BF16 OpenVINO otherwise computes in bf16).
A lifted program's floating state becomes the model's variables, held by its infer request (``stateful``).

pip install pt2b[openvino]
"""

from __future__ import annotations

import dataclasses
import functools

import torch

from . import Backend, attention, calling, library_tables
from .complex_pairs import complex_as_real_pairs
from .ov_usage_events import without_usage_events
from .._torch.pytree import pytree
from ..errors import BackendRunError
from ..ops import op_name

SETTINGS = "device CPU, INFERENCE_PRECISION_HINT=f32 (OpenVINO computes in bf16 on AMX/AVX512-BF16 CPUs otherwise)"


def _supported_ops(library: library_tables.LibraryTable) -> tuple[str, ...]:
    from ..lowering.presets import core_names

    core = {n for n in core_names() if n.startswith("aten::")}
    # the library's extensions translate an op only where the table leaves it
    decomposed = {op_name(op) for op in _table()}
    extended = {n for n in library.ops if n not in decomposed}
    return tuple(sorted(core | {op_name(op) for op in _not_decomposed()} | extended))


@functools.cache  # read once a process
def _not_decomposed() -> frozenset:
    from openvino.frontend.pytorch.torchdynamo.export_decompositions import ops_to_not_decompose

    return frozenset(op for op in ops_to_not_decompose() if isinstance(op, torch._ops.OpOverload))


def _table() -> dict:
    """convert_model's own table: torch's default decompositions minus the ops OpenVINO translates."""
    from ..lowering.tables import torch_default_table

    return {op: fn for op, fn in torch_default_table().items() if op not in _not_decomposed()}


def _neg_as_product(x):
    """``-x`` as ``x * -1``, the same values: the form from which OpenVINO's CPU plugin fuses a rotary
    embedding's ``rotate_half`` (its RoPE). Its converter turns ``neg`` into a product with a constant it
    marks unfoldable, and the fusion then does not match (transformers' OpenVINO exporter rewrites it
    alike)."""
    return torch.ops.aten.mul.Tensor(x, -1)


def _cat_without_legacy_empties(tensors, dim=0):
    """``cat`` without its inputs of shape ``(0,)``, which torch skips beside tensors of more dims (a
    legacy rule: flaubert's attention starts its cache as one) and OpenVINO's converter cannot take
    ("Conversion is failed for: SequenceMark, aten.cat.default"): the same values. NotImplemented where
    there is none, nothing else is left, or leaving them out would change the promoted dtype."""
    def legacy_empty(t):
        return t.dim() == 1 and isinstance(t.shape[0], int) and t.shape[0] == 0

    kept = [t for t in tensors if not legacy_empty(t)]
    if len(kept) == len(tensors) or not kept or any(t.dim() == 1 for t in kept):
        return NotImplemented
    promoted = functools.reduce(torch.promote_types, (t.dtype for t in tensors))
    if functools.reduce(torch.promote_types, (t.dtype for t in kept)) != promoted:
        return NotImplemented
    return torch.ops.aten.cat.default(kept, dim)


def _pool_of_the_whole_input_as_mean(x, kernel_size, stride=(), padding=0, ceil_mode=False, count_include_pad=True,
                                     divisor_override=None):
    """``avg_pool2d`` whose one window covers the whole input (a kernel at least the input's height and
    width, no padding: EfficientNet's pooler, ``AvgPool2d(hidden_dim, ceil_mode=True)``, over a smaller
    feature map) as the mean over both dims: the same values, as torch clips the window to the input and
    divides by what it covers. OpenVINO's CPU plugin refuses a kernel larger than its input ("Check
    'cmp::le(kernel, dim.get_length())' failed"). NotImplemented unless the sizes are numbers the
    program fixes."""
    kernel = list(kernel_size) * (2 if len(kernel_size) == 1 else 1)
    pads = [padding] * 2 if isinstance(padding, int) else list(padding) * (2 if len(padding) == 1 else 1)
    height, width = x.shape[-2:]
    if divisor_override is not None or any(p != 0 for p in pads) or not all(
            isinstance(d, int) for d in (height, width, *kernel)) or kernel[0] < height or kernel[1] < width:
        return NotImplemented
    return torch.ops.aten.mean.dim(x, [-2, -1], True)


def _expand_of_nothing_as_full(x, size, implicit=False):
    """``expand`` of a tensor with no elements (a dim of size 0: DINOv3's register tokens where the
    config has none) as a ``full`` of the expanded shape, which has none either. OpenVINO's converter
    dies of a division by zero (SIGFPE, the caller's process with it) on the broadcast of such a tensor.
    NotImplemented where no dim is a known 0."""
    if not any(isinstance(d, int) and d == 0 for d in x.shape):
        return NotImplemented
    lead = len(size) - x.dim()
    shape = [x.shape[i - lead] if i >= lead and isinstance(s, int) and s == -1 else s for i, s in enumerate(size)]
    return torch.ops.aten.full.default(shape, 0, dtype=x.dtype, device=x.device)


def _unfold_along_a_dim_counted_from_the_front(x, dimension, size, step):
    """``unfold`` along a dim counted from the end (``x.unfold(-1, ...)``: inkling2's local windows) as
    the same ``unfold`` along that dim counted from the front, which OpenVINO's converter takes where it
    fails on the other ("Conversion is failed for: aten.unfold.default"). NotImplemented where it is
    counted from the front already."""
    if dimension >= 0:
        return NotImplemented
    return torch.ops.aten.unfold.default(x, dimension % max(x.dim(), 1), size, step)


# the rewrites the hand-off makes in the retrace that applies OpenVINO's own table
_REWRITES = {torch.ops.aten.neg.default: _neg_as_product, torch.ops.aten.cat.default: _cat_without_legacy_empties,
             torch.ops.aten.avg_pool2d.default: _pool_of_the_whole_input_as_mean,
             torch.ops.aten.expand.default: _expand_of_nothing_as_full,
             torch.ops.aten.unfold.default: _unfold_along_a_dim_counted_from_the_front}


def hand_off(ep, *, device: str = "CPU", config: dict | None = None,
             library: library_tables.LibraryTable | None = None, stateful: bool = True, carry=None):
    """``openvino.convert_model`` of ``ep`` after OpenVINO's own table (as convert_model applies it), with
    ``library``'s conversion extensions (transformers', where it is installed), compiled for ``device``
    in float32 unless ``config`` says otherwise. ``carry`` (a lifted program's state.Carry) with
    ``stateful``: the model made stateful (_make_stateful), its infer request holding the state."""
    import openvino
    from openvino.frontend.pytorch.fx_decoder import TorchFXPythonDecoder

    # what convert_model's from_exported_program does first, with pt2b's rewrites in the same retrace
    ep = attention.additive_masks(complex_as_real_pairs(ep), _REWRITES, base=_table())
    gm = ep.module()
    if library:
        _as_builtins(gm, library)
        _scale_in_query(gm, library)
    extensions = {"extension": list(library.entries)} if library else {}
    names, held = _result_names(gm), None
    with without_usage_events():  # (pt2b's conversion, not the user's: ov_usage_events)
        model = openvino.convert_model(TorchFXPythonDecoder(gm, dynamic_shapes=True), **extensions)
    taken = _inputs_taken(model, gm)
    if stateful and carry is not None and taken is None:
        held = _make_stateful(model, ep, carry, names)
    settings = {"INFERENCE_PRECISION_HINT": "f32", **({"KV_CACHE_PRECISION": "f32"} if held else {}), **(config or {})}
    compiled = openvino.Core().compile_model(model, device, settings)
    if held is None:
        return compiled, ep, Converted(names, model, taken=taken)
    request = compiled.create_infer_request()
    kept = [n for i, n in enumerate(names) if i not in held.results]
    shapes = {n: carry.state.initial(n).shape for n in held.variables}
    return compiled, ep, Converted(kept, model, request, held.inputs, tuple(names[i] for i in held.results),
                                   Variables(request, held.variables, shapes))


def _inputs_taken(model, gm) -> tuple | None:
    """The program's flat inputs (by position) that the converted ``model`` takes, in its order, where it
    does not take them all: OpenVINO's converter leaves out an input that only a runtime check reads
    when it comes first (the tensors a split's part takes from the reference's part before, checked by
    ``_assert_tensor_metadata``: tapas, seamless_m4t), and the inputs after it were fed one place off
    (its "vector::_M_range_check"). Matched by name; None where it takes every input, in order."""
    placeholders = [n.name for n in gm.graph.nodes if n.op == "placeholder"]
    ports = [port.get_names() for port in model.inputs]
    if len(ports) == len(placeholders):
        return None
    at = {name: i for i, name in enumerate(placeholders)}
    taken = [next((at[name] for name in names if name in at), None) for names in ports]
    return tuple(taken) if None not in taken else None


@dataclasses.dataclass(frozen=True)
class _Held:
    inputs: frozenset  # the flat inputs the variables replace
    results: frozenset  # the results they replace (indices into the converted model's)
    variables: dict  # buffer name -> variable id


def _make_stateful(model, ep, carry, names: list[str]) -> _Held | None:
    """``model`` (converted from the lifted ``ep``) made stateful in place: each floating buffer that the
    program reads as ``state.<buffer>`` and returns as ``state_out.<buffer>`` becomes a variable of the
    model (OpenVINO's own make-stateful transformation, as transformers' OpenVINO exporter and OpenVINO
    GenAI do with a KV cache), started from the program's own value. Integer buffers stay inputs and
    outputs: the CPU plugin keeps variables in the types it computes in and refuses i64 ones. None where
    nothing is held (the ports do not line up with the program's inputs and outputs: the lifted form)."""
    import numpy as np
    import openvino
    import openvino.opset14 as ops
    from openvino._offline_transformations import apply_make_stateful_transformation

    from .state import lifted_ports

    ports = lifted_ports(ep, carry.names)
    if ports is None or len(model.inputs) != len(ports[2]):
        return None
    new_values, first_state = ports[1], len(ports[2]) - len(carry.names)
    initial = {name: carry.state.initial(name) for name in carry.names}
    pairs, inputs, results, variables = {}, set(), set(), {}
    for i, name in enumerate(carry.names):
        out = new_values.get(name)
        if out is None or names.count(out) != 1 or not initial[name].is_floating_point():
            continue
        model.inputs[first_state + i].get_tensor().set_names({f"state.{name}"})
        # a buffer's shape is fixed: a variable of static shape is one the CPU plugin updates in place
        # (it converts with every input dynamic, and copies a dynamic variable's update whole each call)
        model.inputs[first_state + i].get_node().set_partial_shape(openvino.PartialShape(list(initial[name].shape)))
        model.outputs[names.index(out)].get_tensor().set_names({f"state_out.{name}"})
        pairs[f"state.{name}"] = f"state_out.{name}"
        inputs.add(first_state + i)
        results.add(names.index(out))
        variables[name] = f"state.{name}state_out.{name}"  # (the transformation names a variable so)
    if not pairs:
        return None
    model.validate_nodes_and_infer_types()
    apply_make_stateful_transformation(model, pairs)
    by_id = {v: n for n, v in variables.items()}
    for op in model.get_ops():  # each variable starts from the program's value (a saved model's reset)
        if op.get_type_name() == "ReadValue" and op.get_variable_id() in by_id:
            value = initial[by_id[op.get_variable_id()]].numpy(force=True)
            shape = ops.constant(np.array(value.shape, np.int64))
            zeros = ops.broadcast(ops.constant(np.zeros((), value.dtype)), shape)
            op.set_arguments([zeros if not value.any() else ops.constant(value)])
    return _Held(frozenset(inputs), frozenset(results), variables)


class Variables:
    """The buffers an infer request of a stateful model holds, by name (state.State.hold's holder)."""

    def __init__(self, request, variables: dict[str, str], shapes: dict):
        self.request, self.names, self.shapes = request, frozenset(variables), shapes
        self._buffer = {v: n for n, v in variables.items()}  # variable id -> buffer name

    def pull(self) -> dict:
        """The values the request holds, copied out, by buffer name, in their buffers' shapes: the CPU
        plugin holds a 0-d variable as one of shape (1,)."""
        return {self._buffer[v.name]: torch.from_numpy(v.state.data.copy()).reshape(self.shapes[self._buffer[v.name]])
                for v in self.request.query_state() if v.name in self._buffer}

    def push(self, values: dict) -> None:
        """``values`` (by buffer name) copied into the request's variables."""
        import openvino

        for v in self.request.query_state():
            if v.name in self._buffer:
                v.state = openvino.Tensor(values[self._buffer[v.name]].numpy(force=True).copy())


def _as_builtins(gm, library: library_tables.LibraryTable) -> None:
    """``torch.sym_min``/``sym_max`` nodes of ``gm`` (the module handed over, not the lowered program) as
    the builtins ``min``/``max`` where the library's extensions translate those: OpenVINO finds a
    translation by the target's text, and torch.sym_min's text holds its address, which no extension can
    name, while on SymInts the builtins compute the same."""
    builtins = {sym: builtin for sym, builtin in ((torch.sym_min, min), (torch.sym_max, max))
                if str(builtin) in library.others}
    for module in gm.modules():
        nodes = [n for n in module.graph.nodes if n.op == "call_function" and n.target in builtins] \
            if isinstance(module, torch.fx.GraphModule) else []
        for node in nodes:
            node.target = builtins[node.target]
        if nodes:
            module.recompile()


def _scale_in_query(gm, library: library_tables.LibraryTable) -> None:
    """Each attention of ``gm`` (the module handed over) given a scale other than its default
    ``head_dim ** -0.5`` takes it folded into the query instead, where the library's extension converts
    the attention: transformers' conversion of ``scaled_dot_product_attention`` leaves the scale out
    (OpenVINO then applies its default), and its own export folds the scale into the query before (its
    patch of torch's function), which the graph handed over here has not had. ``softmax(q k^T s)`` is
    ``softmax((q s sqrt(d)) k^T / sqrt(d))``: the same values to float rounding. A head size that is a
    symbol is left as it is (the hand-off check compares what OpenVINO makes of it)."""
    sdpa = torch.ops.aten.scaled_dot_product_attention.default
    if "aten::scaled_dot_product_attention.default" not in library.ops:
        return
    for module in gm.modules():
        if not isinstance(module, torch.fx.GraphModule):
            continue
        changed = False
        for node in [n for n in module.graph.nodes if n.op == "call_function" and n.target is sdpa]:
            scale, query = node.kwargs.get("scale"), node.args[0]
            size = query.meta["val"].shape[-1] if "val" in query.meta else None
            if scale is None or not isinstance(size, int) or not size:
                continue
            factor = scale * size ** 0.5
            with module.graph.inserting_before(node):
                scaled = module.graph.call_function(torch.ops.aten.mul.Tensor, (query, factor))
            scaled.meta["val"] = query.meta["val"]
            node.args = (scaled, *node.args[1:])
            node.kwargs = {k: v for k, v in node.kwargs.items() if k != "scale"}
            changed = True
        if changed:
            module.recompile()


@dataclasses.dataclass(frozen=True)
class Converted:
    """What running and saving the compiled model need beside it: the results' names in OpenVINO's
    order, and the model convert_model made (what openvino.save_model writes). A stateful model's: the
    infer request that holds its variables, the flat inputs and the outputs they replace, and the
    request's variables as the State's holder."""

    names: list
    model: object
    request: object = None
    dropped: frozenset = frozenset()
    held_outputs: tuple = ()
    holder: Variables | None = None
    taken: tuple | None = None  # the flat inputs the model takes, where not all (_inputs_taken)


def _result_names(gm) -> list[str]:
    """The graph outputs OpenVINO makes results of, in its order, by the names of the program's values:
    the unlifted module's flat outputs that are values (not None), each once. OpenVINO's converter names
    a result by its value and stops on a value returned twice (its check ``is_number(name)``): the output
    node of ``gm`` is rewritten to return each value once, and the run gives every output of the program
    that returns it the one result. Results are matched by name, the unlifted module's order aside."""
    out = next(n for n in gm.graph.nodes if n.op == "output")
    values = [v for v in pytree.tree_leaves(out.args[0], is_leaf=lambda v: v is None) if isinstance(v, torch.fx.Node)]
    once = list(dict.fromkeys(values))
    if len(once) != len(values):
        out.args = (tuple(once),)
    return [v.target if v.op == "get_attr" else v.name for v in once]


def run(compiled, ep, args, kwargs, plan=None):
    """The compiled model takes the program's user inputs in order; its results, matched to the
    program's outputs by name, are put back into the program's own output structure."""
    leaves = calling.flat_inputs(ep, args, kwargs)
    fed = [leaf for i, leaf in enumerate(leaves) if i not in plan.dropped] if plan.taken is None else \
        [leaves[i] for i in plan.taken]  # (a variable holds the rest; or the model leaves some out)
    result = (compiled if plan.request is None else plan.request.infer)(calling.numpy_inputs(fed))
    values = [torch.from_numpy(result[i].copy()) for i in range(len(result))]
    names = plan.names
    if len(values) != len(names):
        raise BackendRunError(f"OpenVINO returned {len(values)} results for the program's {len(names)} tensor outputs.")
    # a held buffer's new value stays in its variable: None in its place (state.Carry stores nothing of it)
    return calling.user_outputs(ep, {**dict(zip(names, values)), **dict.fromkeys(plan.held_outputs)}, leaves)


def save(compiled, path: str) -> None:
    """The converted model as OpenVINO's IR (``path``.xml and its .bin), read by openvino.Core().read_model."""
    import openvino

    openvino.save_model(compiled.plan.model, path)


def backend() -> Backend:
    with without_usage_events():  # (the first import of openvino reports it: pt2b's import, not the user's)
        import openvino

    library = library_tables.transformers_table("openvino")
    version = openvino.__version__.split("-")[0]
    source = "torch.export's default table minus openvino's export_decompositions.ops_to_not_decompose()"
    if library:  # the extensions change what the backend makes of a program: the version (and key) names them
        version += f"+{library.library}"
        source += f", with {library.library}'s conversion extensions ({library.where})"
    return Backend("openvino", version, _supported_ops(library), source, _table,
                   functools.partial(hand_off, library=library), run, SETTINGS, takes_what_its_table_leaves=True,
                   save=save, file_suffix=".xml")
