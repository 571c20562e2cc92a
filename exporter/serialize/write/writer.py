"""ExportedProgram -> .pt2b file (header, weight segments, FlatBuffers program), atomically."""

from __future__ import annotations

import concurrent.futures
import dataclasses
import os
import threading
import typing
import zlib

import msgpack
import numpy as np
import torch

from ..._torch.dispatch import FakeTensor
from ..._torch.pytree import pytree
from ..._torch.serde import schema as S
from ..._torch.serializer import ExportedProgramSerializer
from ...version import __version__
from ...capture import Unused
from ... import names
from ...errors import ArtifactError, ExportError, UnsupportedValueError
from ...versioning import majors, op_table
from ...versioning.formats import FIELDS_ADDED, FORMAT_VERSION, version_str
from ...util.atomic import atomic_path, check_destination
from ...util.gc_pause import gc_paused
from ...util import nesting
from ...layout.generated import pt2b_generated as G
from ...layout.container import ALIGNMENT, FILE_IDENTIFIER, HEADER_SIZE, Header, align
from ..mapping import module_stacks, return_types
from ..read import untrusted
from . import direct, encode_schema, serde_repairs, subclasses, weights
from .builder import Builder

MAX_METADATA_BYTES = 16 << 20
_SCALAR_LEAVES = (bool, int, float, str, type(None))


return_types.register()  # torch.return_types (sort, topk, ...) in pytree specs: named, to write and read


def _refuse_tensor_subclasses(ep) -> None:
    """A weight or constant .pt2b cannot store: a fake tensor (no values), or a tensor subclass whose
    class (or a class nested in it) is not registered with exporter.register_tensor_subclass or lacks
    torch's flatten protocol. An UnsupportedValueError naming it and what to do, before any byte is
    written."""
    for name, value in (*ep.state_dict.items(), *ep.constants.items()):
        if isinstance(value, FakeTensor):
            raise UnsupportedValueError(
                f"{name!r} is a fake tensor: the program was exported under a FakeTensorMode, and its weights have "
                f"shapes and dtypes but no values, while a .pt2b stores weight values. Export the module with "
                f"its real weights (outside FakeTensorMode); to ship a program whose weights are filled in "
                f"later, export it with real placeholder weights (torch.zeros) and load_state_dict the real ones "
                f"into its module().")
        why = subclasses.unstorable(name, value) if subclasses.is_subclass(value) else None
        if why is not None:
            raise UnsupportedValueError(
                f"{why} Alternatively give export_model the module itself rather than its ExportedProgram: it "
                f"unwraps subclass weights into their plain inner tensors before capture, and the program "
                f"computes the subclass's arithmetic with ATen ops.")


def _refuse_python_calls(ep) -> None:
    """A call of torch.ops.higher_order.flat_apply runs a Python function the graph names by object (a
    tensor subclass built inside the program, such as unwrapped subclass weights whose constructor torch
    cannot trace through): an UnsupportedValueError naming the node, before any byte is written."""
    from ...graph_walk import iter_graphs

    flat_apply = getattr(torch.ops.higher_order, "flat_apply", None)
    if flat_apply is None:  # a torch release without it records no such call
        return
    for graph in iter_graphs(ep.graph_module):
        for node in graph.nodes:
            if node.op == "call_function" and node.target is flat_apply:
                raise UnsupportedValueError(
                    f"node {node.name!r} calls a Python function through torch.ops.higher_order.flat_apply "
                    f"(here: {node.args[1].name if len(node.args) > 1 and hasattr(node.args[1], 'name') else '?'}), "
                    f"which is how torch.export records a tensor subclass built inside the program whose "
                    f"constructor it cannot trace: .pt2b stores operators, never Python callables. Keep such "
                    f"weights as plain tensors, or use a subclass whose construction torch traces (torchao's do).")


def serialize_graph(ep: torch.export.ExportedProgram):
    """torch's own export schema for the program, without any pickled payload (the writer has refused
    tensor-subclass weights and Python calls before: _method_tensors)."""
    for name, value in ep.constants.items():
        if not isinstance(value, torch.Tensor):
            raise UnsupportedValueError(
                f"constant {name!r} is a {type(value).__name__} (a torchbind/script object); "
                f".pt2b stores only tensors and never pickles. Make it a tensor or a buffer."
            )
    try:
        serialized = _serialize_program(ep)
    except ExportError:
        raise
    except Exception as e:
        raise ExportError(f"torch's export serializer rejected the program: {type(e).__name__}: {e}") from e
    names.rename_state_paths(serialized, names.original_path)  # a loaded program's aliases, written back
    serde_repairs.repair(serialized)  # what torch's deserializer could not read back
    return serialized


def _serialize_program(ep) -> S.ExportedProgram:
    """What ExportedProgramSerializer().serialize(ep).exported_program holds, built from the same
    torch pieces, without its self-test: serialize() canonicalizes a deep copy of the result only to
    check that a canonical form exists and throws it away, a large share of a save."""
    from ..._torch.serializer import (SCHEMA_VERSION, GraphModuleSerializer, fast_unions, serialize_range_constraints,
                                      unprinted)

    ep.validate()
    gm_serializer = GraphModuleSerializer(ep.graph_signature, ep.module_call_graph)
    with unprinted(ep.graph_module), fast_unions():
        graph_module = gm_serializer.serialize(ep.graph_module)
    if gm_serializer.custom_objs:
        name = next(iter(gm_serializer.custom_objs))
        raise UnsupportedValueError(f"the program holds the script object {name!r} (torchbind); .pt2b stores only "
                                    f"tensors and never pickles.")
    return S.ExportedProgram(
        graph_module=graph_module,
        opset_version=ExportedProgramSerializer().opset_version,
        range_constraints=serialize_range_constraints(ep.range_constraints),
        schema_version=S.SchemaVersion(major=SCHEMA_VERSION[0], minor=SCHEMA_VERSION[1]),
        verifiers=[v.dialect for v in ep.verifiers],
        torch_version=torch.__version__,
        guards_code=untrusted.distinct_guards(ep._guards_code),  # torch repeats a guard per use (olmo_hybrid, 4 layers: 1,317, 470 distinct)
    )


def collect_tensors(ep, leave_out=()) -> tuple[list[tuple[str, int, torch.Tensor]], list]:
    """(every tensor to store as (name, kind, tensor), but those named in ``leave_out``; the TensorSubclass
    records): a tensor-subclass weight is stored as its inner tensors (subclasses.flatten)."""
    params = set(ep.graph_signature.parameters)
    out, records = [], []
    entries = [(name, G.TensorKind.PARAMETER if name in params else G.TensorKind.BUFFER, t)
               for name, t in ep.state_dict.items() if name not in leave_out]
    entries += [(name, G.TensorKind.CONSTANT, t) for name, t in ep.constants.items() if name not in leave_out]
    for name, kind, t in entries:
        if subclasses.is_subclass(t):
            subclasses.flatten(names.original_path(name), kind, t, out, records)
        else:
            out.append((names.original_path(name), kind, t))
    subclasses.check_names(out, records)
    return out, records


def example_inputs_payload(ep) -> tuple[str, bytes, list]:
    """(treespec json, msgpack leaves, tensors) for ep.example_inputs, or empty if unstorable."""
    if ep.example_inputs is None:
        return "", b"", []
    leaves, spec = pytree.tree_flatten(ep.example_inputs)
    if not all(isinstance(x, _SCALAR_LEAVES) or (isinstance(x, torch.Tensor) and not subclasses.is_subclass(x))
               for x in leaves):
        return "", b"", []
    try:
        spec_str = pytree.treespec_dumps(spec)
    except Exception:
        return "", b"", []
    tensors, encoded = [], []
    for x in leaves:
        if isinstance(x, torch.Tensor):
            encoded.append({"t": len(tensors)})
            tensors.append((f"example_inputs.{len(tensors)}", G.TensorKind.EXAMPLE_INPUT, x))
        else:
            encoded.append({"v": x})
    return spec_str, msgpack.packb(encoded), tensors


def pack_metadata(metadata) -> bytes:
    if metadata is None:
        return b""
    if not isinstance(metadata, dict) or not all(isinstance(k, str) for k in metadata):
        raise ExportError("metadata must be a dict with str keys (values: str, numbers, bools, lists, dicts).")
    try:
        raw = msgpack.packb(metadata, strict_types=False)
    except (TypeError, ValueError, OverflowError) as e:
        raise ExportError(f"metadata cannot be stored: {e}. Use str, numbers, bools, None, lists and dicts.") from None
    if len(raw) > MAX_METADATA_BYTES:
        raise ExportError(f"metadata is {len(raw)} bytes; the limit is {MAX_METADATA_BYTES}.")
    if nesting.deeper_than(metadata, untrusted.MAX_DATA_DEPTH):  # what the reader refuses
        raise ExportError(f"metadata nests more than {untrusted.MAX_DATA_DEPTH} levels deep, more than pt2b reads.")
    return raw


def _string_entries(d: dict[str, str]) -> list:
    out = []
    for k, v in d.items():
        e = G.StringEntryT()
        e.key, e.value = k, v
        out.append(e)
    return out


@dataclasses.dataclass
class MethodSource:
    """One entry point to write: its name, program, IR level and (for a lowered one) lowering record."""

    name: str
    ep: torch.export.ExportedProgram
    ir_level: str
    lowering: dict | None = None
    unused: Unused = Unused()  # the weights ``ep`` never reads, left out of the program written


def write_artifact(ep, path, *, ir_level: str, metadata=None, provenance=None, version=None,
                   lowering: dict | None = None, target_torch: str | None = None,
                   methods: list[MethodSource] | None = None, check_written=None,
                   read_back: dict | None = None) -> str:
    """Write ``ep`` to ``path`` in format ``version`` (default: current); returns the path written.

    ``lowering`` (format 1.1+): {"request", "fingerprint", "torch_version", "outside_opset": {op: n}}
    for a program written after load_for_backend. An older minor of the same major is written by
    leaving out the fields added since (formats.FIELDS_ADDED); a program that uses one is refused.
    ``target_torch``: write the op schemas of that torch release (versioning/retarget.py).
    ``methods`` (format 1.2+, instead of ``ep``/``ir_level``/``lowering``): several entry points, the
    first the default; one weight segment per distinct storage across all of them.
    ``check_written(plan)``: called with the weights.WeightPlan (each segment's storage, checksum and
    digest) once the file is written and read back, before it is renamed into place; what it raises
    leaves no file. ``read_back``: a dict filled with the programs the check read back from the file (method
    name -> ExportedProgram, weights mapped from the file written).
    """
    if methods is None:
        methods = [MethodSource(names.DEFAULT_METHOD, ep, ir_level, lowering)]
    with gc_paused():
        return _write_artifact(methods, path, metadata=metadata, provenance=provenance, version=version,
                               target_torch=target_torch, check_written=check_written, read_back=read_back)


def check_method_names(names_: list[str]) -> None:
    """Method names are distinct Python identifiers (they name attributes, CLI choices, cache keys)."""
    if not names_:
        raise ExportError("an artifact needs at least one method.")
    why = names.method_names_problem(names_)
    if why is not None:
        raise ExportError(f"{why}; name each method its own identifier, like 'prefill', 'decode', 'encode'.")


@dataclasses.dataclass
class _Parts:
    """What one method contributes to the Program table."""

    serialized: object
    operators: list
    spec: str
    leaves: bytes
    tensors: list  # (name, kind, tensor)
    subclasses: list  # G.TensorSubclassT


class _Stored(typing.NamedTuple):
    """What one method's weight segments need, known before its graph is serialized."""

    spec: str  # the example inputs' treespec
    leaves: bytes  # their msgpack leaves
    tensors: list  # every tensor to store: (name, kind, tensor)
    subclasses: list  # the TensorSubclass records of its subclass weights


def _method_tensors(m: MethodSource) -> _Stored:
    """One method's _Stored, after the checks that refuse a value .pt2b cannot store as a tensor (a
    tensor subclass, a Python function called through flat_apply)."""
    _refuse_tensor_subclasses(m.ep)
    _refuse_python_calls(m.ep)
    spec_str, leaves_bytes, example_tensors = example_inputs_payload(m.ep)
    tensors, subclass_records = collect_tensors(m.ep, leave_out=m.unused.targets)
    return _Stored(spec_str, leaves_bytes, tensors + example_tensors, subclass_records)


def _method_parts(m: MethodSource, force_escape: bool, target_torch, provenance: dict, stored: _Stored) -> _Parts:
    with module_stacks.escaped(m.ep, force=force_escape):  # module names torch's metadata format cannot split
        serialized = serialize_graph(m.ep)
    if m.unused.inputs:
        _leave_out_inputs(serialized, m.unused.inputs)
    operators = op_table.collect(m.ep.graph_module)
    if target_torch is not None:  # another release's op schemas (versioning/retarget.py)
        from ...versioning import retarget

        serialized, operators, notes = retarget.retarget(serialized, operators, target_torch)
        provenance["target_torch"] = retarget.registry_for(target_torch).torch_version
        provenance.update({f"retargeted_op:{op}": what for op, _, what in (n.partition(": ") for n in notes)})
    return _Parts(serialized, operators, *stored)


def _leave_out_inputs(serialized, unused: frozenset[str]) -> None:
    """Torch's serialized program without the placeholders named ``unused`` (weights the graph never reads,
    capture.unused_weights): their graph inputs, input specs and tensor values."""
    graph = serialized.graph_module.graph
    graph.inputs = [a for a in graph.inputs if not (a.type == "as_tensor" and a.as_tensor.name in unused)]
    for name in unused:
        graph.tensor_values.pop(name, None)
    signature = serialized.graph_module.signature  # (a placeholder's name is its program's own: one spec each)
    signature.input_specs = [s for s in signature.input_specs
                             if not (isinstance(s.value.arg, S.TensorArgument) and s.value.arg.name in unused)]


def _lowering_table(lowering: dict):
    low = G.LoweringT()
    low.request = str(lowering["request"])
    low.fingerprint = str(lowering.get("fingerprint") or "")
    low.torchVersion = str(lowering.get("torch_version") or torch.__version__)
    low.outsideOpset = _string_entries({k: str(v) for k, v in (lowering.get("outside_opset") or {}).items()})
    return low


def _fill(table, m: MethodSource, parts: _Parts, records: list) -> None:
    """The fields a Program table (for the default method) and a Method table share."""
    table.irLevel = m.ir_level
    table.exportedProgram = encode_schema.Packed(parts.serialized)  # packed in place by Pack, no object-API tree
    table.tensors = records
    table.operators = parts.operators
    table.exampleInputsSpec = parts.spec
    table.exampleInputsLeaves = np.frombuffer(parts.leaves, dtype=np.uint8)
    if m.lowering is not None:
        table.lowering = _lowering_table(m.lowering)
    if parts.subclasses:
        table.tensorSubclasses = parts.subclasses


def _write_artifact(methods: list[MethodSource], path, *, metadata, provenance, version, target_torch=None,
                    check_written=None, read_back=None) -> str:
    version = FORMAT_VERSION if version is None else tuple(version)
    if not majors.writable(version):
        raise ExportError(f"writing format {version_str(version)} is not supported by this pt2b "
                          f"(it writes {FORMAT_VERSION[0]}.0 to {version_str(FORMAT_VERSION)}).")
    check_method_names([m.name for m in methods])
    stored = [_method_tensors(m) for m in methods]
    used = {"lowering": any(m.lowering is not None for m in methods), "methods": len(methods) > 1,
            "default_method": methods[0].name != names.DEFAULT_METHOD,
            "tensor_subclasses": any(st.subclasses for st in stored)}
    missing = [(v, field, what) for v, fields in sorted(FIELDS_ADDED.items()) if v > version
               for field, what in fields.items() if used.get(field)]
    if missing:
        detail = "; ".join(f"Program.{field} ({what}, added in {version_str(v)})" for v, field, what in missing)
        raise ExportError(
            f"format {version_str(version)} cannot hold this program: {detail}. Write format "
            f"{version_str(missing[-1][0])} or later, or write the program without it (for a lowered "
            f"program: export_model(lowered.exported_program(), path=...) drops the lowering record; for "
            f"several methods: one artifact per method).")
    dest = check_destination(path)
    provenance = dict(provenance or {})
    escape = any(module_stacks.needs_escape(m.ep) for m in methods)
    if escape:
        provenance[module_stacks.PROVENANCE_KEY] = module_stacks.PROVENANCE_VALUE
    meta_bytes = pack_metadata(metadata)
    # one segment per distinct storage across all methods: shared weights and state are stored once
    wp = weights.plan([t for st in stored for t in st.tensors], ALIGNMENT)
    records, at = [], 0
    for st in stored:
        records.append(wp.records[at:at + len(st.tensors)])
        at += len(st.tensors)

    data_offset = align(HEADER_SIZE)
    digests = tuple(version) >= DIGESTS_SINCE
    with atomic_path(dest) as tmp:
        # the weights go out on a thread while this one serializes the graphs (the copy, the hashes and
        # the syncs release the GIL); the disk syncs on another: the weights' bytes as they are written
        # and while their checksums are computed, the rest while the file is read back; all before the
        # rename
        with open(tmp, "wb") as f, \
                concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="pt2b-fsync") as pool, \
                concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="pt2b-weights") as out:
            syncs, stop = [], threading.Event()

            def sync_weights():
                f.flush()
                syncs.append(pool.submit(_DATASYNC, f.fileno()))

            unsynced = [0]

            def go_on(nbytes):  # after each piece of the weights
                if stop.is_set():  # the program cannot be written: no more weights either
                    raise _Stopped()

            def sync_behind(nbytes):  # big weights: a sync of what is written so far, one at a time
                go_on(nbytes)
                unsynced[0] += nbytes
                if unsynced[0] >= SYNC_BEHIND and (not syncs or syncs[-1].done()):
                    unsynced[0] = 0
                    sync_weights()

            def write_weights():
                fd = direct.open_direct(tmp, data_offset + wp.data_size)
                if fd is None:  # through the page cache
                    f.write(b"\0" * data_offset)
                    weights.write_segments(f, wp, data_offset, digests=digests, written=sync_weights,
                                           progress=sync_behind)
                    return
                sink = direct.DirectSink(fd)  # around it: the file from offset 0 to the data's end

                def written():
                    f.seek(sink.close())  # the program table follows, through f
                    sync_weights()

                try:
                    sink.write(b"\0" * data_offset)
                    weights.write_segments(sink, wp, data_offset, digests=digests, written=written, progress=go_on)
                finally:
                    sink.abandon()

            written = out.submit(write_weights)
            try:
                parts = [_method_parts(m, escape, target_torch, provenance, st) for m, st in zip(methods, stored)]
                prog = _program(methods, parts, records, meta_bytes, provenance, used)
                builder = Builder(1 << 16)
                for table in [prog] + list(prog.methods or []):  # the graphs, while the weights go out
                    _pack_text(lambda: table.exportedProgram.pack_early(builder))
                written.result()
                _write_program(f, prog, builder, wp, data_offset, version, digests, dest)
                f.flush()
                syncs.append(pool.submit(os.fsync, f.fileno()))
                programs = check_readable(tmp, dest)
                if read_back is not None:
                    read_back.update(programs)
                if check_written is not None:
                    check_written(wp)
            except BaseException:
                stop.set()
                raise
            finally:
                concurrent.futures.wait([written])  # (its error, where it failed first, was raised above)
                for synced in syncs:
                    synced.result()
    return dest


class _Stopped(Exception):
    """The weights' write given up: the program failed to serialize."""


def _program(methods: list[MethodSource], parts: list[_Parts], records: list, meta_bytes: bytes,
             provenance: dict, used: dict):
    """The Program table's object tree (its segments and digests are added once the weights are written)."""
    prog = G.ProgramT()
    prog.producer = f"pt2b {__version__}"
    prog.torchVersion = torch.__version__
    _fill(prog, methods[0], parts[0], records[0])
    prog.checksumKind = G.ChecksumKind.CRC32
    prog.metadata = np.frombuffer(meta_bytes, dtype=np.uint8)
    prog.provenance = _string_entries(provenance)
    if used["default_method"] or used["methods"]:  # a single "forward" artifact stays what 1.1 wrote
        prog.defaultMethod = methods[0].name
    if used["methods"]:
        prog.methods = []
        for m, p, recs in zip(methods[1:], parts[1:], records[1:]):
            t = G.MethodT()
            t.name = m.name
            _fill(t, m, p, recs)
            prog.methods.append(t)
    return prog


_DATASYNC = direct.DATASYNC
SYNC_BEHIND = 256 << 20  # weights written since the last sync that start the next one


def check_readable(tmp: str, dest: str) -> dict[str, torch.export.ExportedProgram]:
    """Load the file written at ``tmp`` as `load` would (every check, then torch's deserializer)
    before it is renamed to ``dest``: a program pt2b would refuse or fail to load is an
    ExportError now, never a file. Returns the programs read."""
    from ..read import reader

    try:
        return reader.read_programs(tmp)
    except ArtifactError as e:
        why = str(e).replace(tmp, dest)
        raise ExportError(f"pt2b would refuse to load what it was about to write, so {dest!r} was not written: "
                          f"{type(e).__name__}: {why}") from e


DIGESTS_SINCE = next(v for v, fields in FIELDS_ADDED.items() if "weight_digests" in fields)  # (1, 3)


def _pack_text(pack):
    """Run ``pack`` (a FlatBuffers packing): text that is not valid Unicode is an ExportError."""
    try:
        return pack()
    except UnicodeEncodeError as e:
        bad = e.object[max(0, e.start - 40): e.end + 40]
        raise ExportError(f"the program holds text that is not valid Unicode ({bad!r}: {e.reason}), e.g. a "
                          f"module or argument name with a lone surrogate; .pt2b stores text as UTF-8. "
                          f"Rename it.") from None


def _write_program(f, prog, builder, wp, data_offset: int, version, digests: bool, dest: str) -> None:
    """The packed program table (into ``builder``, which may hold its graphs already) after the weight
    segments (written, their checksums in ``wp``, and with ``digests`` their sha256), then the header at
    the file's start."""
    segs = []
    for s in wp.segments:
        t = G.SegmentT()
        t.offset, t.nbytes, t.checksum = s.offset, s.nbytes, s.checksum
        segs.append(t)
    prog.segments = segs
    if digests:
        prog.weightDigests = np.frombuffer(b"".join(s.digest for s in wp.segments), dtype=np.uint8)
    _pack_text(lambda: builder.Finish(prog.Pack(builder), file_identifier=FILE_IDENTIFIER))
    program = builder.Output()
    program_offset = align(data_offset + wp.data_size, 8)
    same_major = version[0] == FORMAT_VERSION[0]
    header = Header(*(version if same_major else FORMAT_VERSION), data_offset, wp.data_size,
                    program_offset, len(program), zlib.crc32(program))
    if not same_major:  # an older major: the writer steps of versioning/majors.py rewrite both
        raw = majors.downgrade(majors.RawProgram(FORMAT_VERSION, header, bytes(program)), version, dest)
        header, program = raw.header, raw.program
    f.write(b"\0" * (program_offset - data_offset - wp.data_size))
    f.write(program)
    f.seek(0)
    f.write(header.pack())
