""".pt2b file -> verified header and program table -> mmap'd tensors -> ExportedProgram.

Nothing in the file is unpickled, evaluated or imported; the program section's checksum is
verified on every open, weight checksums on request (``verify=True``).
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import hashlib
import mmap
import os
import threading

import msgpack
import torch

from ..._torch import compat
from ..._torch.pytree import pytree
from ..._torch.serde import schema as S
from ... import names
from ...errors import ArtifactError, CorruptArtifactError, MethodNotFoundError, MissingPytreeTypeError
from ...util import nesting
from ...versioning import schema_drift
from ...layout.generated import pt2b_generated as G
from ...layout.container import Header
from ...layout.segments import KIND_NAMES
from ..mapping import module_stacks, return_types
from . import (buffer_bounds, decode_schema, integrity, pytree_types, segment_hashes, subclasses, unpack_tables, untrusted,
               weights)

return_types.register()  # torch.return_types (sort, topk, ...) in pytree specs: named, to write and read


# torch's GraphModuleDeserializer keeps the active deserializer in a module global, so two
# threads deserializing at once corrupt each other; pt2b serializes that one step.
_DESERIALIZE_LOCK = threading.Lock()


@dataclasses.dataclass
class Artifact:
    """An opened, verified .pt2b file: header, decoded program table and the file mapping."""

    path: str
    header: Header
    program: object  # G.ProgramT
    mm: mmap.mmap
    digest: str = ""  # sha256 of the program section as read: the content identity (program_digest)
    upgrade_notes: list[str] = dataclasses.field(default_factory=list)  # op schema upgrades applied
    format_notes: list[str] = dataclasses.field(default_factory=list)  # older-major steps applied in memory
    op_plans: dict | None = None  # check_ops: the op table against the running torch's schemas
    method_names: tuple[str, ...] = ("forward",)  # format 1.2: every method, the default first
    method: str = "forward"  # the method this Artifact reads (method() gives the others)

    @property
    def version(self) -> tuple[int, int]:
        return (self.header.major, self.header.minor)


def _where(path) -> str:
    return f"{os.fspath(path)!s}"


def open_artifact(path) -> Artifact:
    """Open and verify ``path``: preamble, version, header, program checksum, program table."""
    path, header, mm, program_bytes = integrity.open_checked(path, mapped=True)
    where = _where(path)
    digest = hashlib.sha256(program_bytes).hexdigest()
    program_bytes, notes = integrity.current_program(header, program_bytes, where)
    # bounds, enums, depth, work: before any unpacking; the graph's own walk runs at its first read
    budget = buffer_bounds.Budget(len(program_bytes))  # one for the file: every graph's walk below draws on it
    skipped = buffer_bounds.check_buffer(program_bytes, where, skip=(_GRAPH_FIELD,), budget=budget)
    try:
        # = G.ProgramT.InitFromPackedBuf, faster; the graph is left packed for decode_graph to read directly
        program = unpack_tables.unpack_program(program_bytes, lazy=("exportedProgram",))
    except Exception as e:  # the verifier should make this unreachable; any failure still means damage
        raise CorruptArtifactError(f"{where}: program section is malformed ({type(e).__name__}: {e}).") from None
    del skipped  # every graph (the root's, each Method's) is walked on its first read:
    for field, table in [(_GRAPH_FIELD, program)] + [(f"methods[{i}].{_GRAPH_FIELD}", m)
                                                     for i, m in enumerate(program.methods or [])]:
        graph = table.exportedProgram
        if isinstance(graph, unpack_tables.TableRef):
            graph.pending = functools.partial(buffer_bounds.check_table, graph.buf, graph.pos, graph.table, field, where,
                                              budget=budget)
    names_ = _method_names(program, where)
    return Artifact(path, header, program, mm, digest=digest, format_notes=notes, method_names=names_,
                    method=names_[0])


# the fields a Method table holds for itself; the rest (segments, metadata, provenance, producer) are the root's
_METHOD_FIELDS = frozenset({"name", "irLevel", "exportedProgram", "tensors", "operators", "exampleInputsSpec",
                            "exampleInputsLeaves", "lowering", "tensorSubclasses"})


class MethodTable:
    """A Method table (format 1.2) read as the Program table it would be alone: its own graph, tensor
    records, op table, example inputs and lowering record; the root's weight segments, metadata,
    provenance, producer and torch version."""

    __slots__ = ("root", "method")

    def __init__(self, root, method):
        self.root, self.method = root, method

    def __getattr__(self, name):
        if name in _METHOD_FIELDS:
            return getattr(self.method, name)
        if name in ("methods", "defaultMethod"):
            return None
        return getattr(self.root, name)


def _method_names(program, where: str) -> tuple[str, ...]:
    """The artifact's method names, the default first, checked: distinct Python identifiers."""
    default = text(program.defaultMethod) if program.defaultMethod is not None else names.DEFAULT_METHOD
    found = (default, *(text(m.name) for m in program.methods or []))
    why = names.method_names_problem(found)
    if why is not None:
        raise CorruptArtifactError(f"{where}: {why}; the file is damaged.")
    return found


def method(art: Artifact, name: str | None = None) -> Artifact:
    """The Artifact that reads method ``name`` (None: the default) of ``art``: the same file and
    mapping, so tensors of a storage that methods share are views of the same mapped bytes."""
    if name is None or name == art.method_names[0]:
        return art
    if name not in art.method_names:
        raise MethodNotFoundError(f"{art.path}: no method {name!r}; the artifact holds "
                                  f"{', '.join(art.method_names)}.")
    table = art.program.methods[art.method_names.index(name) - 1]
    return Artifact(art.path, art.header, MethodTable(art.program, table), art.mm, digest=art.digest,
                    format_notes=art.format_notes, method_names=art.method_names, method=name)


_GRAPH_FIELD = "exported_program"  # the Program table's field holding torch's schema of the program


def program_digest(path) -> str:
    """sha256 of the program section, which records every tensor and weight-segment checksum:
    an identity for the artifact's content that costs no weight reads (checked like open_artifact)."""
    _, _, _, program_bytes = integrity.open_checked(path, mapped=False)
    return hashlib.sha256(program_bytes).hexdigest()


def read_lowering(art: Artifact) -> dict | None:
    """The program's lowering record (format 1.1+), or None."""
    low = art.program.lowering
    if low is None:
        return None
    where = _where(art.path)
    outside = {}
    for e in low.outsideOpset or []:
        try:
            outside[text(e.key)] = int(text(e.value))
        except ValueError:
            raise CorruptArtifactError(f"{where}: lowering record: call count {text(e.value)[:40]!r} is not a number.") from None
    return {"request": text(low.request), "fingerprint": text(low.fingerprint),
            "torch_version": text(low.torchVersion), "outside_opset": outside}


def text(b) -> str:
    """A string field of the program table (bytes from FlatBuffers) as str."""
    return b.decode("utf-8", "replace") if isinstance(b, bytes) else (b or "")


def weight_digests(art: Artifact) -> list[bytes] | None:
    """The sha256 digest of each weight segment as the file records it (format 1.3+), or None for a
    file that records none (written by an older pt2b, or as an older format)."""
    return integrity.digests(art.program.weightDigests, len(art.program.segments or []), _where(art.path))


def segment_views(art: Artifact) -> list[torch.Tensor]:
    """A uint8 tensor over each weight segment of the mapped file (no copy, nothing read). The segments
    together may claim no more than the data section (integrity.segment_extents): whatever hashes or
    reads every segment (verify, the lowering cache's keys) then costs at most the file's size."""
    where = _where(art.path)
    integrity.segment_extents(art.header, art.program.segments or [], where)
    return [weights.segment_view(art.mm, art.header.data_offset, art.header.data_size, seg, i, where)
            for i, seg in enumerate(art.program.segments or [])]


def load_tensors(art: Artifact, *, verify: bool = False,
                 early: segment_hashes.Early | None = None) -> dict[str, tuple[int, torch.Tensor, bool]]:
    """name -> (TensorKind, tensor, requires_grad); tensors are views into the mapped file.
    ``verify``: each segment checked against its recorded CRC32 and (format 1.3+) digest first
    (``early``: hashing `pt2b verify` started before it opened the artifact)."""
    where = _where(art.path)
    views = segment_views(art)  # each segment within the data section, or CorruptArtifactError
    if verify:
        _check_segments(art, early)
    out = {}
    for rec in art.program.tensors or []:
        name = text(rec.name)
        untrusted.check_name(name, untrusted.FQN, where, "tensor name")
        name = names.safe_path(name)
        if rec.kind not in KIND_NAMES:
            raise CorruptArtifactError(f"{where}: tensor {name!r} has unknown kind {rec.kind}.")
        if name in out:
            raise CorruptArtifactError(f"{where}: tensor {name!r} is stored twice.")
        out[name] = (rec.kind, weights.materialize(rec, views, where, len(art.mm)), bool(rec.requiresGrad))
    return out


def _check_segments(art: Artifact, early: segment_hashes.Early | None = None) -> None:
    """Every weight segment's sha256 digest (format 1.3+; CRC32 before) against the program table's,
    computed in parallel (segment_hashes), or taken from ``early`` where it hashed these very extents.
    Each segment's bounds are checked first (segment_views, in load_tensors)."""
    segments = art.program.segments or []
    digests = weight_digests(art)
    extents = integrity.segment_extents(art.header, segments, _where(art.path))
    integrity.check_segment_hashes(integrity.hash_segments(art.mm, extents, digests, early), segments, digests,
                                   _where(art.path))


def verify_weights(art: Artifact, early: segment_hashes.Early | None = None) -> int:
    """Check every weight segment's checksums (``early``: hashing `pt2b verify` started before it
    opened the artifact) and every tensor record; returns the number of bytes verified."""
    load_tensors(art, verify=True, early=early)
    return sum(int(s.nbytes) for s in art.program.segments or [])


def operator_records(art: Artifact) -> list[tuple[str, str, str, int]]:
    return [(text(r.qualifiedName), text(r.overload), text(r.schema), r.kind)
            for r in art.program.operators or []]


def decode_graph(art: Artifact) -> S.ExportedProgram:
    """torch's schema tree of the program, read straight from the verified buffer (decode_schema)."""
    where = _where(art.path)
    graph = art.program.exportedProgram
    if graph is None:
        raise CorruptArtifactError(f"{where}: a required ExportedProgram table is missing.")
    graph = unpack_tables.packed(graph, "ExportedProgram").verified()  # (a tree set in memory is packed first)
    return decode_schema.read(graph.buf, graph.pos, S.ExportedProgram, where)


def _example_inputs(art: Artifact, tensors) -> object:
    spec = text(art.program.exampleInputsSpec)
    if not spec:
        return None
    where = _where(art.path)
    untrusted.check_treespec(spec, f"{where}: example inputs")
    try:
        treespec = pytree.treespec_loads(spec)
    except Exception as e:
        raise _unregistered_pytree_type(e, where) or CorruptArtifactError(
            f"{where}: example inputs are malformed ({type(e).__name__}: {e}).") from None
    # their dict keys become guard code at ep.module() (torch.export._unlift)
    stack = [treespec]
    while stack:
        node = stack.pop()
        stack.extend(node.children())
        if node.type in (dict, collections.OrderedDict, collections.defaultdict):
            ctx = node.context[1] if node.type is collections.defaultdict else node.context
            untrusted.check_plain_strings(list(ctx or []), f"{where}: example inputs", "dict key")
    raw = art.program.exampleInputsLeaves
    try:
        leaves_meta = msgpack.unpackb(bytes(raw if raw is not None else b""), strict_map_key=True)
    except Exception as e:
        raise CorruptArtifactError(f"{where}: example inputs are malformed ({type(e).__name__}: {e}).") from None
    example = [t for _, (k, t, _) in tensors.items() if k == G.TensorKind.EXAMPLE_INPUT]
    leaves = _example_leaves(leaves_meta, example, where)
    try:
        return pytree.tree_unflatten(leaves, treespec)
    except Exception as e:
        raise CorruptArtifactError(f"{where}: example inputs are malformed ({type(e).__name__}: {e}).") from None


_EXAMPLE_SCALARS = (bool, int, float, str, type(None))  # the non-tensor leaves the writer stores


def _example_leaves(entries, example: list, where: str) -> list:
    """The example inputs' leaves from their msgpack record, as the writer stores them: a list of
    {"t": index of a stored example-input tensor} or {"v": one number, string, bool or None}. Anything
    else, a value nested inside a leaf above all, is refused here: torch's pytree functions and the
    guard checks walk leaves recursively."""
    if not isinstance(entries, list):
        raise CorruptArtifactError(f"{where}: example inputs are malformed (their leaves are not a list).")
    out = []
    for i, x in enumerate(entries):
        if type(x) is dict and len(x) == 1:
            t, v = x.get("t"), x.get("v")
            if type(t) is int and 0 <= t < len(example):
                out.append(example[t])
                continue
            if "v" in x and isinstance(v, _EXAMPLE_SCALARS):
                out.append(v)
                continue
        raise CorruptArtifactError(
            f"{where}: example inputs are malformed: leaf {i} {_leaf_problem(x, len(example))}, where a leaf is the "
            f"index of a stored tensor or one number, string, bool or None, nothing nested (the file is damaged "
            f"or crafted).")
    return out


def _leaf_problem(x, stored: int) -> str:
    """What is wrong with an example-input leaf record, by types only (the value may nest: never printed)."""
    if type(x) is dict and len(x) == 1 and "t" in x:
        t = x["t"]
        return f"names tensor {t} of {stored} stored" if type(t) is int else f"names a tensor by a {type(t).__name__}"
    if type(x) is dict and len(x) == 1 and "v" in x:
        return f"holds a {type(x['v']).__name__}"
    return f"is a {type(x).__name__}" + (f" of {len(x)} entries" if type(x) is dict else "")


@dataclasses.dataclass
class Checked:
    """An artifact's program after every check pt2b makes before torch's deserializer runs."""

    serialized: S.ExportedProgram
    state_dict: dict
    constants: dict
    example_inputs: object
    pytree_types: frozenset = frozenset()  # the type names its specs use (build registers them: _register_types)


def check_ops(art: Artifact) -> dict:
    """The op table against the running torch (schema_drift.plan_ops), once per opened artifact: an
    op it lacks is a MissingOperatorError, a drift no upgrader reconciles a SchemaDriftError. Needs
    no graph, so load() runs it."""
    if art.op_plans is None:
        records = operator_records(art)
        # torch's own op libraries outside its start-up imports (PT2E's quantized_decomposed::*)
        compat.load_torch_own_libraries(q.partition("::")[0] for q, _, _, _ in records)
        art.op_plans = schema_drift.plan_ops(records, _where(art.path))
    return art.op_plans


def check(art: Artifact, *, verify: bool = False) -> Checked:
    """Decode the program and run every check of the untrusted file that comes before torch's
    deserializer: names and targets, op schemas (upgraded where they drifted), state against the
    signature, example inputs, guards. rebuild runs it, then torch's deserializer; the writer runs
    rebuild on every file before renaming it into place, so pt2b never writes what it would refuse
    to read."""
    where = _where(art.path)
    serialized = decode_graph(art)
    records = operator_records(art)
    recorded = frozenset(schema_drift.op_target(q, o) for q, o, _, kind in records
                         if kind in (G.OperatorKind.ATEN, G.OperatorKind.CUSTOM))
    untrusted.check_program(serialized, where, recorded)
    type_names = _resolve_pytree_types(art, serialized, where)
    # recorded op schemas vs the running torch: missing ops, compatible drift, upgraders
    serialized, art.upgrade_notes = schema_drift.upgrade_program(serialized, records, where, check_ops(art))
    names.rename_state_paths(serialized, names.safe_path)  # what generated code cannot hold, aliased
    tensors = load_tensors(art, verify=verify)
    tensors.update(subclasses.rebuild(art.program.tensorSubclasses, tensors, where))
    state_dict, constants = {}, {}
    for name, (kind, t, requires_grad) in tensors.items():
        if kind == G.TensorKind.PARAMETER:
            if requires_grad and not (t.is_floating_point() or t.is_complex()):
                raise CorruptArtifactError(f"{where}: parameter {name!r} of dtype {t.dtype} cannot require grad.")
            state_dict[name] = torch.nn.Parameter(t, requires_grad=requires_grad)
        elif kind == G.TensorKind.BUFFER:
            state_dict[name] = t
        elif kind == G.TensorKind.CONSTANT:
            constants[name] = t
    _check_state_matches_signature(serialized, state_dict, constants, where)
    _check_signature_names_inputs(serialized, where)
    example_inputs = _example_inputs(art, tensors)
    root = serialized.graph_module.module_call_graph[0].signature
    serialized.guards_code = untrusted.distinct_guards(serialized.guards_code)  # each checked, compiled, run once
    untrusted.check_guards(serialized.guards_code, example_inputs, list(root.forward_arg_names or []),
                           f"{where}: guards_code")
    return Checked(serialized, state_dict, constants, example_inputs, type_names)


def read_programs(path) -> dict[str, torch.export.ExportedProgram]:
    """Every method of the artifact at ``path``, through every check (the writer's check_readable); as load()'s,
    their graph modules generate their Python code on first use, not here (what the checks and torch's
    deserializer refuse does not depend on it: a caller that only reads the graphs never pays for it)."""
    from ..._torch.deferred_codegen import deferred
    from ...util.gc_pause import gc_paused

    with gc_paused(), deferred():
        art = open_artifact(path)
        return {name: rebuild(method(art, name)) for name in art.method_names}


def rebuild(art: Artifact, *, verify: bool = False) -> torch.export.ExportedProgram:
    """The ExportedProgram the artifact holds, weights mapped from the file."""
    return build(art, check(art, verify=verify))


def _unregistered_pytree_type(e: Exception, where: str) -> MissingPytreeTypeError | None:
    """The error to raise where torch's pytree could not find a serialized type name (``Deserializing
    NAME in pytree is not registered``: the program's inputs or outputs, or its stored example inputs,
    are a type no imported module registers), or None for any other error."""
    import re

    m = re.fullmatch(r"Deserializing (\S+) in pytree is not registered\.?", str(e).strip())
    if not (isinstance(e, NotImplementedError) and m):
        return None
    return _missing_pytree_type(m.group(1), where)


def _missing_pytree_type(name: str, where: str) -> MissingPytreeTypeError:
    return MissingPytreeTypeError(
        f"{where}: the program's inputs or outputs use the Python type {name[:200]!r}, which no imported "
        f"module registers with torch's pytree: {pytree_types.advice(name)}.")


def spec_texts(art: Artifact, serialized) -> list[tuple]:
    """The pytree specs of a method, each (treespec_dumps's JSON text, where in the file, what it is): the
    stored example inputs', and each module call signature's inputs and outputs."""
    out = [(text(art.program.exampleInputsSpec), "example inputs", "pytree spec")]
    for e in serialized.graph_module.module_call_graph:
        if e.signature is not None:
            out += [(getattr(e.signature, f), f"module_call_graph {e.fqn!r}", f) for f in ("in_spec", "out_spec")]
    return out


def _resolve_pytree_types(art: Artifact, serialized, where: str) -> frozenset[str]:
    """The type names the method's specs use, each registered or defined by a well-known library's installed
    output-type module (pytree_types), which is imported where the program is built (_register_types), not
    here: `pt2b verify` checks a file without importing the library. Any other type is a
    MissingPytreeTypeError now, as torch's deserializer would refuse it at the first use. The stored example
    inputs are built by ``check`` itself: their types are registered now."""
    example, *signature = spec_texts(art, serialized)
    example_names = pytree_types.named_types([example], where)
    pytree_types.register_from_libraries(example_names)
    names = example_names | pytree_types.named_types(signature, where)
    missing = pytree_types.unfindable(names)
    if missing:
        raise _missing_pytree_type(missing[0], where)
    return frozenset(names)


def _register_types(c: Checked, where: str) -> None:
    """Before torch's deserializer reads the program's specs: import the library modules that register the
    types ``check`` found (pytree_types.register_from_libraries); one still unregistered then (a library
    release whose module does not register it) is a MissingPytreeTypeError."""
    pytree_types.register_from_libraries(c.pytree_types)
    missing = pytree_types.unregistered(c.pytree_types)
    if missing:
        raise _missing_pytree_type(missing[0], where)


def build(art: Artifact, c: Checked) -> torch.export.ExportedProgram:
    """torch's deserializer on a program that passed ``check``: the fx graph, its fake tensors, the
    ExportedProgram (what load() defers to first use)."""
    from . import deserialize  # (torch.export's serializer imports torch._dynamo: not for inspect or check)

    where = _where(art.path)
    _register_types(c, where)
    ep = _by_torchs_deserializer(lambda: deserialize.deserialize_program(
        c.serialized, c.state_dict, c.constants, c.example_inputs), where)
    _check_inputs_match_placeholders(ep, where)
    _restore_unused_ranges(ep, c.serialized)
    _state_values_as_stored(ep)
    if module_stacks.PROVENANCE_KEY in read_provenance(art):
        module_stacks.unescape(ep)
    return ep


def build_for_call(art: Artifact, c: Checked):
    """The program's lifted graph module and what a direct call binds it by (deserialize.CallableGraph), from
    a program that passed ``check``: torch's deserializer without fake values, metadata or the
    ExportedProgram (a loaded program's first call; ``build`` makes the ExportedProgram when asked)."""
    from . import deserialize

    where = _where(art.path)
    _register_types(c, where)
    graph = _by_torchs_deserializer(lambda: deserialize.deserialize_for_call(c.serialized, c.state_dict, c.constants),
                                    where)
    _check_inputs_match_placeholders(graph, where)
    return graph


def _by_torchs_deserializer(run, where: str):
    """``run()`` (torch's deserializer, one at a time: it holds process-wide state), its failures typed."""
    try:
        with _DESERIALIZE_LOCK:
            return run()
    except ArtifactError:
        raise
    except Exception as e:
        missing = _unregistered_pytree_type(e, where)
        if missing is not None:
            raise missing from None
        # not chained: the message holds torch's, escaped (errors.py); a chained cause would be printed raw
        raise CorruptArtifactError(
            f"{where}: the program could not be rebuilt by torch ({type(e).__name__}: {e})."
        ) from None


def _argument_name(arg) -> str:
    """The value name a serialized input argument binds ('' for a constant)."""
    kind, value = str(arg.type), arg.value
    if kind in ("as_tensor", "as_custom_obj"):
        return value.name
    if kind in ("as_sym_int", "as_sym_float", "as_sym_bool"):
        return value.as_name if str(value.type) == "as_name" else ""
    return ""


def _spec_name(spec) -> str:
    v = spec.value
    if spec.type == "user_input":
        return _argument_name(v.arg)
    if spec.type == "constant_input":
        return v.name
    return getattr(v.arg, "name", "")


def _check_signature_names_inputs(serialized: S.ExportedProgram, where: str) -> None:
    """Before torch's deserializer (load checks it; the placeholders built on first use are checked
    again then): every graph input that binds a value is the one its input spec names."""
    gm = serialized.graph_module
    named = [_spec_name(s) for s in gm.signature.input_specs]
    inputs = [_argument_name(a) for a in gm.graph.inputs]
    for i, (spec, value) in enumerate(zip(named, inputs)):
        if value and spec != value:
            raise CorruptArtifactError(
                f"{where}: the graph signature's input {i} names {spec!r} but the graph's placeholder {i} is "
                f"{value!r} ({len(named)} input specs, {len(inputs)} graph inputs); the file is damaged.")
    if len(named) != len(inputs):
        raise CorruptArtifactError(f"{where}: the graph signature has {len(named)} input specs for "
                                   f"{len(inputs)} graph inputs; the file is damaged.")


def _check_inputs_match_placeholders(ep, where: str) -> None:
    """The signature names the graph's placeholders, one input spec each, in order (torch's verifier
    counts them only; a runtime binding inputs by these names would otherwise fail mid-setup)."""
    placeholders = [n.name for n in ep.graph.nodes if n.op == "placeholder"]
    named = [getattr(s.arg, "name", None) for s in ep.graph_signature.input_specs]
    if named != placeholders:
        bad = next((i for i, (a, b) in enumerate(zip(named, placeholders)) if a != b), min(len(named), len(placeholders)))
        raise CorruptArtifactError(
            f"{where}: the graph signature's input {bad} names {named[bad] if bad < len(named) else 'nothing'!r} but "
            f"the graph's placeholder {bad} is {placeholders[bad] if bad < len(placeholders) else 'missing'!r} "
            f"({len(named)} input specs, {len(placeholders)} placeholders); the file is damaged.")


def _check_state_matches_signature(serialized: S.ExportedProgram, state_dict, constants, where: str) -> None:
    """Every parameter/buffer/constant the signature names is stored, in the right place."""
    for spec in serialized.graph_module.signature.input_specs:
        v = spec.value
        if spec.type == "parameter" or (spec.type == "buffer" and v.persistent):
            name, home, label = getattr(v, "parameter_name", None) or v.buffer_name, state_dict, "state_dict"
        elif spec.type in ("buffer", "tensor_constant"):
            name = getattr(v, "buffer_name", None) or v.tensor_constant_name
            home, label = constants, "constants"
        else:
            continue
        if name not in home and not (spec.type == "buffer" and name in state_dict):
            raise CorruptArtifactError(
                f"{where}: the graph signature needs {spec.type} {name!r} but the artifact stores no such "
                f"tensor in its {label}.")


def _state_values_as_stored(ep) -> None:
    """A buffer or tensor constant is read back without requires_grad (the format records it for
    parameters only), and its placeholder's value says so too. A model called eagerly before its
    export can hold a buffer that requires grad (an in-place write of a value computed from its
    parameters: a static KV cache filled outside no_grad); torch.export records that in the
    placeholder's value, and a backend that retraces the program refuses to write the mutation back
    into it ("a leaf Variable that requires grad is being used in an in-place operation":
    ExecuTorch's to_executorch, on torch's own program too)."""
    from torch.export.graph_signature import InputKind

    placeholders = {n.name: n for n in ep.graph.nodes if n.op == "placeholder"}
    for spec in ep.graph_signature.input_specs:
        node = placeholders.get(spec.arg.name) if spec.kind in (InputKind.BUFFER, InputKind.CONSTANT_TENSOR) else None
        val = node.meta.get("val") if node is not None else None
        if isinstance(val, torch.Tensor) and val.requires_grad and getattr(val, "fake_mode", None) is not None:
            with val.fake_mode:
                node.meta["val"] = val.detach()


def _restore_unused_ranges(ep, serialized: S.ExportedProgram) -> None:
    """torch's deserializer drops the ranges of symbols no graph node mentions; keep them."""
    import sympy  # (here, not at import: `pt2b verify` of a static program never pays for importing sympy)

    from ..._torch.symbolic import ValueRanges, int_oo

    have = {str(k) for k in ep.range_constraints}
    for name, rc in serialized.range_constraints.items():
        if name not in have:
            lo = -int_oo if rc.min_val is None else sympy.Integer(rc.min_val)
            hi = int_oo if rc.max_val is None else sympy.Integer(rc.max_val)
            ep.range_constraints[sympy.Symbol(name, integer=True)] = ValueRanges(lo, hi)


def read_provenance(art: Artifact) -> dict[str, str]:
    """The artifact's provenance entries (who captured it, upgrades applied, the user's Dim names)."""
    return {text(e.key): text(e.value) for e in art.program.provenance or []}


def read_metadata(art: Artifact) -> dict:
    raw = art.program.metadata
    if raw is None or len(raw) == 0:
        return {}
    try:
        value = msgpack.unpackb(bytes(raw), strict_map_key=True)
    except Exception as e:
        raise CorruptArtifactError(f"{_where(art.path)}: metadata is malformed ({e}).") from None
    if not isinstance(value, dict):
        raise CorruptArtifactError(f"{_where(art.path)}: metadata is not a map.")
    nesting.check_value(value, untrusted.MAX_DATA_DEPTH, _where(art.path), "metadata")
    return value
