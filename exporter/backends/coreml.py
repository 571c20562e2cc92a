"""Core ML: its op list read from coremltools' torch frontend registry, and the hand-off (``ct.convert`` of
the program to an ML program, its inputs and outputs checked against the program's; it runs on macOS only).

pip install coremltools
"""

from __future__ import annotations

import contextlib
import functools
import sys
import warnings

import torch

from . import Backend, calling, first_line, quiet_logger
from ..errors import BackendHandOffError, BackendRunError
from .program_copy import graph_copy

RUNS_HERE = sys.platform == "darwin"  # Core ML's runtime ships with macOS only: elsewhere a model converts, no more


@functools.cache  # read once a process
def _registry_names() -> frozenset[str]:
    with _quiet():
        from coremltools.converters.mil.frontend.torch.torch_op_registry import _TORCH_OPS_REGISTRY

    return frozenset(_TORCH_OPS_REGISTRY.name_to_func_mapping)


def _kind(qualified: str) -> str:
    """The registry name the frontend looks ``qualified`` ("aten::add.Tensor") up by: what it makes of the
    node target's ``name()`` ("aten::add" for a default overload), lower-cased, without the namespace and
    without an overload Core ML does not tell apart ("add")."""
    from coremltools.converters.mil.frontend.torch.utils import sanitize_op_kind

    return sanitize_op_kind(qualified.removesuffix(".default"))


def _supported() -> tuple[str, ...]:
    """The ATen overloads of this torch whose registry name the frontend converts. Its registry keeps
    names, no overloads: every overload that comes to a registered name is listed ("aten::add.Tensor",
    "aten::add.Scalar" as ``add``), and an overload it tells apart only where the registry does
    ("aten::sum.dim_IntList" as ``sum.dim_intlist``). Other namespaces (quantized, torchao, torchvision)
    are left out: the dispatcher registers them as their libraries are imported."""
    from ..ops import registered_op_names

    names = _registry_names()
    return tuple(n for n in registered_op_names() if n.startswith("aten::") and _kind(n) in names)


@contextlib.contextmanager
def _quiet():
    """coremltools' log held back while it imports and converts: that this torch is newer than those it
    was tested with (the hand-off's check of the model stands in for that), that its runtime is missing
    off macOS, its per-op notes. Errors still raise; its progress bars stay (tqdm's, not a log)."""
    with warnings.catch_warnings(), quiet_logger("coremltools"), quiet_logger("torchao"):
        warnings.simplefilter("ignore")
        yield


def _without_aliases(ep):
    """``ep``'s graph with each ``aten.alias`` node replaced by its input, in place: coremltools has no
    conversion for it ("Unsupported fx node alias"), and in a program torch.export functionalized an
    alias is its input's value. (pt2b's lowering reaches ``view`` instead, alias not being in the list:
    this serves a program handed over as it is.)"""
    from ..graph_walk import walk_graphs

    for _, sub in walk_graphs(ep.graph_module):
        for node in list(sub.graph.nodes):
            if node.op == "call_function" and node.target is torch.ops.aten.alias.default:
                node.replace_all_uses_with(node.args[0])
                sub.graph.erase_node(node)
        sub.recompile()
    return ep


def _copy(ep):
    """A program of ``ep``'s with a graph of its own (the hand-off rewrites it) in the dialect coremltools
    takes (it refuses all but "ATEN" and "EDGE"), without the user inputs that hold no tensor and that no
    node reads (a ``None`` argument, a number torch.export made a constant) and without the outputs that
    are constants (a ``None`` in the returned structure): coremltools makes a model input of every user
    input and refuses those ("Placeholder val must be a tensor or fake tensor"), and looks every output
    up by a node's name ("Torch var  not found in context"). The run puts them back from ``ep``."""
    from torch.export.graph_signature import ExportGraphSignature, InputKind

    gm = graph_copy(ep)
    sig = ep.graph_signature
    unread = {n.name for n in gm.graph.nodes if n.op == "placeholder" and not n.users
              and not isinstance(n.meta.get("val"), torch.Tensor)}
    dropped = {s.arg.name for s in sig.input_specs if s.kind == InputKind.USER_INPUT and s.arg.name in unread}
    for node in [n for n in gm.graph.nodes if n.name in dropped]:
        gm.graph.erase_node(node)
    output = gm.graph.output_node()
    kept = [(s, v) for s, v in zip(sig.output_specs, output.args[0]) if isinstance(v, torch.fx.Node)]
    output.args = (tuple(v for _, v in kept),)
    gm.recompile()
    return torch.export.ExportedProgram(
        root=gm, graph=gm.graph, state_dict=ep.state_dict, range_constraints=ep.range_constraints,
        graph_signature=ExportGraphSignature([s for s in sig.input_specs if s.arg.name not in dropped],
                                             [s for s, _ in kept]),
        module_call_graph=ep.module_call_graph, example_inputs=ep.example_inputs, constants=ep.constants,
        verifiers=ep.verifiers if ep.dialect in ("ATEN", "EDGE") else None)  # None: torch's ATEN verifier


# torch's dtypes Core ML holds, as it names them; int64 and float64 it narrows to 32 bits
_DTYPES = {torch.float32: "fp32", torch.float16: "fp16", torch.int32: "int32", torch.bool: "bool",
           torch.int64: "int32", torch.float64: "fp32", torch.int8: "int8", torch.uint8: "uint8", torch.int16: "int16"}


def _refused_dtypes(ep) -> None:
    """BackendHandOffError naming the first node whose value has a dtype Core ML lacks (bfloat16, complex):
    coremltools fails on it with a bare ``KeyError: torch.bfloat16``."""
    from ..graph_walk import walk_graphs

    for _, sub in walk_graphs(ep.graph_module):
        for node in sub.graph.nodes:
            val = node.meta.get("val")
            if isinstance(val, torch.Tensor) and val.dtype not in _DTYPES:
                raise BackendHandOffError(
                    f"the program's {node.name!r} is {val.dtype}, which Core ML does not hold (it holds "
                    f"{', '.join(sorted({str(d).removeprefix('torch.') for d in _DTYPES}))}): export the model "
                    f"in float32 or float16.")


def hand_off(ep, *, compute_precision=None, **convert_options):
    """``ct.convert(program, convert_to="mlprogram")`` of a copy of ``ep`` (pt2b's lowering as it is, with
    the fixes of ``_copy`` and ``_without_aliases``), computing in float32 unless ``compute_precision``
    says otherwise (Core ML's own default is float16, which differs from torch's float32 beyond the
    hand-off check's bound); other options go to ``ct.convert`` (``minimum_deployment_target``, ...).
    The model is loaded only where Core ML runs (macOS); everywhere its MIL program's inputs and outputs
    are checked against the program's (``check_model``). Returns the ``MLModel``, ``ep`` (the calling
    convention its run follows) and the model's (input names, output names) in the program's order."""
    program = _without_aliases(_copy(ep))
    _refused_dtypes(program)
    with _quiet():
        import coremltools as ct

        precision = ct.precision.FLOAT32 if compute_precision is None else compute_precision
        model = ct.convert(program, convert_to="mlprogram", skip_model_load=not RUNS_HERE,
                           compute_precision=precision, **convert_options)
    return model, ep, check_model(model, program)


def _mil_types(model) -> tuple[dict, dict]:
    """({input name: (shape, dtype)}, {output name: (shape, dtype)}) of the model's MIL program's main
    function, in its order; a dynamic dim is its symbol's text, a dtype Core ML's name ("fp32")."""
    from coremltools.converters.mil.mil import types

    main = model._mil_program.functions["main"]
    typed = lambda var: (tuple(d if isinstance(d, int) else str(d) for d in var.shape),  # noqa: E731
                         types.builtin_to_string(var.dtype))
    return ({name: typed(var) for name, var in main.inputs.items()},
            {var.name: typed(var) for var in main.outputs})


def _program_types(ep) -> tuple[dict, dict]:
    """The same of ``ep`` as Core ML takes it: its tensor user inputs by placeholder name (a 0-d one
    wrapped by coremltools as a 1-element tensor under its own suffix), its tensor outputs by node name
    (user outputs, then the buffers it writes); a dynamic dim as None."""
    from coremltools.converters.mil.frontend.torch.exir_utils import WRAPPED_SCALAR_INPUT_SUFFIX
    from torch.export.graph_signature import InputKind

    def typed(val):
        return tuple(d if isinstance(d, int) else None for d in val.shape), _DTYPES[val.dtype]

    nodes = {n.name: n for n in ep.graph.nodes}
    inputs = {}
    for spec in ep.graph_signature.input_specs:
        val = nodes[spec.arg.name].meta.get("val") if spec.kind == InputKind.USER_INPUT else None
        if isinstance(val, torch.Tensor):
            wrapped = val.dim() == 0
            inputs[spec.arg.name + (WRAPPED_SCALAR_INPUT_SUFFIX if wrapped else "")] = (
                ((1,), _DTYPES[val.dtype]) if wrapped else typed(val))
    outputs = {v.name: typed(v.meta["val"]) for v in ep.graph.output_node().args[0]
               if isinstance(v, torch.fx.Node) and isinstance(v.meta.get("val"), torch.Tensor)}
    return inputs, outputs


def check_model(model, ep) -> tuple[list, list]:
    """The converted model's MIL program against ``ep`` (``_program_types``): the same inputs and outputs
    by name and order, each of the rank, static sizes and dtype the program records (coremltools checks
    its program's own consistency as each of its pass pipelines runs). BackendHandOffError naming the
    first that differs. Returns the model's (input names, output names)."""
    with _quiet():
        got_in, got_out = _mil_types(model)
        want_in, want_out = _program_types(ep)
    for what, want, got in (("input", want_in, got_in), ("output", want_out, got_out)):
        if list(want) != list(got):
            raise BackendHandOffError(f"coremltools' model has the {what}s {list(got)} where the program has "
                                      f"{list(want)}: report it to coremltools.")
        for name, (shape, dtype) in want.items():
            got_shape, got_dtype = got[name]
            same = len(shape) == len(got_shape) and all(w is None or w == g for w, g in zip(shape, got_shape))
            if not same or dtype != got_dtype:
                raise BackendHandOffError(
                    f"coremltools' model has {what} {name!r} as {got_shape} {got_dtype} where the program has "
                    f"{tuple('dynamic' if d is None else d for d in shape)} {dtype}: report it to coremltools.")
    return list(got_in), list(got_out)


def run(model, ep, args, kwargs, plan=None):
    """The model's ``predict`` on the program's tensor user inputs under the model's names (``plan``, from
    check_model), its outputs back by the program's node names. macOS only, and written without a Mac
    to try it on (Core ML's runtime ships with macOS); elsewhere a BackendRunError."""
    if not RUNS_HERE:
        raise BackendRunError(f"Core ML runs only on macOS, and this is {sys.platform}: save the model "
                              f"(compiled.save('m.mlpackage')) and run it on a Mac with coremltools "
                              f"(ct.models.MLModel('m.mlpackage').predict({{...}})).")
    import numpy as np

    input_names, output_names = plan
    leaves = calling.flat_inputs(ep, args, kwargs)
    tensors = [np.ascontiguousarray(v) for v in calling.numpy_inputs(leaves) if isinstance(v, np.ndarray)]
    feed = {name: value.reshape(1) if value.ndim == 0 else value for name, value in zip(input_names, tensors)}
    try:
        result = model.predict(feed)
    except Exception as e:  # noqa: BLE001 (Core ML's runtime errors are its own: typed and chained)
        raise BackendRunError(f"Core ML could not run the model: {first_line(e)}") from e
    nodes = {v.name: v.meta["val"] for v in ep.graph.output_node().args[0] if isinstance(v, torch.fx.Node)}
    # Core ML computes int64 and float64 in 32 bits: each output comes back in the program's dtype
    produced = {name: torch.from_numpy(np.array(result[name])).reshape(nodes[name].shape).to(nodes[name].dtype)
                for name in output_names}
    return calling.user_outputs(ep, produced, leaves)


def _bool_or(a, b):
    """``bitwise_or`` of two bool tensors as ``logical_or``, the same values: coremltools converts no
    ``bitwise_or`` (its ``bitwise_and`` takes bools only), and torch's own decomposition ends in
    ``prims::bitwise_or``, which nothing converts (transformers' masks: cpmant). Other dtypes are left
    as they are (NotImplemented)."""
    if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)) or a.dtype != torch.bool or b.dtype != torch.bool:
        return NotImplemented
    return torch.ops.aten.logical_or.default(a, b)


def _repairs() -> dict:
    """pt2b's decompositions for Core ML, used before torch's: each routes around an op its converter
    lacks where torch's decomposition reaches none it has."""
    return {torch.ops.aten.bitwise_or.Tensor: _bool_or}


def save(compiled, path: str) -> None:
    """The ML program as a ``.mlpackage`` (``MLModel.save``): its spec and weights, which coremltools
    loads (``ct.models.MLModel(path)``; ``coremltools.models.utils.load_spec(path)`` off macOS)."""
    compiled.native.save(str(path))


def backend() -> Backend:
    from importlib.metadata import version

    return Backend("coreml", version("coremltools"), _supported(),
                   "coremltools.converters.mil.frontend.torch.torch_op_registry._TORCH_OPS_REGISTRY (its names, "
                   "read as the frontend reads a node's target)", _repairs, hand_off, run,
                   "ML program, float32 compute; Core ML runs it on macOS only, and elsewhere the hand-off checks "
                   "the converted model's inputs and outputs against the program's",
                   # the lifted program converts as any other; the buffers a program writes would become
                   # Core ML states, which it holds in float16 only
                   holds_state=False, save=save, file_suffix=".mlpackage", runs_here=RUNS_HERE,
                   takes_ops_only=True)
