"""The public entry points: export_model and load."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any, Union

import torch

from . import capture as _capture
from . import dims
from .errors import ArtifactError, ExportError
from .program import OperatorInfo, Pt2bProgram
from .serialize import reader, writer
from .util.gc_pause import gc_paused
from .util.process_state import preserved
from .lowering.deferred_codegen import deferred
from .serialize.generated import pt2b_generated as G
from .versioning.formats import parse_version

if TYPE_CHECKING:
    from .lowering.lowered import LoweredProgram
    from .ops import OpSpec

StrPath = Union[str, "os.PathLike[str]"]

_KIND_NAMES = {v: k.lower() for k, v in vars(G.OperatorKind).items() if not k.startswith("_")}


def export_model(m: torch.nn.Module | Callable[..., Any] | torch.export.ExportedProgram | LoweredProgram
                 | Mapping[str, Any],
                 args: tuple[Any, ...] | StrPath | None = None, path: StrPath | None = None, *,
                 kwargs: dict[str, Any] | None = None,
                 dynamic_shapes: dict[str, Any] | tuple[Any, ...] | list[Any] | None = None,
                 metadata: dict[str, Any] | None = None, strict: bool = False,
                 format_version: str | None = None, target_torch: str | None = None,
                 keep_unused_weights: bool = False
                 ) -> torch.export.ExportedProgram | dict[str, torch.export.ExportedProgram]:
    """Capture ``m`` with torch.export (undecomposed, unfunctionalized) and write ``path``.

    ``m`` may also be an ExportedProgram: it is written as given and its IR level recorded
    (``export_model(ep, path=...)`` or ``export_model(ep, None, path)``); so may a LoweredProgram,
    written with the record of how it was lowered (format 1.1+).
    ``m`` may be a dict of methods (format 1.2+): ``export_model({"prefill": (model, args, kwargs),
    "decode": (model, args2)}, "m.pt2b")``, each value a module or a bound method of one
    (``model.encode``) with its example args (and kwargs), or an ExportedProgram or LoweredProgram;
    ``dynamic_shapes`` is then a dict by method name. The first method is the default one. Capture
    the methods from one model object: a storage that several methods use (their weights, a KV
    cache buffer) is written once. Returns a dict of the ExportedPrograms written.
    ``format_version="X.Y"`` writes that released format version (default: the current one).
    ``target_torch="2.11"`` writes the op schemas of that torch release, so that it loads the artifact
    as its own: arguments it lacks are dropped where they hold their defaults, renamed and removed ops
    are rewritten; what it cannot express is a TargetTorchError naming each op, argument and dtype.
    Parameters, buffers and constants the program never reads (the fp32 originals a PT2E
    quantization leaves) are not stored, and the program written has no such input; their names are
    in the provenance (``unused_weights_dropped``). ``keep_unused_weights=True`` stores them.
    Tensor-subclass weights of a module (torchao's quantized weights) are unwrapped into their plain
    inner tensors before capture.
    Returns the ExportedProgram that was written.
    """
    version = None
    if format_version is not None:
        try:
            version = parse_version(format_version)
        except ValueError as e:
            raise ExportError(str(e)) from None
    if isinstance(m, Mapping):
        if path is None and isinstance(args, (str, os.PathLike)):
            args, path = None, args
        if args is not None or kwargs is not None:
            raise ExportError("with a dict of methods, give each method's example inputs in its entry: "
                              "{'decode': (model, args, kwargs)}; do not pass args or kwargs.")
        if path is None:
            raise ExportError("export_model needs a destination path, e.g. export_model(methods, 'model.pt2b').")
        methods, provenance = _methods(m, dynamic_shapes, strict, keep_unused_weights)
        writer.write_artifact(None, path, ir_level="", metadata=metadata, provenance=provenance, version=version,
                              target_torch=target_torch, methods=methods)
        return {x.name: x.ep for x in methods}
    ep, ir_level, lowering, provenance = _one_method(m, args, kwargs, dynamic_shapes, strict, path,
                                                     keep_unused_weights=keep_unused_weights)
    if path is None and isinstance(args, (str, os.PathLike)):
        path = args
    if path is None:
        raise ExportError("export_model needs a destination path, e.g. export_model(ep, path='model.pt2b').")
    writer.write_artifact(ep, path, ir_level=ir_level, metadata=metadata, provenance=provenance, version=version,
                          lowering=lowering, target_torch=target_torch)
    return ep


def _one_method(m, args, kwargs, dynamic_shapes, strict, path, method: str | None = None, *,
                keep_unused_weights: bool = False):
    """(ep, ir level, lowering record, provenance) of what export_model writes for one method: without
    the weights it never reads unless ``keep_unused_weights``."""
    ep, ir_level, lowering, provenance = _given(m, args, kwargs, dynamic_shapes, strict, path, method)
    if not keep_unused_weights:
        ep, dropped = _capture.without_unused_weights(ep)
        if dropped:
            key = f"unused_weights_dropped:{method}" if method else "unused_weights_dropped"
            provenance[key] = ", ".join(dropped)
    return ep, ir_level, lowering, provenance


def _given(m, args, kwargs, dynamic_shapes, strict, path, method: str | None):
    """(ep, ir level, lowering record, provenance) of what export_model was given for one method."""
    from .lowering.lowered import LoweredProgram

    if isinstance(m, (torch.export.ExportedProgram, LoweredProgram)):
        if path is None and isinstance(args, (str, os.PathLike)):
            args = None
        if args is not None or kwargs is not None or dynamic_shapes is not None:
            what = "a lowered program is written as lowered" if isinstance(m, LoweredProgram) else \
                "an ExportedProgram is written as captured"
            raise ExportError(f"{what}: do not pass args, kwargs or dynamic_shapes.")
        if isinstance(m, LoweredProgram):  # written with the record of how it was lowered (format 1.1+)
            return (m.exported_program(), f"lowered:{m.preset}", m.lowering_record(),
                    {"lowered_by": f"pt2b load_for_backend ({m.preset})",
                     **dims.provenance_entries(m.dim_names, method)})
        return m, _capture.ir_level_of(m), None, {"captured_by": "user (ExportedProgram given to export_model)",
                                                  **dims.provenance_entries(dims.names_at_capture(m), method)}
    if path is None:
        raise ExportError("export_model needs a destination path, e.g. export_model(model, (x,), 'model.pt2b').")
    unwrapped = _capture.subclass_weights(m) if isinstance(m, torch.nn.Module) else {}
    ep = _capture.capture(m, args, kwargs, dynamic_shapes=dynamic_shapes, strict=strict)
    provenance = {"captured_by": f"pt2b torch.export.export(strict={strict})",
                  **dims.provenance_entries(dims.names_at_capture(ep), method)}
    if unwrapped:
        provenance["subclass_weights_unwrapped"] = _capture.describe_subclass_weights(unwrapped)
    return ep, _capture.ir_level_of(ep), None, provenance


def _methods(spec: Mapping[str, Any], dynamic_shapes, strict: bool,
             keep_unused_weights: bool) -> tuple[list, dict[str, str]]:
    """The MethodSources of a dict of methods, captured in order, and their provenance."""
    from .lowering.lowered import LoweredProgram

    writer.check_method_names(list(spec))
    if dynamic_shapes is not None and (not isinstance(dynamic_shapes, Mapping) or set(dynamic_shapes) - set(spec)):
        raise ExportError(f"with a dict of methods, dynamic_shapes is a dict by method name ({', '.join(spec)}); "
                          f"got {dynamic_shapes!r:.200}.")
    methods, provenance = [], {}
    for name, entry in spec.items():
        if isinstance(entry, (torch.export.ExportedProgram, LoweredProgram)):
            if dynamic_shapes and name in dynamic_shapes:
                raise ExportError(f"method {name!r} is given as a program: do not pass dynamic_shapes for it.")
            ep, ir_level, lowering, prov = _one_method(entry, None, None, None, strict, "", name,
                                                       keep_unused_weights=keep_unused_weights)
        elif isinstance(entry, tuple) and len(entry) in (2, 3):
            fn, margs, mkwargs = (*entry, None)[:3]
            module = _capture.as_module(fn, f"method {name!r}")
            ep, ir_level, lowering, prov = _one_method(module, margs, mkwargs, (dynamic_shapes or {}).get(name),
                                                       strict, "", name, keep_unused_weights=keep_unused_weights)
        else:
            raise ExportError(f"method {name!r} must be (module_or_bound_method, args[, kwargs]), an "
                              f"ExportedProgram or a LoweredProgram; got {type(entry).__name__}.")
        methods.append(writer.MethodSource(name, ep, ir_level, lowering))
        for k, v in prov.items():
            provenance.setdefault(k, v)
    return methods, provenance


@preserved()
def load(path: StrPath, *, verify: bool = False) -> Pt2bProgram:
    """Read a .pt2b artifact at its recorded (undecomposed) level; weights are mmap'd.

    ``verify=True`` also checks every weight segment against its recorded sha256 digest (format
    1.3+; its CRC32 in older files): reads all weights.
    """
    with gc_paused():
        return _programs_of(reader.open_artifact(path), verify=verify)


def _programs_of(art, *, verify: bool) -> Pt2bProgram:
    """The default method's program of an opened artifact, with every method's (``.methods``): one
    file mapping, so a storage the methods share is one set of bytes."""
    if verify:
        reader.verify_weights(art)  # every segment, whichever method uses it
    methods: dict[str, Pt2bProgram] = {}
    for name in art.method_names:
        methods[name] = _program_of(reader.method(art, name), verify=False)
        methods[name]._methods = methods
    return methods[art.method_names[0]]


def _program_of(art, *, verify: bool) -> Pt2bProgram:
    """The program of an opened artifact (callers pause collection around opening and this): what
    the op table, metadata and records answer is read now, every check of the file that opening it
    made (header, checksums, the FlatBuffer walk of all but the graph, and every weight checksum when
    ``verify``); the graph's walk, decoding and checks on its first use, then torch's deserializer
    (the fx graph, fake tensors, the ExportedProgram)."""
    from .lazy import Lazy

    reader.check_ops(art)  # a missing op or an unreconcilable schema is refused now, from the op table
    if verify:
        reader.verify_weights(art)

    def check():
        with gc_paused():
            return reader.check(art)

    checked = Lazy(check)

    def build():
        c = checked.get()
        with gc_paused(), deferred():  # the graph modules made generate their code on first use: torch's
            return reader.build(art, c)  # deserializer's never, the program's once (0.05 s per 700 nodes)

    def build_for_call():  # what a first call runs, where the ExportedProgram is not built yet
        c = checked.get()
        with gc_paused(), deferred():
            return reader.build_for_call(art, c)

    prog = art.program
    ops = [OperatorInfo(q, o, s, _KIND_NAMES.get(k, "?"), int(r.count))
           for (q, o, s, k), r in zip(reader.operator_records(art), prog.operators or [])]
    provenance = reader.read_provenance(art)
    if art.format_notes:  # an older major brought to today's by versioning/majors.py steps
        provenance["upgraded_format"] = "; ".join(art.format_notes)

    def upgraded():  # op schema upgrades are known once the graph is checked (in memory only:
        checked.get()  # `pt2b upgrade` folds them into its own entry)
        out = dict(provenance)
        for note in art.upgrade_notes:
            op, _, what = note.partition(": ")
            out[f"upgraded_op:{op}"] = what
        return out

    program = Pt2bProgram(
        Lazy(build), path=art.path, format_version=art.version, torch_version=reader.text(prog.torchVersion),
        producer=reader.text(prog.producer), ir_level=reader.text(prog.irLevel), operators=ops,
        metadata=reader.read_metadata(art), provenance=Lazy(upgraded), lowering=reader.read_lowering(art),
        checked=checked, method=art.method, for_call=Lazy(build_for_call),
    )
    program.dim_names = dims.from_provenance(provenance, art.method)
    return program


def _dim_names(art, method: str) -> dict[str, str]:
    """symbol -> the user's Dim name for ``method``, from the artifact's provenance (read at open)."""
    return dims.from_provenance(reader.read_provenance(art), method)


@preserved()  # the lowering's traces, and validation's runs of both programs
def load_for_backend(path: StrPath, preset: str = "core", *, supported_ops: Iterable[OpSpec] | None = None,
                     decompositions: Mapping[torch._ops.OpOverload, Callable[..., Any]] | None = None,
                     keep: Iterable[OpSpec] | None = None, decompose: Iterable[OpSpec] | None = None,
                     device: str = "cpu", verify: bool = False, cache: bool | None = None,
                     strict: bool = False, validate: bool = True, method: str | None = None) -> LoweredProgram:
    """Load ``path`` and lower it for a backend: functionalize, then decompose with a preset (a name
    of ``exporter.lowering.presets.PRESETS``, optionally "@<torch version>"; docs/lowering.md) or until only
    ``supported_ops`` remain; ``keep`` protects ops; ``decompose`` names more ops to decompose with
    torch's registered decompositions; ``decompositions`` adds/overrides entries with your own.
    Returns a LoweredProgram (``.exported_program()``, ``.ops()``, ``.explain(op)``, callable).

    Results are cached (exporter/lowering/cache.py: $PT2B_CACHE_DIR, else $XDG_CACHE_HOME/pt2b,
    else ~/.cache/pt2b) keyed by the artifact's content, the request and the versions; a hit
    costs one load. ``cache=False`` neither reads nor writes the cache; the default (None) uses it
    unless the environment sets PT2B_CACHE=0 (or off/false/no). ``verify=True`` checks the artifact's
    weights against their checksums and digests, and a cache entry's too (one that fails is removed and lowered again).

    ``strict=True`` applies no decomposition that `pt2b opset audit` measured as lossy or wrong
    (schemas/opsets/audit@<torch>.json): such an op stays when the backend accepts it, and is an
    OpsetError naming the op and its measured error otherwise.

    ``validate=True`` (the default) runs the lowered program and the unlowered one on the example
    inputs the artifact stores and compares them, then checks a second input derived from them, op
    by op (each decomposed op against its decomposition) or on both programs, whichever costs less
    (``.validation``; exporter/lowering/validate.py): on a difference, each decomposition applied is
    checked on the values its op receives in the program; a wrong one is kept undecomposed where the
    backend accepts the op, else OpsetError names it. A lowering served from the cache carries the verdict stored with it.

    ``method``: the method of a multi-method artifact (format 1.2) to lower. By default every method
    is lowered with the same request (and cached together, their shared weights stored once); the
    default method's LoweredProgram is returned, the others are in its ``.methods`` (``lowered["decode"]``).
    """
    from .lowering import cache as _cache
    from .lowering.deferred_codegen import deferred
    from .lowering.lower import finish, lower, plan_lowering

    plan = plan_lowering(preset, supported_ops=supported_ops, decompositions=decompositions, keep=keep,
                         decompose=decompose, strict=strict)
    use_cache = _cache.enabled(cache) and plan.fingerprint is not None and device == "cpu"

    with gc_paused():  # the trace allocates fx nodes and fake tensors by the 10^4 as well
        art = reader.open_artifact(path)  # looked up, and on a miss lowered and stored, from this one reading
        # one slot for all methods, one per method asked for by name; None: the cache is not usable (warned)
        entry = _cache.Entry.of(art, plan, method=method, device=device) if use_cache else None
        if entry is not None:
            hits = entry.open(verify=verify)  # each method's answers; graphs checked and built on first use
            if validate and hits is not None and any(h.validation is None for h in hits.values()):
                hits = None  # stored without validation: lowered (and validated) again
            if hits is not None:
                if verify:
                    reader.verify_weights(art)  # the source's own, against its digests (a damaged file is an error)
                lowered = {name: _from_hit(path, art.digest, name, hit, plan, finish, dict(
                    preset=preset, supported_ops=supported_ops, decompositions=decompositions, keep=keep,
                    decompose=decompose, strict=strict, device=device)) for name, hit in hits.items()}
                for name, one in lowered.items():
                    one.dim_names = _dim_names(art, name)
                return _linked(lowered)
        names = list(art.method_names) if method is None else [reader.method(art, method).method]
        if verify:
            reader.verify_weights(art)
        lowered = {}
        for name in names:  # one file mapping: the methods' shared weights stay one set of bytes
            prog = _program_of(reader.method(art, name), verify=False)
            with deferred():  # lowered below: its own code is generated only if it is run
                ep = prog.exported_program()
            if device != "cpu":
                from torch.export.passes import move_to_device_pass

                ep = move_to_device_pass(ep, device)
            one = lower(ep, preset, source=prog, plan=plan)
            if validate and device == "cpu":
                from .lowering.validate import validated

                one = validated(one, plan, ep, lambda p, ep=ep, prog=prog: lower(ep, preset, source=prog, plan=p))
            one.dim_names = prog.dim_names
            lowered[name] = one
        if entry is not None:
            entry.store(lowered, source=art)  # refuses a source whose weights are not the ones it records
    return _linked(lowered)


def _linked(lowered: dict) -> LoweredProgram:
    """The first of ``lowered`` (name -> LoweredProgram), each knowing its name and all of them."""
    for name, one in lowered.items():
        one.method, one._methods = name, lowered
    return next(iter(lowered.values()))


def _from_hit(path, digest: str, name: str, hit, plan, finish, request: dict) -> LoweredProgram:
    """The LoweredProgram of one method a cache entry holds."""
    from .lazy import Lazy

    stored = hit.program

    def built_or_lowered():  # an entry whose graph does not load is lowered again, as on a miss
        try:
            return stored.get()
        except ArtifactError:
            return load_for_backend(path, cache=False, validate=False, method=name, **request).exported_program()

    hit = dataclasses.replace(hit, program=Lazy(built_or_lowered))
    source = Lazy(lambda: _same_content(path, digest, name))
    lowered = finish(plan, None, hit=hit, source_ep=Lazy(lambda: source.get().exported_program()), source=source)
    lowered.from_cache = True
    lowered.validation = hit.validation
    return lowered


def _same_content(path, digest: str, name: str) -> Pt2bProgram:
    """The unlowered program behind a cache hit, read on first use; refuses a file whose
    content changed since the hit was served."""
    with gc_paused():
        art = reader.open_artifact(path)
        if art.digest != digest:
            raise ArtifactError(f"{art.path}: the file changed after load_for_backend served its lowering from "
                                "the cache; call load_for_backend again to lower the new content.")
        return _program_of(reader.method(art, name), verify=False)
