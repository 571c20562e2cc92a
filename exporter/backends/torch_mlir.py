"""torch-mlir: its op list read from its torch dialect, its own decompositions, the hand-off through its FX
importer to linalg-on-tensors (or torch, tosa, stablehlo), and pt2b's driver that runs linalg on MLIR's
execution engine through the reference-backend passes the wheel registers.

pip install torch-mlir
"""

from __future__ import annotations

import ctypes
import functools

import torch

from . import Backend, calling, retraceable
from .._torch.compat import with_tensor_meta
from ..errors import BackendHandOffError, BackendRunError
from ..ops import op_name, registered_overload
from .program_copy import graph_copy, nodes_repaired
from .sym_ops import FX_IMPORTER_REPAIRS

OUTPUT = "linalg-on-tensors"  # the output type the driver runs
# The wheel's passes from linalg-on-tensors to LLVM, in the order torch-mlir's own reference backend
# (its e2e tests' RefBackend, outside the wheel) runs them: bufferize, make every public function take
# and return unranked memrefs (its results handed to a callback, "refbackend_consume_func_return_<types>"),
# then lower to LLVM dialect for the execution engine.
_TO_LLVM = (
    "func.func(linalg-generalize-named-ops)", "func.func(linalg-fuse-elementwise-ops)", "convert-shape-to-std",
    "sparse-assembler{direct-out}", "sparsification-and-bufferization", "sparse-storage-specifier-to-llvm",
    "func.func(expand-realloc)", "func.func(refback-generalize-tensor-pad)",
    "func.func(refback-generalize-tensor-concat)", "func.func(tm-tensor-bufferize)",
    "one-shot-bufferize{copy-before-write bufferize-function-boundaries "
    "function-boundary-type-conversion=identity-layout-map}",
    "refback-mlprogram-bufferize", "func.func(buffer-deallocation-pipeline)", "inline",
    "refback-munge-calling-conventions", "func.func(tm-tensor-to-loops)", "func.func(refback-munge-memref-copy)",
    "func.func(convert-linalg-to-loops)", "func.func(lower-affine)", "convert-scf-to-cf",
    "func.func(refback-expand-ops-for-llvm)", "func.func(arith-expand)", "func.func(convert-math-to-llvm)",
    "convert-math-to-libm", "expand-strided-metadata", "finalize-memref-to-llvm", "lower-affine",
    "convert-scf-to-cf", "convert-bufferization-to-memref", "finalize-memref-to-llvm",
    "func.func(convert-arith-to-llvm)", "convert-vector-to-llvm", "convert-func-to-llvm", "convert-cf-to-llvm",
    "convert-complex-to-llvm", "reconcile-unrealized-casts")
PIPELINE = "builtin.module(" + ",".join(_TO_LLVM) + ")"
RETURN_PREFIX = "refbackend_consume_func_return_"
# the type tags the calling-convention pass writes into the callback's name: memrefs by element type, scalars
_MEMREF_DTYPES = {"mrf16": "float16", "mrf32": "float32", "mrf64": "float64", "mri1": "bool", "mri8": "int8",
                  "mri16": "int16", "mri32": "int32", "mri64": "int64", "mrc32": "complex64", "mrc64": "complex128"}
_SCALARS = {"i1": ctypes.c_bool, "i8": ctypes.c_int8, "i64": ctypes.c_int64, "f32": ctypes.c_float,
            "f64": ctypes.c_double}


@functools.cache  # read once a process
def _supported() -> tuple[str, ...]:
    """The ATen and PrimTorch overloads the torch dialect has an op for (``torch.aten.add.Tensor``: its
    generated op classes' OPERATION_NAME; no overload is the default one), those this torch registers.
    Which of them the conversion to linalg handles is not written anywhere in the wheel: one it does not
    is the hand-off's typed error."""
    from torch_mlir.dialects import torch as dialect

    ops = set()
    for cls in vars(dialect).values():
        full = getattr(cls, "OPERATION_NAME", None)
        if not isinstance(full, str) or not full.startswith(("torch.aten.", "torch.prims.")):
            continue
        _, ns, rest = full.split(".", 2)
        name, _, overload = rest.partition(".")
        op = registered_overload(ns, name, overload or "default")
        if op is not None:
            ops.add(op_name(op))
    return retraceable(sorted(ops))


def _table() -> dict:
    from torch_mlir.extras.fx_decomp_util import get_decomposition_table

    return dict(get_decomposition_table())


def _importable(ep) -> torch.export.ExportedProgram:
    """A program torch-mlir's frozen import takes, ``ep`` left as it is: its graph copied (the import
    erases the placeholders of the weights it binds, in the program it is given), and each non-persistent
    buffer given to it as a persistent one, its value in the state_dict: the import looks every buffer up
    in the state_dict only, where torch keeps a non-persistent one among the constants (a Llama's rotary
    ``inv_freq``: "Could not find state mapping for buffer"); its views ``_flattened_views``; its bool
    operators ``_bitwise``; its casts to complex ``_complex_casts``; the Python calls of its runtime
    assertions that the importer cannot convert (sym_ops.FX_IMPORTER_REPAIRS)."""
    from torch.export.graph_signature import ExportGraphSignature, InputKind, InputSpec

    sig = ep.graph_signature
    loose = {s.target for s in sig.input_specs if s.kind == InputKind.BUFFER and s.target not in ep.state_dict}
    specs = [InputSpec(s.kind, s.arg, s.target, True) if s.target in loose else s for s in sig.input_specs]
    gm = graph_copy(nodes_repaired(ep, FX_IMPORTER_REPAIRS))
    with_tensor_meta(gm)  # (the importer reads a dtype there, of the nodes the repairs made too)
    _flattened_views(gm)
    _bitwise(gm)
    _complex_casts(gm)
    constants = {k: v for k, v in ep.constants.items() if k not in loose}
    return torch.export.ExportedProgram(
        root=gm, graph=gm.graph, graph_signature=ExportGraphSignature(specs, list(sig.output_specs)),
        state_dict={**ep.state_dict, **{n: ep.constants[n] for n in loose}}, range_constraints=ep.range_constraints,
        module_call_graph=ep.module_call_graph, example_inputs=ep.example_inputs,
        constants=constants, verifiers=ep.verifiers)


_VIEWS = ("view.default", "_unsafe_view.default", "reshape.default")


def _flattened_views(gm) -> None:
    """Each view of a tensor with two or more dynamic dims made a view of its flattened (1-D) form, in
    place: the same values. torch-mlir's conversion of such a view to linalg narrows one of the dynamic
    dims to 1 (``x.view(b * n, d)`` of a (b, n, d) tensor gives (b, d)), and the compiled code then reads
    and writes out of bounds; from one dim it computes the shape right."""
    targets = {getattr(torch.ops.aten, name.split(".")[0]).default for name in _VIEWS}
    for node in list(gm.graph.nodes):
        val = node.args[0].meta.get("val") if node.op == "call_function" and node.target in targets else None
        if isinstance(val, torch.Tensor) and sum(not isinstance(d, int) for d in val.shape) >= 2:
            with gm.graph.inserting_before(node):
                flat = gm.graph.call_function(torch.ops.aten.flatten.using_ints, (node.args[0], 0, -1))
            flat.meta.update(val=val.flatten(), stack_trace=node.meta.get("stack_trace"))
            node.args = (flat, *node.args[1:])
    gm.recompile()


def _bitwise(gm) -> None:
    """Each ``aten.__and__``, ``__or__``, ``__xor__`` made the ``aten.bitwise_*`` op of its overload, in
    place: torch defines those operators on tensors as these ops, and the torch dialect has an op for
    ``__and__.Tensor`` (transformers' causal mask) that its conversion to linalg does not handle, where it
    converts ``bitwise_and``."""
    for node in gm.graph.nodes:
        if node.op != "call_function":
            continue
        name, _, overload = op_name(node.target).removeprefix("aten::").partition(".")
        if name in ("__and__", "__or__", "__xor__"):
            node.target = registered_overload("aten", "bitwise_" + name.strip("_"), overload) or node.target
    gm.recompile()


_REAL_PART = {torch.complex64: torch.float32, torch.complex128: torch.float64}


def _complex_casts(gm) -> None:
    """Each cast of a real tensor to a complex dtype (``_to_copy(x, dtype=torch.complex64)``, what
    ``fft`` of a real input lowers to) made ``aten.complex`` of the value cast to the real dtype and a
    zero imaginary part, in place: the same values. torch-mlir's conversion of the cast aborts the whole
    process ("LLVM ERROR: unhandled type or value for getConstantWithGivenDtypeAndValue"), which no
    error handling can catch, where it converts ``complex``."""
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or node.target is not torch.ops.aten._to_copy.default:
            continue
        val, dtype = node.args[0].meta.get("val"), node.kwargs.get("dtype")
        if dtype not in _REAL_PART or set(node.kwargs) != {"dtype"} or not isinstance(val, torch.Tensor) \
                or val.is_complex():
            continue
        with gm.graph.inserting_before(node):
            real = gm.graph.call_function(torch.ops.aten._to_copy.default, node.args, {"dtype": _REAL_PART[dtype]})
            imag = gm.graph.call_function(torch.ops.aten.zeros_like.default, (real,))
            both = gm.graph.call_function(torch.ops.aten.complex.default, (real, imag))
        real.meta["val"] = imag.meta["val"] = val.to(_REAL_PART[dtype])
        both.meta["val"] = node.meta.get("val")
        for new in (real, imag, both):
            new.meta["stack_trace"] = node.meta.get("stack_trace")
        node.replace_all_uses_with(both)
        gm.graph.erase_node(node)
        both.name = node.name  # (the signature may name it as an output)
    gm.recompile()


def _no_true_literals(module) -> None:
    """Each all-true bool literal of the torch-dialect module made the negation of an all-false one, in
    place: the conversion to linalg sign-extends a literal's integers, so a bool literal's true (1) becomes
    -1, which does not fit in one bit, and the literal is refused ("failed to legalize operation
    'torch.vtensor.literal'"). torch-mlir folds such literals out of ops of the program (``new_ones([],
    dtype=torch.bool)`` in transformers' causal mask), so they are found in the module, not in the program."""
    from torch_mlir import ir

    found = []

    def visit(op):
        value = op.attributes["value"] if op.name == "torch.vtensor.literal" else None
        if isinstance(value, ir.DenseIntElementsAttr) and value.is_splat \
                and value.type.element_type == ir.IntegerType.get_signless(1) and value.get_splat_value().value:
            found.append(op)
        return ir.WalkResult.ADVANCE

    with module.context, ir.Location.unknown():
        module.operation.walk(visit)
        for op in found:
            false = ir.DenseElementsAttr.get_splat(op.attributes["value"].type, ir.BoolAttr.get(False))
            with ir.InsertionPoint(op), op.location:
                zeros = ir.Operation.create("torch.vtensor.literal", results=[op.result.type],
                                            attributes={"value": false})
                ones = ir.Operation.create("torch.aten.logical_not", results=[op.result.type], operands=[zeros.result])
            op.result.replace_all_uses_with(ones.result)
            op.erase()


class Engine:
    """The linalg module lowered to LLVM by PIPELINE and JIT-compiled by MLIR's ``ExecutionEngine``:
    ``engine(*arrays)`` calls its ``main`` with NumPy arrays and returns its results as NumPy arrays,
    which the compiled code hands to the callbacks the calling-convention pass declared. Each result
    is copied, then its buffer freed: the deallocation passes make every buffer ``main`` returns one it
    allocated for the caller (an input or a weight returned is a copy), and the reference-backend
    convention hands them to the callback, which owns them from then on."""

    def __init__(self, module):
        from torch_mlir import ir
        from torch_mlir.compiler_utils import run_pipeline_with_repro_report
        from torch_mlir.execution_engine import ExecutionEngine

        with module.context:
            llvm = ir.Module.parse(str(module))  # the pipeline rewrites the module it runs on: a copy
        run_pipeline_with_repro_report(llvm, PIPELINE, "lowering linalg-on-tensors to LLVM")
        self._engine = ExecutionEngine(llvm)
        self._result, self._callbacks, self._owned = None, [], []
        names = {str(op.attributes["sym_name"]).strip('"') for op in llvm.body.operations
                 if "sym_name" in op.attributes}
        for name in sorted(names):
            if name.startswith(RETURN_PREFIX):
                self._register(name)
        # the memref lowering allocates with the C library's malloc (or aligned_alloc), which the JIT
        # resolves in this process: the C library's free releases it; a module that allocates otherwise
        # keeps its buffers
        self._free = None
        if names & {"malloc", "aligned_alloc"} and "_mlir_memref_to_llvm_alloc" not in names:
            self._free = ctypes.CDLL(None).free
            self._free.argtypes, self._free.restype = [ctypes.c_void_p], None

    def _register(self, name: str) -> None:
        import numpy as np
        from torch_mlir.runtime import UnrankedMemRefDescriptor, unranked_memref_to_numpy

        tags = name.removeprefix(RETURN_PREFIX).split("_")
        unknown = [t for t in tags if t not in _MEMREF_DTYPES and t not in _SCALARS]
        if unknown:
            raise BackendHandOffError(f"the program returns values of MLIR types {', '.join(unknown)}, which pt2b's "
                                      f"driver for torch-mlir does not read: return tensors of torch's usual dtypes.")
        types = [ctypes.POINTER(UnrankedMemRefDescriptor) if t in _MEMREF_DTYPES else _SCALARS[t] for t in tags]

        def consume(*values):
            # a copy, the buffer freed after the call (two results may share one)
            self._result = [np.array(unranked_memref_to_numpy(v, np.dtype(_MEMREF_DTYPES[t])), copy=True)
                            if t in _MEMREF_DTYPES else v for v, t in zip(values, tags)]
            self._owned = [ctypes.cast(v.contents.descriptor, ctypes.POINTER(ctypes.c_void_p))[0]
                           for v, t in zip(values, tags) if t in _MEMREF_DTYPES]

        callback = ctypes.CFUNCTYPE(None, *types)(consume)
        self._callbacks.append(callback)  # alive while the engine may call it
        self._engine.register_runtime(name, callback)

    def __call__(self, *arrays) -> list:
        from torch_mlir.runtime import get_unranked_memref_descriptor

        held = [get_unranked_memref_descriptor(a) for a in arrays]  # alive through the call
        self._result, self._owned = None, []
        self._engine.invoke("main", *(ctypes.pointer(ctypes.pointer(d)) for d in held))
        result, self._result = self._result, None
        for pointer in dict.fromkeys(self._owned) if self._free else ():
            if pointer:
                self._free(pointer)
        if result is None:
            raise BackendRunError("torch-mlir's compiled program returned nothing.")
        return result


def hand_off(ep, *, output_type: str = OUTPUT):
    """``torch_mlir.fx.export_and_import(program, output_type=...)`` of the program as pt2b lowered it
    (no decompositions run again; a copy with the importer's and the conversion's defects routed around:
    ``_importable``, ``_no_true_literals``): the MLIR module (``compiled.native``), and for
    linalg-on-tensors the ``Engine`` that runs it. ``output_type`` "torch", "tosa" or "stablehlo" gives
    that dialect's module, which pt2b does not run: hand it over unchecked (the check runs it)."""
    from torch_mlir.compiler_utils import OutputType, lower_mlir_module
    from torch_mlir.fx import export_and_import

    try:
        wanted = OutputType.get(output_type)
    except Exception:  # noqa: BLE001 (torch-mlir's own refusal is a bare error)
        raise BackendHandOffError(f"torch-mlir has no output type {output_type!r}: pass one of linalg-on-tensors, "
                                  f"torch, tosa, stablehlo.") from None
    # imported to the torch dialect, then lowered to the output type as export_and_import does, with the
    # bool literals the linalg conversion refuses rewritten in between
    if wanted == OutputType.RAW:
        return export_and_import(_importable(ep), output_type=wanted, decomposition_table={}), ep, None
    module = export_and_import(_importable(ep), output_type=OutputType.TORCH, decomposition_table={})
    if wanted == OutputType.LINALG_ON_TENSORS:
        _no_true_literals(module)
    module = lower_mlir_module(False, wanted, module)
    return module, ep, (Engine(module) if wanted == OutputType.LINALG_ON_TENSORS else None)


def run(module, ep, args, kwargs, plan=None):
    """``plan``: the Engine hand_off made. The module's ``main`` takes the program's tensor inputs in order
    and returns its tensor outputs, then the buffers it writes (frozen_state=True)."""
    import numpy as np
    from torch.export.graph_signature import OutputKind, TensorArgument

    if plan is None:
        raise BackendRunError("pt2b runs torch-mlir's linalg-on-tensors output only: hand the program over with "
                              "output_type='linalg-on-tensors' to run it, or take compiled.native (the MLIR "
                              "module) to a runtime of that dialect.")
    leaves = calling.flat_inputs(ep, args, kwargs)
    if not all(isinstance(v, torch.Tensor) for v in leaves):
        raise BackendRunError("pt2b's driver for torch-mlir passes tensors only, and the program takes "
                              f"{', '.join(sorted({type(v).__name__ for v in leaves if not isinstance(v, torch.Tensor)}))}: "
                              f"export the model with tensor inputs.")
    result = plan(*(np.require(v, requirements="C") for v in calling.numpy_inputs(leaves)))
    specs = calling.computed_specs(ep)
    if len(result) != len(specs):
        raise BackendRunError(f"torch-mlir returned {len(result)} outputs for the program's {len(specs)}.")
    produced = {s.arg.name: torch.from_numpy(np.asarray(v)) for s, v in zip(specs, result)
                if isinstance(s.arg, TensorArgument) and s.kind != OutputKind.BUFFER_MUTATION}
    return calling.user_outputs(ep, produced, leaves)


def save(compiled, path: str) -> None:
    """The linalg-on-tensors module as MLIR text, weights included as resources: ``ir.Module.parse`` of
    torch-mlir (or any MLIR of its version) reads it, and the reference-backend passes (PIPELINE) and
    ``ExecutionEngine`` run it. Its ``main`` takes the program's tensor inputs in order, then a carried
    state's buffers, and returns its outputs, then the buffers' new values."""
    with open(path, "w") as f:
        f.write(str(compiled.native))


def backend() -> Backend:
    from importlib.metadata import version

    return Backend("torch_mlir", version("torch-mlir"), _supported(),
                   "torch_mlir.dialects.torch's op classes (OPERATION_NAME torch.aten.*, torch.prims.*)", _table,
                   hand_off, run, f"{OUTPUT} through the reference-backend passes, MLIR's ExecutionEngine (CPU)",
                   # the frozen import binds buffers as constants: state comes lifted (state.py)
                   holds_state=False, save=save, file_suffix=".mlir", takes_ops_only=True)
