"""ONNX through torch.onnx (onnxscript's torchlib) and onnxruntime: the ops torchlib translates, as
torch.onnx's own registry lists them (``ONNXRegistry.from_torchlib()``) plus the names onnxscript
declares that this torch lacks (reported, not fatal), plus the ops transformers' ONNX translation
table converts where transformers is installed (library_tables); no decompositions of its own
(torch.onnx decomposes with torch's table what torchlib lacks, as pt2b does); the hand-off is
``torch.onnx.export(program)`` with that table, an ``ONNXProgram``; onnxruntime runs it, holding a
lifted program's state between calls as its own values (``stateful``, the default). ``fusions`` (an
option, off by default) fuses the graph into ONNX Runtime's own ops for a provider: transformers' fusions
where it is installed, onnxscript's otherwise; the hand-off check compares the fused model's outputs.

pip install pt2b[onnx]  (onnx, onnxscript, onnxruntime)
"""

from __future__ import annotations

import functools
import warnings

import torch

from ..errors import BackendHandOffError, LibraryTableWarning
from . import Backend, attention, calling, library_tables, quiet_logger, retraceable
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
             custom_translation_table: dict | None = None, library: library_tables.LibraryTable | None = None,
             stateful: bool = True, fusions: str | None = None, carry=None):
    """``torch.onnx.export`` of ``ep`` with ``library``'s translation table (transformers', where it is
    installed) and ``custom_translation_table`` over it: an ``ONNXProgram`` (``.model_proto``,
    ``.save(path)``), the program torch.onnx translated (after its own decompositions, a no-op on
    pt2b's lowering), and the Session that runs it. ``carry`` (a lifted program's state.Carry) with
    ``stateful``: ONNX Runtime holds the state between calls (Held); ``stateful=False`` passes it in
    and out of torch at every call. ``fusions`` (one of FUSION_PROVIDERS): the model fused into ONNX
    Runtime's own ops for that provider (_fuse)."""
    if fusions is not None and fusions not in FUSION_PROVIDERS:
        raise BackendHandOffError(f"onnx: fusions={fusions!r} names no ONNX Runtime provider pt2b fuses for; "
                                  f"pass one of {', '.join(FUSION_PROVIDERS)}, or leave fusions out")
    if fusions is not None and not optimize:
        raise BackendHandOffError("onnx: fusions need torch.onnx's optimized graph (they match its forms); "
                                  "drop optimize=False or leave fusions out")
    options = {"opset_version": opset_version} if opset_version is not None else {}
    table = {**(library.entries if library else {}), **(custom_translation_table or {})}
    if table:
        options["custom_translation_table"] = table

    from .complex_views import complex_views_as_real

    ep = complex_views_as_real(ep)  # (torchlib translates no view of a complex tensor)
    ep = _for_torchlib(_contiguous_before_views(ep))
    if fusions is not None:  # (torchlib's boolean attention is a form ONNX Runtime's fusions do not match)
        ep = attention.additive_masks(ep)

    def exported(optimized: bool = optimize):
        with quiet_logger("torch.onnx"):
            return torch.onnx.export(ep, (), dynamo=True, optimize=optimized, verbose=False, **options)

    try:
        onnx_program = exported()
    except Exception as e:  # noqa: BLE001 -- only the optimizer's failure is routed around, the rest raised
        # onnxscript's optimizer runs on the translated model, as a step of its own: where one of its passes
        # fails on a program (prophetnet: constant folding of a SplitToSequence), the model it was given is
        # right, and the hand-off goes on with it unoptimized (fusions need the optimized forms)
        if not optimize or fusions is not None or not _optimizer_failed(e):
            raise
        warnings.warn(LibraryTableWarning(
            f"onnx: onnxscript's optimizer failed on this program ({type(e).__name__}: {str(e)[:200]}); the "
            f"model is handed over unoptimized"), stacklevel=2)
        onnx_program = exported(False)
    if fusions is not None:
        onnx_program = _fuse(onnx_program, fusions, exported)
    program = onnx_program.exported_program
    return onnx_program, program, Session(onnx_program, program, carry if stateful else None)


def _histc_of_no_range(x, bins: int = 100, min=0, max=0):
    # torchlib translates histc over a range only ("aten_histc with min == max ... is not supported"),
    # where the kernel counts over the data's extremes (a mixture of experts of one expert counts its
    # routes with min=max=0): pt2b's exact rewrite there, torchlib's translation for any other range
    if min != max:
        return NotImplemented
    from ..lowering.rewrites import histc

    return histc(x, bins, min, max)


def _no_range(node) -> bool:
    given = dict(zip(("bins", "min", "max"), node.args[1:]), **node.kwargs)
    return given.get("min", 0) == given.get("max", 0)


def _ones_where_a_dim_stays(x, dims) -> list | None:
    """The dims of ``dims`` (one or a list, counted from either end) of size 1, which a squeeze of ``x``
    removes, where it leaves another it names (a size that is not 1); None where it removes every one,
    ``x`` is 0-d, or a size is a symbol (the squeeze is left as it is)."""
    dims = [dims] if isinstance(dims, int) else list(dims)
    if x.dim() == 0:
        return None
    sizes = [x.shape[d] for d in dims]
    if not all(isinstance(s, int) for s in sizes):
        return None
    ones = [d % x.dim() for d, s in zip(dims, sizes) if s == 1]
    return ones if len(ones) < len(dims) else None


def _squeeze_of_ones_only(x, dims):
    # torchlib's squeeze.dim removes the dim it names whatever its size, which ONNX Runtime then refuses
    # ("Dimension of input 2 must be 1 instead of 6": parakeet's joint network squeezes a dim of 6),
    # where torch removes it only if its size is 1: the squeeze of the dims of size 1 alone, a view of
    # the same shape where there is none
    ones = _ones_where_a_dim_stays(x, dims)
    if ones is None:
        return NotImplemented
    if not ones:
        return torch.ops.aten.view.default(x, list(x.shape))
    return torch.ops.aten.squeeze.dims(x, ones)


def _keeps_a_dim(node) -> bool:
    x = node.args[0].meta.get("val") if isinstance(node.args[0], torch.fx.Node) else None
    dims = node.args[1] if len(node.args) > 1 else node.kwargs.get("dim")
    return isinstance(x, torch.Tensor) and _ones_where_a_dim_stays(x, dims) is not None


def _empty_of_the_size(x, size):
    # onnxscript's optimizer writes the shape of a reshape whose size is partly symbolic with a -1 for the
    # size it infers (its MaterializeReshapeShape rule), which ONNX Runtime refuses beside a 0 ("Invalid
    # Target shape product of 0. Product cannot be 0 in combination with -1": glm5_next views the empty
    # rope half of a split as (b, 1, s, 0)). A view with a 0 in its size has no values to view: the empty
    # tensor of that size and dtype is the same result
    if not any(type(s) is int and s == 0 for s in size):
        return NotImplemented
    return torch.ops.aten.full.default(list(size), 0, dtype=x.dtype, device=x.device)


def _sizes_a_zero(node) -> bool:
    return any(type(s) is int and s == 0 for s in (node.args[1] if len(node.args) > 1 else node.kwargs["size"]))


def _number_minus_as_added(x, other, alpha=1):
    # torch's decomposition of rsub records ``number - t`` as ``sub.Tensor(number, t)``, a number where the
    # schema names a tensor, which torch.onnx's dispatcher matches to no overload ("Cannot find a compatible
    # OpOverload for aten.sub": timesfm's ``1.0 - mask``, on torch's own program too). ``-t + number`` is the
    # same sum, rounded once alike, a zero's sign included, in the same promoted dtype
    if isinstance(x, torch.Tensor) or alpha != 1:
        return NotImplemented
    return torch.ops.aten.add.Tensor(torch.ops.aten.neg.default(other), x)


def _number_first(node) -> bool:
    return not isinstance(node.args[0], torch.fx.Node) and node.kwargs.get("alpha", 1) == 1


_MOVERS = (torch.ops.aten.transpose.int, torch.ops.aten.permute.default)


def _contiguous_before_views(ep):
    """``ep`` with a contiguous ``clone`` between each ``view`` and the transpose or permute it views: the
    same values (an Identity in ONNX, which the optimizer removes). Whether such a view is a view at all
    depends on the strides its input had when the program was captured: an attention's output laid out
    by its CPU kernel (NeMo's and LayoutLMv3's, under a float mask) transposes to a tensor a view can
    flatten, and torch.onnx's retrace, whose attention returns other strides, refuses the same view
    ("Cannot view a tensor with shape ... and strides ..."). ``ep`` itself where there is none."""
    from .program_copy import nodes_rewritten

    def viewed(node) -> bool:
        return node.target is torch.ops.aten.view.default and getattr(node.args[0], "target", None) in _MOVERS

    def dense(graph, node) -> None:
        moved = node.args[0]
        made = graph.call_function(torch.ops.aten.clone.default, (moved,), {"memory_format": torch.contiguous_format})
        if isinstance(moved.meta.get("val"), torch.Tensor):
            made.meta["val"] = moved.meta["val"].clone(memory_format=torch.contiguous_format)
        node.replace_input_with(moved, made)

    return nodes_rewritten(ep, viewed, dense)


# op -> (a rewrite torchlib's translation needs on some calls of it, which calls)
_FOR_TORCHLIB = {
    torch.ops.aten.histc.default: (_histc_of_no_range, _no_range),
    torch.ops.aten.squeeze.dim: (_squeeze_of_ones_only, _keeps_a_dim),
    torch.ops.aten.squeeze.dims: (_squeeze_of_ones_only, _keeps_a_dim),
    torch.ops.aten.view.default: (_empty_of_the_size, _sizes_a_zero),
    torch.ops.aten._unsafe_view.default: (_empty_of_the_size, _sizes_a_zero),
    torch.ops.aten.sub.Tensor: (_number_minus_as_added, _number_first),
}


def _for_torchlib(ep):
    """``ep`` with the calls torchlib translates otherwise than torch computes them rewritten
    (_FOR_TORCHLIB: a histc over the data's extremes, pt2b's exact rewrite; a squeeze naming a dim whose
    size is not 1, which torch leaves and torchlib removes; a view with a 0 in its size, the empty tensor
    of that size; a number minus a tensor, ``-t + number``), in one retrace; ``ep`` itself where there is
    none."""
    from .program_copy import calls_decomposed

    return calls_decomposed(ep, _FOR_TORCHLIB)


def _optimizer_failed(e: BaseException) -> bool:
    """Whether ``e`` (what torch.onnx.export raised) comes from a pass of onnx_ir's pass manager, which
    the optimizer is made of, rather than from the translation."""
    seen = set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if type(e).__name__ == "PassError" and type(e).__module__.startswith("onnx_ir"):
            return True
        e = e.__cause__ or e.__context__
    return False


# the providers transformers' fusions take; onnxscript's fusions are the same for every one
FUSION_PROVIDERS = ("cpu", "cuda", "webgpu", "dml")


def _fuse(onnx_program, provider: str, exported):
    """``onnx_program`` with its model fused for ``provider``: by transformers' fusions where installed,
    which know more forms (rotary embeddings over a cache, GroupQueryAttention); where they fail (their
    names are private: another transformers may not match this one), on a fresh export by onnxscript's
    ``optimize_for_ort``, with a LibraryTableWarning. A failure of onnxscript's own is the hand-off's."""
    from onnxscript.rewriter.ort_fusions import optimize_for_ort

    fuse = library_tables.transformers_ort_fusions()
    if fuse is not None:
        try:
            with quiet_logger("transformers"):
                fuse(onnx_program.model, provider)
            return onnx_program
        # transformers' fusions edit the model in place: a failure leaves it half fused, so it is made again
        except Exception as e:  # noqa: BLE001
            warnings.warn(LibraryTableWarning(
                f"onnx: transformers' ONNX Runtime fusions failed on this program ({type(e).__name__}: {e}); "
                "fused with onnxscript's optimize_for_ort instead"), stacklevel=3)
            onnx_program = exported()
    with quiet_logger("onnxscript"):
        optimize_for_ort(onnx_program.model)
    return onnx_program


class Session:
    """What run needs beside the ONNXProgram: onnxruntime's session of its model (made on first use and
    given to the ONNXProgram as its own), which user input feeds each graph input, and the holder of a
    carried state (None: every value passes through torch)."""

    def __init__(self, onnx_program, ep, carry=None):
        import onnxruntime

        self.onnx_program, self._session = onnx_program, None
        self.inputs = [v.name for v in onnx_program.model.graph.inputs]
        self.outputs = [v.name for v in onnx_program.model.graph.outputs]
        user = [s.arg.name for s in ep.graph_signature.input_specs if s.kind.name == "USER_INPUT"]
        # by name: an input the translation made a constant (a size export specialized) is no graph input
        by_name = all(n in user for n in self.inputs)
        self.fed = [user.index(n) for n in self.inputs] if by_name else list(range(len(self.inputs)))
        self.holder = Held.of(ep, carry, self.inputs, self.outputs) if carry is not None and by_name else None
        self.options = onnxruntime.RunOptions()
        self.options.log_severity_level = 3  # errors only, as ONNXProgram runs

    def session(self):
        """The InferenceSession on onnxruntime's CPU provider, as ONNXProgram makes its own (a model past
        protobuf's size is written to a file first)."""
        if self._session is None:
            import onnxruntime

            def made(model):
                options = onnxruntime.SessionOptions()
                options.log_severity_level = 3
                self._session = onnxruntime.InferenceSession(model, options, providers=["CPUExecutionProvider"])
                return self._session

            self.onnx_program.initialize_inference_session(made)
        return self._session


class Held:
    """The buffers ONNX Runtime holds between calls as its own values (OrtValues; state.State.hold's
    holder): each call feeds them as the graph's ``state.*`` inputs and keeps the ``state_out.*``
    outputs it returns as the next call's inputs, so no call converts or copies the state; ``pull``
    hands them to torch when the State is read."""

    def __init__(self, inputs: dict[str, str], outputs: dict[str, str]):
        self.names = frozenset(inputs)  # the buffers held
        self.inputs = inputs  # buffer -> the graph input it is fed as
        self.feeds = {outputs[n]: inputs[n] for n in inputs}  # graph output -> the graph input it feeds next
        self.values: dict = {}  # graph input -> OrtValue (empty: holding nothing)

    @classmethod
    def of(cls, ep, carry, inputs: list[str], outputs: list[str]) -> Held | None:
        """The holder of the lifted ``ep``'s buffers whose new value is one graph output of its own (not
        also a user output), None where there is none."""
        from .state import lifted_ports

        ports = lifted_ports(ep, carry.names)
        if ports is None:
            return None
        fed, new, _, user_out = ports
        held = [n for n in new if n in fed and fed[n] in inputs and outputs.count(new[n]) == 1
                and user_out.count(new[n]) == 1]
        return cls({n: fed[n] for n in held}, {n: new[n] for n in held}) if held else None

    def push(self, values: dict) -> None:
        """``values`` (by buffer name) held from now on (ONNX Runtime reads them where they are: the
        State's tensors are not written while it holds them)."""
        self.values = {self.inputs[n]: _ort_value(values[n]) for n in self.names}

    def pull(self) -> dict:
        """The values held, as torch tensors by buffer name; the holder holds nothing after."""
        values, self.values = self.values, {}
        return {n: _torch_value(values[i]) for n, i in self.inputs.items()}


def _ort_value(value):
    """A torch tensor (read where it is, any dtype) or a number as an OrtValue."""
    import numpy as np
    import onnxruntime

    if isinstance(value, torch.Tensor):
        return onnxruntime.OrtValue.from_dlpack(value.detach().contiguous())
    dtype = {int: np.int64, float: np.float32}.get(type(value))  # (as ONNXProgram feeds a number)
    return onnxruntime.OrtValue.ortvalue_from_numpy(np.array(value, dtype=dtype))


def _torch_value(value) -> torch.Tensor:
    """An OrtValue as a torch tensor over its memory (bfloat16 and float8 have no NumPy type: DLPack)."""
    try:
        return torch.from_numpy(value.numpy())
    except RuntimeError:
        return torch.from_dlpack(value._get_c_value())


def run(onnx_program, ep, args, kwargs, plan: Session):
    """Run on onnxruntime's CPU provider: inputs by graph input name, outputs by graph output name; a held
    state fed from and kept in the holder (its outputs None: state.Carry stores nothing of them)."""
    leaves = calling.flat_inputs(ep, args, kwargs)
    held = plan.holder.values if plan.holder is not None else {}
    feed = {name: held[name] if name in held else _ort_value(leaves[i]) for name, i in zip(plan.inputs, plan.fed)}
    outs = plan.session().run_with_ort_values(plan.outputs, feed, plan.options)
    produced = {}
    for name, value in zip(plan.outputs, outs):
        if held and name in plan.holder.feeds:
            held[plan.holder.feeds[name]] = value
            produced[name] = None
        else:
            produced[name] = _torch_value(value)
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
