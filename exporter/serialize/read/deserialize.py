"""torch's ExportedProgramDeserializer with four steps made cheaper: the fake tensors of nodes
(_fast_tensor_meta), the parsing of symbolic expressions (_memoized_parse), the module stacks of nodes
(_shared_module_stacks) and the search for unbacked symbols (_skipping_empty_walks). Each function's
docstring has its mechanism (what each saves: docs/journal/code-notes.md); the last step of a load:
docs/architecture.md#load-load."""

from __future__ import annotations

import contextlib
import dataclasses
import threading
import types

import torch
from torch.fx.experimental import symbolic_shapes

from ..._torch import compat, patches
from ..._torch import serializer as _serde
from ..._torch.dispatch import FakeTensor
from ..._torch.symbolic import int_oo

_CPU = torch.device("cpu")
_META = torch.device("meta")
_DTYPES = _serde.SERIALIZE_TO_TORCH_DTYPE


def _fast_tensor_meta(self, tensor_meta):
    """GraphModuleDeserializer.deserialize_tensor_meta with the direct path for static CPU tensors.

    torch makes each node's ``meta["val"]`` by calling ``torch.empty_strided`` under its FakeTensorMode,
    a full fake dispatch; for a tensor whose sizes and strides are plain integers on the CPU this
    builds the same FakeTensor directly from a meta tensor, several times faster: same mode, device,
    dtype, sizes, strides and requires_grad, nothing else differs. Symbolic shapes, other devices and
    every other step stay torch's own code. A program has a tensor per node, so this is much of a load."""
    device = tensor_meta.device
    if device.type == "cpu" and device.index is None:
        try:
            sizes = tuple([s.as_int for s in tensor_meta.sizes])
            strides = tuple([s.as_int for s in tensor_meta.strides])
        except AttributeError:  # a symbolic size or stride (as_expr): torch's path
            sizes = strides = (None,)
        if None not in sizes and None not in strides:
            elem = torch.empty_strided(sizes, strides, dtype=_DTYPES[tensor_meta.dtype], device=_META,
                                       requires_grad=tensor_meta.requires_grad)
            return FakeTensor(self.fake_tensor_mode, elem, _CPU)
    return _serde.GraphModuleDeserializer.deserialize_tensor_meta(self, tensor_meta)


def _memoized_parse(d):
    """GraphModuleDeserializer._parse_sym_expr of ``d``, returning at once what it returned before for
    the same expression (text, or a sympy sub-expression) unless it comes with a hint not recorded.

    torch parses each symbolic size by sympifying its text and then walking every sub-expression
    again, recursively, before looking the result up in its cache of parsed expressions: a program
    whose sizes are deep expressions spends most of its load there, the walk growing with each
    expression's depth. The same walk on an expression already parsed only re-registers what it registered the
    first time, so an expression or sub-expression met again returns the object torch cached for it
    (one that comes with a hint torch has not recorded for it yet still takes torch's own path)."""
    parse = d._parse_sym_expr
    seen = {}

    def _parse_sym_expr(expr, hint=None):
        done = seen.get(expr)
        if done is not None and (hint is None or done in compat.hinted_expressions(d.shape_env)):
            return done
        sym = parse(expr, hint)
        seen[expr] = sym
        return sym

    return _parse_sym_expr


_META_TARGETS: dict[str, object] = {}


def _meta_targets() -> dict[str, object]:
    """The callables a ``source_fn_stack`` entry may name, as torch's serializer spells them
    ("<module>.<name>"): torch.nn's module classes, torch.nn.functional's functions, torch's builtin
    functions, and the operator and math modules' functions. Read from those modules' own dicts once
    (no getattr on a name from a file, no lazy import)."""
    if not _META_TARGETS:
        import math
        import operator

        found = {}
        for module in (torch.nn, torch.nn.functional, torch, operator, math):
            for key, obj in list(vars(module).items()):
                if key.startswith("_") or not callable(obj):
                    continue
                if module is torch.nn and not (isinstance(obj, type) and issubclass(obj, torch.nn.Module)):
                    continue
                if module is torch and not isinstance(obj, types.BuiltinFunctionType):
                    continue
                name = getattr(obj, "__name__", None)
                if isinstance(name, str) and isinstance(getattr(obj, "__module__", None), str):
                    found[f"{obj.__module__}.{name}"] = obj
        _META_TARGETS.update(found)
    return _META_TARGETS


def _source_fn_stack(text: str) -> list:
    """A node's ``source_fn_stack`` metadata (";"-separated "node name,callable" entries) as torch's
    deserializer makes it, except that a callable is resolved only through the operator registry or
    _meta_targets: torch's own code resolves any torch.*, operator.* or math.* path with getattr.
    A name neither knows stays text, as torch leaves a name it cannot resolve."""
    from ... import ops
    from ...errors import CorruptArtifactError

    out = []
    for entry in text.split(_serde.ST_DELIMITER):
        parts = entry.split(",")
        if len(parts) != 2:
            raise CorruptArtifactError(f"node metadata source_fn_stack entry {entry[:80]!r} is not 'name,callable'.")
        name, target = parts
        op = ops.op_of_target(target)
        out.append((name, op if op is not None else _meta_targets().get(target, target)))
    return out


def _shared_module_stacks(d):
    """GraphModuleDeserializer.deserialize_metadata of ``d``, splitting each distinct ``nn_module_stack``
    text once; the result has the same keys in the same order, and a dict of its own per node.
    ``source_fn_stack`` is read by _source_fn_stack, never by torch's resolver.

    torch splits each node's ``nn_module_stack`` text character by character (its entries may hold
    bracketed commas); the nodes of one module share the same text, so each distinct text is split
    once by torch's own code and every node gets a new dict of that result."""
    deserialize = d.deserialize_metadata
    split = {}

    def deserialize_metadata(metadata):
        text = metadata.get("nn_module_stack")
        source_fns = metadata.get("source_fn_stack")
        if not text and not source_fns:
            return deserialize(metadata)
        if text:
            entries = split.get(text)
            if entries is None:
                entries = split[text] = tuple(deserialize({"nn_module_stack": text})["nn_module_stack"].items())
        rest = deserialize({k: v for k, v in metadata.items() if k not in ("nn_module_stack", "source_fn_stack")})
        out = {"stack_trace": rest.pop("stack_trace")} if "stack_trace" in rest else {}
        if text:
            out["nn_module_stack"] = dict(entries)
        if source_fns:
            out["source_fn_stack"] = _source_fn_stack(source_fns)
        out.update(rest)
        return out

    return deserialize_metadata


def _graph_module_deserializer():
    """torch's GraphModuleDeserializer (final: it refuses subclasses) with the three steps above bound
    on this one instance; nothing process-wide changes."""
    d = _serde.GraphModuleDeserializer()
    d.deserialize_tensor_meta = types.MethodType(_fast_tensor_meta, d)
    d._parse_sym_expr = _memoized_parse(d)
    d.deserialize_metadata = _shared_module_stacks(d)
    return d


_STATE = threading.local()
_WALK = "torch.fx.experimental.symbolic_shapes:_free_unbacked_symbols_with_path"


def _skipping_empty_walks(walk):
    """symbolic_shapes._free_unbacked_symbols_with_path returning {} at once where nothing is pending,
    in a thread inside ``deserialize_program``.

    After building the graph, torch walks every node's value (each size, stride and offset) for the
    unbacked symbols it has not yet found a node binding (``pending``, which the walk empties as it
    finds them). A walk with nothing pending finds nothing and changes nothing (each binding it
    records is a symbol taken out of ``pending``), so while pt2b's deserializer runs in this thread,
    that walk returns at once instead of visiting every value of the graph. torch's function
    is wrapped once for the process (declared in exporter/_torch/patches.py); outside
    ``deserialize_program``, and in every other thread, the wrapper calls it unchanged."""

    def free_unbacked_symbols_with_path(*args, _torch_walk=walk, **kwargs):
        if getattr(_STATE, "reading", False):
            pending = kwargs["pending"] if "pending" in kwargs else args[4] if len(args) > 4 else None
            if pending is not None and not pending:
                return {}
        return _torch_walk(*args, **kwargs)

    return free_unbacked_symbols_with_path


def deserialize_program(serialized, state_dict, constants, example_inputs) -> torch.export.ExportedProgram:
    """What ``ExportedProgramDeserializer().deserialize(...)`` returns, built with the deserializer above
    (torch's walk wrapped once for the process on the first call: exporter/_torch/patches.py)."""
    with _reading():
        return _deserialize_program(serialized, state_dict, constants, example_inputs)


@contextlib.contextmanager
def _reading():
    """This thread runs pt2b's deserializer (_skipping_empty_walks: torch's walk wrapped once for the
    process, on the first read)."""
    patches.wrap_once(_WALK, _skipping_empty_walks)
    outer = getattr(_STATE, "reading", False)
    _STATE.reading = True
    try:
        yield
    finally:
        _STATE.reading = outer


def _lists_as_captured(gm) -> None:
    """``meta["val"]`` of a node whose op returns one list (split_with_sizes, unbind: ``Tensor[]``) as the
    list torch.export captures, where torch's deserializer makes a tuple of it; importers that read the
    value's type from it (IREE's FX importer) take only the list."""
    for module in gm.modules():
        if not isinstance(module, torch.fx.GraphModule):
            continue
        for node in module.graph.nodes:
            val = node.meta.get("val")
            if (type(val) is tuple and isinstance(node.target, torch._ops.OpOverload)
                    and len(node.target._schema.returns) == 1
                    and isinstance(node.target._schema.returns[0].type, torch.ListType)):
                node.meta["val"] = list(val)


def _symbol_ranges(serialized) -> dict:
    """The program's recorded symbol ranges as torch's deserializer takes them (after its schema check)."""
    version = serialized.schema_version
    if version.major != _serde.SCHEMA_VERSION[0] and not (version.major == 0 and version.minor == 0):
        raise _serde.SerializeError(f"Serialized schema version {serialized.schema_version} does not match our "
                                    f"current schema version {_serde.SCHEMA_VERSION}.")
    return {
        k: symbolic_shapes.ValueRanges(_serde.int_to_sympy_int(v.min_val, -int_oo),
                                       _serde.int_to_sympy_int(v.max_val, int_oo))
        for k, v in serialized.range_constraints.items()
    }


@dataclasses.dataclass
class CallSpec:
    in_spec: object
    out_spec: object


@dataclasses.dataclass
class CallableGraph:
    """A program's lifted graph module and what lifted.DirectCall binds it by (the attributes it reads of an
    ExportedProgram, by the same names), without an ExportedProgram: deserialize_for_call."""

    graph_module: torch.fx.GraphModule
    graph_signature: object  # torch.export.ExportGraphSignature
    state_dict: dict
    constants: dict
    call_spec: CallSpec
    range_constraints: dict
    _guards_code: list

    @property
    def graph(self) -> torch.fx.Graph:
        return self.graph_module.graph


def _inputs_valued_only(self, name: str, fx_node) -> None:
    """GraphModuleDeserializer.sync_fx_node giving a fake value to the graph's inputs only (a direct call
    binds them by it); every other node is named and registered as torch does, its value None."""
    if fx_node.op == "placeholder":
        return _serde.GraphModuleDeserializer.sync_fx_node(self, name, fx_node)
    if name in self.serialized_name_to_node:
        raise _serde.SerializeError(f"Node {name} has already been deserialized before.")
    fx_node.name = name
    self.serialized_name_to_node[name] = fx_node
    fx_node.meta["val"] = None


def deserialize_for_call(serialized, state_dict, constants) -> CallableGraph:
    """The lifted graph module deserialize_program builds, by torch's own deserializer (the same nodes,
    targets and arguments, placed by the same schema walk), without what only an ExportedProgram needs:
    a fake value for each node that is not an input, node metadata (stack traces, module stacks), and
    the ExportedProgram with its verifier: what a loaded program's first call needs
    (ProgramHandle.__call__), in about half the time deserialize_program takes."""
    with _reading():
        ranges = _symbol_ranges(serialized)
        d = _graph_module_deserializer()
        d.sync_fx_node = types.MethodType(_inputs_valued_only, d)
        d.deserialize_metadata = lambda metadata: {}
        res = d.deserialize(serialized.graph_module, state_dict, constants, None, ranges)
        range_constraints = _serde.ExportedProgramDeserializer().deserialize_range_constraints(
            ranges, res.names_to_symbols)
    # as ExportedProgram.call_spec reads it: the root module's entry, named ""
    root = res.module_call_graph[0].signature if res.module_call_graph and res.module_call_graph[0].fqn == "" else None
    call_spec = CallSpec(root.in_spec if root else None, root.out_spec if root else None)
    return CallableGraph(res.graph_module, res.signature, res.state_dict, res.constants, call_spec,
                         range_constraints, list(serialized.guards_code or []))


def _deserialize_program(serialized, state_dict, constants, example_inputs) -> torch.export.ExportedProgram:
    symbol_name_to_range = _symbol_ranges(serialized)
    d = _graph_module_deserializer()
    res = d.deserialize(serialized.graph_module, state_dict, constants, example_inputs, symbol_name_to_range)
    _lists_as_captured(res.graph_module)
    # torch.export traces with fallback kernels allowed (an op without a meta kernel, such as geqrf or
    # histogram, runs its CPU kernel on zeros to learn its result's shape); torch's deserializer makes
    # the program's fake mode without them, so a program read back could not be retraced where the
    # exported one can
    d.fake_tensor_mode.allow_fallback_kernels = True
    range_constraints = _serde.ExportedProgramDeserializer().deserialize_range_constraints(
        symbol_name_to_range, res.names_to_symbols)
    result = torch.export.ExportedProgram(
        root=res.graph_module, graph=res.graph_module.graph, graph_signature=res.signature,
        state_dict=res.state_dict, range_constraints=range_constraints, module_call_graph=res.module_call_graph,
        example_inputs=res.example_inputs, constants=res.constants,
        verifiers=[_serde.load_verifier(v) for v in serialized.verifiers],
    )
    result._guards_code = serialized.guards_code
    return result
