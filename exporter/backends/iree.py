"""IREE through iree-turbine: ``iree.turbine.aot.export`` imports a torch.export program into MLIR
(torch-mlir's torch dialect) as it is, and the IREE compiler lowers it for the CPU (llvm-cpu). IREE
publishes no op list. When turbine exports a module itself it decomposes with its own AOT table
(``iree.turbine.aot.decompositions.current_aot_decompositions()``: eval batch norm to arithmetic,
...) and nothing else, which leaves ops IREE cannot lower (``aten::diff``, in every transformers
decoder). The preset also applies the CompositeImplicitAutograd decompositions of torch.export's
default table, turbine's table over them, both read from the installed torch and turbine, and
accepts what they leave. The hand-off is the
compiled module (``.vmfb`` bytes); ``iree.runtime`` runs it on its local-task driver.

pip install iree-turbine iree-base-compiler iree-base-runtime
"""

from __future__ import annotations

import functools
import operator
import os
import sys
import tempfile

import torch

from . import Backend, calling
from .._torch.compat import with_tensor_meta
from ..functionalize import program_fake_mode
from ..lowering.rewrites import avg_pool2d_without_ceil
from .complex_pairs import complex_as_real_pairs
from .program_copy import emitted
from .sym_ops import FX_IMPORTER_REPAIRS

TARGET = "llvm-cpu"
DRIVER = "local-task"


def _turbine_table() -> dict:
    from iree.turbine.aot.decompositions import current_aot_decompositions

    return {op: fn for op, fn in current_aot_decompositions().items() if isinstance(op, torch._ops.OpOverload)}


def _table() -> dict:
    """The CompositeImplicitAutograd decompositions of torch.export's default table (those torch.export
    keeps in a training-IR program and its own inference lowering applies: IREE has no lowering for
    aten::diff, in every transformers decoder), with iree-turbine's own AOT table over them (eval batch
    norm to arithmetic: IREE cannot legalize _native_batch_norm_legit_no_training). The default table's
    other entries are left out: they rewrite ops IREE takes into ones it cannot (empty_like into
    empty_permuted)."""
    from ..lowering.rewrites import index_copy_by_scatter
    from ..lowering.tables import torch_default_table
    from ..ops import resolve_op

    cia = {op: fn for op, fn in torch_default_table().items()
           if torch._C._dispatch_has_kernel_for_dispatch_key(op.name(), "CompositeImplicitAutograd")}
    # a static KV cache's write (transformers' StaticCache: index_copy_ at the cache positions): IREE's
    # importer has no lowering of index_copy ("failed to legalize operation 'torch.operator' ...
    # torch.aten.index_copy", iree-base-compiler 3.13, dots1/static-cache), and compiles a scatter.
    # torch's decomposition of it (in turbine's table) checks the positions' count against the source's
    # size, which it cannot where the count is read from data, and the op stayed
    default = torch_default_table()
    gaps = {op: default[op] for op in map(resolve_op, _GAPS) if op in default}
    return {**cia, **_turbine_table(), torch.ops.aten.index_copy.default: index_copy_by_scatter, **gaps}


# ops IREE's importer takes but its compiler cannot lower, given torch's own decompositions (iree-base-compiler
# 3.13, iree-turbine 3.9), from torch.export's default table: logsumexp ("failed to legalize operation
# 'torch.constant.int'" or '...bool' on its arguments, any dim; granite_swa's sliding-window mask); a
# weight norm over a dim ("'tensor.cast' op operand type 'tensor<1x1x?xf32>' and result type
# 'tensor<64x16x16xf32>' are cast incompatible": the positional convolutions of hubert, wav2vec2 and the
# speech encoders built on them); index_add ("failed to legalize operation 'torch.operator' that was
# explicitly marked illegal ... torch.aten.index_add": jetmoe's experts; an index_put that accumulates); isin
# (the same, "torch.aten.isin.Tensor_Tensor": grounding-dino's special text tokens)
_GAPS = ("aten::logsumexp.default", "aten::_weight_norm_interface.default", "aten::index_add.default",
         "aten::isin.Tensor_Tensor", "aten::isin.Tensor_Scalar", "aten::isin.Scalar_Tensor")


def hand_off(ep, *, target_backends: tuple[str, ...] = (TARGET,)):
    """``aot.export(ep)`` compiled for ``target_backends``: the module's bytes (a .vmfb file's contents),
    and that module loaded by iree.runtime."""
    import iree.turbine.aot as aot

    from .program_copy import nodes_repaired, program_copy

    # (its importer rewrites the nodes it imports in place: it is given a copy, the caller's program kept)
    # complex tensors as real pairs: IREE computes a product of complex tensors wrong (2.0 relative off on
    # DeepSeek-V2's rotary embedding) or refuses it (DeepSeek-V2's and Llama 4's own: "Failed to
    # canonicalize the _assert_tensor_metadata op since the dtype does not match")
    handed = _rewritten_for_iree(complex_as_real_pairs(_fixed_values_folded(ep)))
    repairs = ((_split_by_a_size_of_data, _sliced), (_sum_of_a_fill, _counted), (_extreme_of_sizes, _computed_by_ops),
               *FX_IMPORTER_REPAIRS)
    handed = program_copy(nodes_repaired(handed, repairs))  # (the node rewrites, on one copy of the graph)
    with_tensor_meta(handed.graph_module)  # (the importer reads a dtype there, of the nodes made above too)
    exported = aot.export(handed)
    vmfb = _compiled(exported.mlir_module, target_backends)
    return vmfb, ep, load(vmfb)


def _in_ceil_mode(node) -> bool:
    return bool(node.args[4] if len(node.args) > 4 else node.kwargs.get("ceil_mode", False))


def _unsorted(node) -> bool:
    return not (node.args[4] if len(node.args) > 4 else node.kwargs.get("sorted", True))


def _topk_sorted(x, k, dim=-1, largest=True, sorted=True):
    # the order of an unsorted topk's values is unspecified: sorted is one order it may return
    if sorted:
        return NotImplemented
    return torch.ops.aten.topk.default(x, k, dim, largest, True)


def _cut_dims(shape, kernel, stride, padding, dilation) -> list[int]:
    """The spatial dims (of ``shape``'s, static) where a pool or convolution makes one window that does not
    reach the padded input's end: IREE's compiler miscomputes those ("'linalg.generic' op inferred
    input/output operand #1 has shape's dimension #0 to be 4, but found 3")."""
    if not all(isinstance(s, int) for s in shape):
        return []
    n = len(shape)
    kernel, stride, padding, dilation = (_per_dim(v, n, d) for v, d in
                                         ((kernel, None), (stride, kernel), (padding, 0), (dilation, 1)))
    cut = []
    for i in range(n):
        reach = dilation[i] * (kernel[i] - 1) + 1
        if (shape[i] + 2 * padding[i] - reach) // stride[i] + 1 == 1 and reach < shape[i] + 2 * padding[i]:
            cut.append(i)
    return cut


def _per_dim(value, n: int, default) -> list[int]:
    if value is None or (not isinstance(value, int) and len(value) == 0):
        value = default
    values = [value] * n if isinstance(value, int) else list(value)
    return values * n if len(values) == 1 else values


def _whole_windows(x, cut, kernel, padding, dilation):
    """``x`` padded with zeros by ``padding`` and cut, in each dim of ``cut``, to the one window's reach."""
    n = x.dim() - 2
    kernel, padding, dilation = _per_dim(kernel, n, None), _per_dim(padding, n, 0), _per_dim(dilation, n, 1)
    if any(padding):
        x = torch.ops.aten.constant_pad_nd.default(x, [p for p in reversed(padding) for _ in (0, 1)], 0.0)
    for i in cut:
        x = torch.ops.aten.slice.Tensor(x, 2 + i, 0, dilation[i] * (kernel[i] - 1) + 1)
    return x


def _convolution_of_whole_windows(x, weight, bias, stride, padding, dilation, transposed, output_padding, groups):
    # (a window that leaves the input's end unread reads the same values from the input cut to its reach)
    cut = [] if transposed else _cut_dims(x.shape[2:], weight.shape[2:], stride, padding, dilation)
    if not cut:
        return NotImplemented
    return torch.ops.aten.convolution.default(_whole_windows(x, cut, weight.shape[2:], padding, dilation), weight,
                                              bias, stride, [0] * (x.dim() - 2), dilation, False, output_padding,
                                              groups)


def _avg_pool2d_for_iree(x, kernel_size, stride=(), padding=0, ceil_mode=False, count_include_pad=True,
                         divisor_override=None):
    if ceil_mode:
        return avg_pool2d_without_ceil(x, kernel_size, stride, padding, ceil_mode, count_include_pad,
                                       divisor_override)
    cut = _cut_dims(x.shape[-2:], kernel_size, stride, padding, 1)
    if not cut or (any(_per_dim(padding, 2, 0)) and not count_include_pad):
        return NotImplemented  # (zeros padded ahead would count where the pool counts only the input)
    stride = _per_dim(stride, 2, kernel_size)
    return torch.ops.aten.avg_pool2d.default(_whole_windows(x, cut, kernel_size, padding, 1), kernel_size, stride,
                                             [0, 0], False, True, divisor_override)


def _max_pool2d_of_whole_windows(x, kernel_size, stride=(), padding=0, dilation=1, ceil_mode=False):
    cut = _cut_dims(x.shape[-2:], kernel_size, stride, padding, dilation)
    if not cut or ceil_mode or any(_per_dim(padding, 2, 0)):
        return NotImplemented
    return torch.ops.aten.max_pool2d.default(_whole_windows(x, cut, kernel_size, 0, dilation), kernel_size,
                                             _per_dim(stride, 2, kernel_size), [0, 0], dilation, False)


def _max_pool2d_with_indices_of_whole_windows(x, kernel_size, stride=(), padding=0, dilation=1, ceil_mode=False):
    # (an index is a position in the input's plane, h * width + w: the same in an input cut in height only)
    cut = _cut_dims(x.shape[-2:], kernel_size, stride, padding, dilation)
    if not cut or 1 in cut or ceil_mode or any(_per_dim(padding, 2, 0)):
        return NotImplemented
    return torch.ops.aten.max_pool2d_with_indices.default(
        _whole_windows(x, cut, kernel_size, 0, dilation), kernel_size, _per_dim(stride, 2, kernel_size), [0, 0],
        dilation, False)


def _meta(node, i, default=None):
    arg = node.args[i] if len(node.args) > i else default
    return arg.meta.get("val") if isinstance(arg, torch.fx.Node) else arg


def _convolution_cut(node) -> bool:
    x, w = _meta(node, 0), _meta(node, 1)
    return (isinstance(x, torch.Tensor) and isinstance(w, torch.Tensor) and not _meta(node, 6)
            and bool(_cut_dims(x.shape[2:], w.shape[2:], _meta(node, 3), _meta(node, 4), _meta(node, 5))))


def _avg_pool2d_needs(node) -> bool:
    x = _meta(node, 0)
    return _in_ceil_mode(node) or (isinstance(x, torch.Tensor) and bool(
        _cut_dims(x.shape[-2:], _meta(node, 1), _meta(node, 2, ()), _meta(node, 3, 0), 1)))


def _max_pool2d_cut(node) -> bool:
    x = _meta(node, 0)
    return isinstance(x, torch.Tensor) and bool(
        _cut_dims(x.shape[-2:], _meta(node, 1), _meta(node, 2, ()), _meta(node, 3, 0), _meta(node, 4, 1)))


def _clamp_to_float_bounds(x, min=None, max=None):
    # an integer tensor clamped to float bounds computes in the float dtype it promotes to
    if x.is_floating_point() or not any(isinstance(b, float) for b in (min, max)):
        return NotImplemented
    dtype = torch.result_type(x, min if isinstance(min, float) else max)
    return torch.ops.aten.clamp.default(torch.ops.aten._to_copy.default(x, dtype=dtype), min, max)


def _clamps_an_integer_to_floats(node) -> bool:
    x = _meta(node, 0)
    return (isinstance(x, torch.Tensor) and not x.is_floating_point()
            and any(isinstance(b, float) for b in (*node.args[1:3], *node.kwargs.values())))


def _masked_as_selected(x, indices):
    # x[mask], a bool mask over x's leading dims: the rows of x flattened there at the mask's nonzero places
    if len(indices) != 1 or indices[0] is None or indices[0].dtype is not torch.bool:
        return NotImplemented
    # (reshaped, not viewed: a mask expanded over x's last dims has strides of 0, audioflamingo3's)
    mask = indices[0]
    rows = torch.ops.aten.reshape.default(x, [-1, *x.shape[mask.dim():]]) if mask.dim() > 1 else x
    picked = torch.ops.aten.view.default(torch.ops.aten.nonzero.default(torch.ops.aten.reshape.default(mask, [-1])),
                                         [-1])
    return torch.ops.aten.index_select.default(rows, 0, picked)


def _indexed_by_a_mask(node) -> bool:
    indices = node.args[1] if len(node.args) > 1 else ()
    mask = indices[0].meta.get("val") if len(indices) == 1 and isinstance(indices[0], torch.fx.Node) else None
    return isinstance(mask, torch.Tensor) and mask.dtype is torch.bool


def _fill_as_expand(x, value):
    # a tensor filled with a 0-d tensor's value: that value expanded to its size, copied
    if value.dtype != x.dtype:
        value = torch.ops.aten._to_copy.default(value, dtype=x.dtype)
    return torch.ops.aten.clone.default(torch.ops.aten.expand.default(value, list(x.shape)))


def _rewritten_for_iree(ep):
    """``ep`` with what IREE's compiler cannot lower rewritten, in one retrace (``ep`` itself where there
    is nothing): each average pool in ceil mode without it (lowering/rewrites, exact), as the compiler
    miscomputes the size of the last windows ("'linalg.generic' op inferred input/output operand #1 has
    shape's dimension #0 to be 258, but found 256": efficientnet's and align's final pool); a pool or
    convolution making one window in a dim that leaves the input's end unread over the input cut to that
    window's reach (_cut_dims: pp_ocr's pool, mobilevit's and vibevoice's convolutions); each unsorted
    topk sorted, as it lowers only a sorted one ("failed to legalize operation 'torch.constant.bool'":
    the routers of most mixtures of experts); an integer tensor clamped to float bounds converted to the
    float dtype first, which the clamp computes in ("'arith.cmpf' op operand #0 must be floating-point-like,
    but got 'i64'": timesfm's lengths); ``x[mask]`` by a bool mask as the rows at the mask's nonzero
    places (index_select; "'arith.cmpi' op requires all operands to have the same type": higgs_audio_v2's
    audio positions); a fill with a 0-d tensor's value as that value expanded ("'linalg.generic' op write
    affecting operations on global resources are restricted to workgroup distributed contexts":
    pixtral's block mask, ``mask[a:b, a:b] = 0``); a view with a -1 whose literal sizes torch records as
    expressions of the sizes with the -1's size named: torch's view of (b, X, h) as (b, -1, 8, h)
    records the 8 as ``X // (X // 8)``, which torch-mlir's importer can only type as unknown, and IREE's
    compiler then miscomputes a slice of it ("expected sizes to be non-negative, but got -1": the chunked
    scans of bamba, zamba2 and granitemoehybrid); named, the 8 is a number again. A view with no -1 whose
    literal size torch records so (pegasus_x's blocks of 512, "has invalid Read access range" from the pad
    after it) is retraced as it is, which records the literal."""
    from .program_copy import calls_decomposed

    return calls_decomposed(ep, {torch.ops.aten.avg_pool2d.default: (_avg_pool2d_for_iree, _avg_pool2d_needs),
                                 torch.ops.aten.max_pool2d.default: (_max_pool2d_of_whole_windows, _max_pool2d_cut),
                                 torch.ops.aten.max_pool2d_with_indices.default: (
                                     _max_pool2d_with_indices_of_whole_windows, _max_pool2d_cut),
                                 torch.ops.aten.convolution.default: (_convolution_of_whole_windows,
                                                                      _convolution_cut),
                                 torch.ops.aten.clamp.default: (_clamp_to_float_bounds, _clamps_an_integer_to_floats),
                                 torch.ops.aten.index.Tensor: (_masked_as_selected, _indexed_by_a_mask),
                                 torch.ops.aten.fill.Tensor: (_fill_as_expand, lambda node: True),
                                 torch.ops.aten.topk.default: (_topk_sorted, _unsorted),
                                 **{op: (_view_of_sizes_named, _infers_a_dynamic_size) for op in _VIEWS}})


# ops IREE's compiler cannot lower at all (iree-base-compiler 3.13), and no decomposition reaches ops it
# can: the inverse error function ("failed to legalize operation 'torch.vtensor.literal'" on its argument)
_NOT_LOWERED = (torch.ops.aten.erfinv.default,)


def _fixed_values_folded(ep):
    """``ep`` with each call of an op in _NOT_LOWERED whose value the program fixes given as that value
    (a ``full``; fold.fixed_values_folded), on a copy; ``ep`` itself where there is none. gemma3n's
    activation sparsity takes the normal distribution's inverse at a constant, ``icdf(0.95)``."""
    from ..lowering.fold import fixed_values_folded
    from .program_copy import program_copy

    if not any(n.target in _NOT_LOWERED for n in ep.graph.nodes):
        return ep
    return fixed_values_folded(program_copy(ep), lambda op: op not in _NOT_LOWERED)


_VIEWS = (torch.ops.aten.view.default, torch.ops.aten._unsafe_view.default, torch.ops.aten.reshape.default)


def _infers_a_dynamic_size(node) -> bool:
    """A view with a literal size torch records as an expression of the sizes (where the size has no -1,
    the retrace records the literal: pegasus_x's blocks, ``view(2, n, 512)`` of a padded length)."""
    if node.target not in _VIEWS or not isinstance(node.meta.get("val"), torch.Tensor):
        return False
    size = node.args[1] if len(node.args) > 1 else node.kwargs.get("size", ())
    return any(type(s) is int and s != -1 and not isinstance(d, int) for s, d in zip(size, node.meta["val"].shape))


def _view_of_sizes_named(x, size):
    # (the size a -1 stands for, from the input's sizes: a product of its dims over the sizes named)
    if -1 not in [s for s in size if type(s) is int]:
        return NotImplemented
    at, rest = size.index(-1), 1
    for s in size[:at] + size[at + 1:]:
        rest = rest * s
    numel = 1
    for d in x.shape:
        numel = numel * d
    return torch.ops.aten.view.default(x, [*size[:at], numel // rest, *size[at + 1:]])


def _split_by_a_size_of_data(node) -> bool:
    """A split into pieces of sizes some of which are symbols, each piece read by a getitem."""
    if node.target is torch.ops.aten.split.Tensor:
        sizes = node.args[1:2]
    elif node.target is torch.ops.aten.split_with_sizes.default:
        sizes = node.args[1]
    else:
        return False
    return (any(isinstance(s, torch.fx.Node) for s in sizes) and isinstance(node.meta.get("val"), (list, tuple))
            and all(u.target is operator.getitem for u in node.users))


def _sliced(graph, node):
    """A split into pieces of symbolic sizes given as its pieces' slices (piece i: from the sum of the
    sizes before it to that sum and its own; a split by one size, the last piece to the end): IREE's
    compiler cannot lower such a split ("failed to legalize operation 'torch.constant.int'": prophetnet's
    attention splits its projection in three by the sequence's length, jetmoe's experts split their
    tokens by the counts routed to each)."""
    from .program_copy import node_replaced

    x = node.args[0]
    dim = node.args[2] if len(node.args) > 2 else node.kwargs.get("dim", 0)
    count = len(node.meta["val"])
    sizes = [node.args[1]] * count if node.target is torch.ops.aten.split.Tensor else list(node.args[1])

    def plus(a, b):
        if not isinstance(a, torch.fx.Node) and not isinstance(b, torch.fx.Node):
            return a + b
        return emitted(graph, operator.add, a, b)

    bounds = [0]
    for i, size in enumerate(sizes):
        last_of_one_size = i == count - 1 and node.target is torch.ops.aten.split.Tensor
        bounds.append(sys.maxsize if last_of_one_size else plus(bounds[-1], size))
    for user in list(node.users):
        i = user.args[1]
        piece = graph.call_function(torch.ops.aten.slice.Tensor, (x, dim, bounds[i], bounds[i + 1]))
        piece.meta = dict(user.meta)
        node_replaced(graph, user, piece)
    graph.erase_node(node)


_SYM_EXTREMES = {torch.sym_min: torch.ops.aten.minimum.default, torch.sym_max: torch.ops.aten.maximum.default}


def _extreme_of_sizes(node) -> bool:
    return (node.op == "call_function" and node.target in _SYM_EXTREMES and len(node.args) == 2
            and isinstance(node.meta.get("val"), (int, torch.SymInt)))


def _computed_by_ops(graph, node):
    """A ``torch.sym_min``/``sym_max`` of two sizes (Python functions, which turbine's importer does not
    convert: "Unimplemented call_function: target=<function sym_min>", deepseek_v4's and minimax's
    windows, axk2's) computed by ops: the minimum or maximum of the two as 0-d tensors, read back as a
    number; the number keeps the expression torch.export gave it."""
    from .program_copy import node_replaced

    fake_mode = program_fake_mode(graph.owning_module)
    tensors = [emitted(graph, torch.ops.aten.scalar_tensor.default, a, dtype=torch.int64, fake_mode=fake_mode)
               for a in node.args]
    read = graph.call_function(torch.ops.aten._local_scalar_dense.default,
                               (emitted(graph, _SYM_EXTREMES[node.target], *tensors, fake_mode=fake_mode),))
    read.meta["val"] = node.meta["val"]
    node_replaced(graph, node, read)


_EMPTY = (torch.ops.aten.empty_strided.default, torch.ops.aten.empty.memory_format)


def _filled(node) -> tuple | None:
    """(size, number) of a node making a tensor filled with one number: ones, full, or an empty tensor
    filled (how torch.export records ``torch.full``); None for any other node."""
    if not isinstance(node, torch.fx.Node) or node.kwargs.get("layout") not in (None, torch.strided):
        return None
    if node.target is torch.ops.aten.ones.default:
        return list(node.args[0]), 1
    if node.target is torch.ops.aten.full.default:
        return list(node.args[0]), node.args[1]
    if node.target is torch.ops.aten.fill.Scalar and getattr(node.args[0], "target", None) in _EMPTY:
        return list(node.args[0].args[0]), node.args[1]
    return None


def _sum_of_a_fill(node) -> bool:
    """A cumulative sum of a tensor filled with one number (``attention_mask.cumsum`` of a mask of ones)."""
    return (node.target is torch.ops.aten.cumsum.default and _filled(node.args[0]) is not None
            and isinstance(node.meta.get("val"), torch.Tensor))


def _counted(graph, node):
    """A cumulative sum of a tensor filled with ``v`` given as ``v * (1, 2, ..., n)`` along its dim,
    expanded to the fill's size (the same numbers). IREE's compiler fuses the fill into the scan and
    sizes a stack buffer by the dim's bound, 2**53 for a sequence's length ("exceeded stack allocation
    limit of 32768 bytes": opt's and prophetnet's positions, counted from a mask of ones)."""
    from .program_copy import node_replaced

    want = node.meta["val"]
    dim = node.args[1] % want.dim()
    size, value = _filled(node.args[0])
    emit = functools.partial(emitted, graph, fake_mode=want.fake_mode)
    counts = emit(torch.ops.aten.add.Tensor,
                  emit(torch.ops.aten.arange.default, size[dim], dtype=want.dtype, device=want.device), 1)
    if value != 1:
        counts = emit(torch.ops.aten.mul.Tensor, counts, value)
    along = emit(torch.ops.aten.view.default, counts, [size[dim] if i == dim else 1 for i in range(want.dim())])
    node_replaced(graph, node, emit(torch.ops.aten.expand.default, along, size))


def _compiled(module, target_backends) -> bytes:
    """``module`` (turbine's MLIR, torch dialect) compiled by the ``iree-compile`` the installed compiler
    ships, in a process of its own: the compiler aborts or crashes on some programs (audioflamingo3's
    encoder), which in-process (turbine's ``compile``) ends the caller's process. A failure is an error
    naming the compiler's first error line (turbine's own says "See diagnostics"); what the compiler
    prints reaches this process's stderr, as it would in-process."""
    import signal
    import subprocess

    from iree.compiler.tools.binaries import find_tool

    with tempfile.TemporaryDirectory(prefix="pt2b_iree_") as folder:
        source, output = os.path.join(folder, "program.mlirbc"), os.path.join(folder, "program.vmfb")
        with open(source, "wb") as f:
            module.write_bytecode(f)
        flags = ["--iree-input-type=torch", "--iree-hal-target-backends=" + ",".join(target_backends)]
        if "llvm-cpu" in target_backends:  # the compiler's default, said so (else it warns on every program)
            flags.append("--iree-llvmcpu-target-cpu=generic")
        done = subprocess.run([find_tool("iree-compile"), source, *flags, "-o", output],
                              stdin=subprocess.DEVNULL, capture_output=True)
        printed = done.stderr.decode("utf-8", "replace")
        sys.stderr.write(printed)
        if done.returncode < 0:
            raise RuntimeError(f"IREE's compiler (iree-compile) was killed by "
                               f"{signal.Signals(-done.returncode).name}: {_first_error(printed)}")
        if done.returncode != 0:
            raise RuntimeError(f"Compilation failed (iree-compile): {_first_error(printed)}")
        with open(output, "rb") as f:
            return f.read()


def _first_error(printed: str) -> str:
    """The compiler's first ``error:`` line, with the op it names: a failure then says what failed, and
    failures group by their cause."""
    for line in printed.splitlines():
        if "error:" in line:
            return line[line.index("error:"):].strip()[:500]
    return "the compiler printed no error line"


def load(vmfb: bytes):
    """The module loaded afresh by iree.runtime (its mutable globals at the program's values)."""
    import iree.runtime as rt

    config = rt.Config(DRIVER)
    return rt.load_vm_module(rt.VmModule.copy_buffer(config.vm_instance, vmfb), config)


def run(vmfb: bytes, ep, args, kwargs, plan=None):
    """``plan``: the loaded module hand_off made."""
    leaves = calling.flat_inputs(ep, args, kwargs)
    result = plan.main(*calling.numpy_inputs(leaves))
    values = list(result) if isinstance(result, (tuple, list)) else [result]
    tensors = [torch.from_numpy(v.to_host().copy()) if hasattr(v, "to_host") else v for v in values]
    return calling.from_tensor_outputs(ep, tensors, leaves, "IREE")


def backend() -> Backend:
    from importlib.metadata import version

    return Backend("iree", f"{version('iree-base-compiler')}+turbine{version('iree-turbine')}", (),
                   "torch.export's CompositeImplicitAutograd decompositions with iree-turbine's current_aot_decompositions() over them (IREE publishes no op list)", _table, hand_off, run,
                   f"target {TARGET}, runtime driver {DRIVER}", takes_what_its_table_leaves=True, save=save,
                   file_suffix=".vmfb",
                   holds_state=True, load=load,  # turbine makes written buffers the module's mutable globals
                   takes_ops_only=True)


def save(compiled, path: str) -> None:
    """The compiled module's bytes (a .vmfb), loaded by iree.runtime."""
    with open(path, "wb") as f:
        f.write(compiled.native)
