"""The public entry points: export_model and load."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any, Union

import torch

from . import exporting, names
from .errors import ExportError
from .program import Pt2bProgram
from .serialize import reader, writer
from .util.gc_pause import gc_paused
from .util.process_state import preserved
from .loading import programs_of
from .versioning.formats import parse_version

if TYPE_CHECKING:
    from .lowering.eager import EagerContext
    from .lowering.lowered import LoweredProgram
    from .ops import OpSpec

StrPath = Union[str, "os.PathLike[str]"]

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
    Returns the ExportedProgram that was written: the one given or captured, or, where weights were left
    out, the program written as read back from the file (its weights mapped from it).
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
        methods, provenance = exporting.methods_given(m, dynamic_shapes, strict, keep_unused_weights)
        read_back = {}
        writer.write_artifact(None, path, ir_level="", metadata=metadata, provenance=provenance, version=version,
                              target_torch=target_torch, methods=methods, read_back=read_back)
        return {x.name: read_back[x.name] if x.unused.inputs else x.ep for x in methods}
    ep, ir_level, lowering, provenance, unused = exporting.method_given(
        m, args, kwargs, dynamic_shapes, strict, path, keep_unused_weights=keep_unused_weights)
    if path is None and isinstance(args, (str, os.PathLike)):
        path = args
    if path is None:
        raise ExportError("export_model needs a destination path, e.g. export_model(ep, path='model.pt2b').")
    read_back = {}
    writer.write_artifact(None, path, ir_level="", metadata=metadata, provenance=provenance, version=version,
                          target_torch=target_torch, read_back=read_back,
                          methods=[writer.MethodSource(names.DEFAULT_METHOD, ep, ir_level, lowering, unused)])
    # a program that leaves weights out is returned as the writer's check read it back from the file: that
    # program, not the one given, is what was written
    return read_back[names.DEFAULT_METHOD] if unused.inputs else ep


@preserved()
def load(path: StrPath, *, verify: bool = False) -> Pt2bProgram:
    """Read a .pt2b artifact at its recorded (undecomposed) level; weights are mmap'd.

    ``verify=True`` also checks every weight segment against its recorded sha256 digest (format
    1.3+; its CRC32 in older files): reads all weights.
    """
    with gc_paused():
        return programs_of(reader.open_artifact(path), verify=verify)


@preserved()  # the lowering's traces, and validation's runs of both programs
def load_for_backend(path: StrPath, preset: str | None = "core", *, backend: str | None = None,
                     supported_ops: Iterable[OpSpec] | None = None,
                     decompositions: Mapping[torch._ops.OpOverload, Callable[..., Any]] | None = None,
                     keep: Iterable[OpSpec] | None = None, decompose: Iterable[OpSpec] | None = None,
                     device: str = "cpu", verify: bool = False, cache: bool | None = None,
                     lossless: bool = False, validate: bool = True, method: str | None = None,
                     strict: bool | None = None, fallback: str | None = None) -> LoweredProgram:
    """Load ``path`` and lower it: functionalize, then decompose for one of
    - ``preset``: a name of pt2b's presets (none, core, core-tag, max; optionally "@<torch version>",
      docs/lowering.md);
    - ``backend``: an installed backend's name (onnx, inductor, openvino, executorch, iree): its own op
      list and decompositions, as the installed backend gives them; ``exporter.backends.to_backend``
      then hands the result over;
    - ``supported_ops``: your backend's op list (decomposed until only those remain).
    ``keep`` protects ops; ``decompose`` names more ops to decompose with torch's registered
    decompositions; ``decompositions`` adds/overrides entries with your own.
    Returns a LoweredProgram (``.exported_program()``, ``.ops()``, ``.explain(op)``, callable).

    Results are cached (docs/lowering.md: $PT2B_CACHE_DIR, else $XDG_CACHE_HOME/pt2b, else
    ~/.cache/pt2b) keyed by the artifact's content, the request and the versions; a hit costs one
    load. ``cache=False`` neither reads nor writes the cache; the default (None) uses it unless the
    environment sets PT2B_CACHE=0 (or off/false/no).

    ``verify=True`` checks the artifact's weights against their checksums and digests, and a cache
    entry's too (one that fails is removed and lowered again).

    ``lossless=True`` applies no decomposition that `pt2b opset audit` measured as lossy or wrong
    (schemas/opsets/audit@<torch>.json): such an op stays when the backend accepts it, and is an
    OpsetError naming the op and its measured error otherwise.

    ``validate=True`` (the default) runs the lowered program and the unlowered one on the example
    inputs the artifact stores and compares them, then checks a second input derived from them, op
    by op (each decomposed op against its decomposition) or on both programs, whichever costs less
    (``.validation``): on a difference, each decomposition applied is checked on the values its op
    receives in the program; a wrong one is kept undecomposed where the backend accepts the op, else
    OpsetError names it. A lowering served from the cache carries the verdict stored with it.

    ``fallback="reference"`` (with ``backend`` or ``supported_ops``): an op that no decomposition brings
    to the backend's list stays in the program instead of being an OpsetError, and everything else is
    decomposed as usual; ``.outside_opset`` and ``.report()`` name what was left for the reference.
    ``to_backend`` then runs those ops on the reference and the rest on the backend (the lowering's
    fallback is its default). The lowering is cached apart from one without fallback.

    ``method``: the method of a multi-method artifact (format 1.2) to lower. By default every method
    is lowered with the same request (and cached together, their shared weights stored once); the
    default method's LoweredProgram is returned, the others are in its ``.methods`` (``lowered["decode"]``).

    Spellings of an earlier release still work for one more, with a DeprecatedSpellingWarning:
    ``preset="onnx"`` (a backend's name) for ``backend="onnx"``, ``strict=True`` for ``lossless=True``.
    """
    from .lowering.pipeline import lower_artifact
    from .request import plan_request

    plan = plan_request(preset, backend=backend, supported_ops=supported_ops, decompositions=decompositions,
                        keep=keep, decompose=decompose, lossless=lossless, strict=strict, fallback=fallback,
                        stacklevel=4)
    return lower_artifact(path, plan, device=device, verify=verify, cache=cache, validate=validate, method=method)


def eager_decompositions(preset: str | None = "core", *, backend: str | None = None,
                         supported_ops: Iterable[OpSpec] | None = None, keep: Iterable[OpSpec] | None = None,
                         decompositions: Mapping[torch._ops.OpOverload, Callable[..., Any]] | None = None,
                         lossless: bool = False, strict: bool | None = None) -> EagerContext:
    """A context manager running eager PyTorch with the lowering of ``preset`` (or ``backend``,
    ``supported_ops``, ``keep``, ``decompositions``, ``lossless``: as in load_for_backend) applied op
    by op; ``as`` gives the EagerDecompositions mode (``.decomposed``, ``.unsupported``, ``.ran``)."""
    from .lowering.eager import EagerContext, EagerDecompositions
    from .request import plan_request

    return EagerContext(EagerDecompositions(plan_request(
        preset, backend=backend, supported_ops=supported_ops, keep=keep, decompositions=decompositions,
        lossless=lossless, strict=strict, stacklevel=3)))
