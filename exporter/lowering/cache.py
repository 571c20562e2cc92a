"""The lowering cache: load_for_backend's results stored as .pt2b files, keyed by the artifact's
content, the lowering request and the software versions, so a repeated lowering is one load. Where
it lives, what the key holds and why an entry can be trusted: docs/lowering.md#the-lowering-cache and
docs/untrusted.md#the-lowering-cache."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import pathlib
import warnings

import torch

from ..version import __version__
from ..errors import ArtifactError, ExportError
from ..util.env_switch import env_switch
from ..versioning.formats import FORMAT_VERSION

CACHE_LAYOUT = 5  # bump when what an entry holds changes meaning (2: collapsed lowerings + recipe; 3: op counts;
# 4: entries hold every method lowered, their metadata fields keyed by method name; 5: keyed by content_digest)
_KEY_FIELD = "pt2b_lowering_cache_key"
_RECIPE_FIELD = "pt2b_reuse_recipe"  # present when the entry holds a collapsed lowering (reuse.py)
_VALIDATION_FIELD = "pt2b_validation"  # the lowering's validation (validate.py), when it was validated
_OPS_FIELD = "pt2b_lowered_ops"  # {op: call sites} of the lowered program (expanded): a hit answers ops() with it


def enabled(cache: bool | None) -> bool:
    """``cache`` as given, or when None: on unless $PT2B_CACHE is 0/off/false/no."""
    if cache is not None:
        return bool(cache)
    return env_switch("PT2B_CACHE", True)


def cache_dir() -> pathlib.Path:
    env = os.environ.get("PT2B_CACHE_DIR")
    if env:
        return pathlib.Path(env)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (pathlib.Path(xdg) if xdg else pathlib.Path.home() / ".cache") / "pt2b"


def content_digest(art) -> str:
    """What an artifact's lowering depends on, as one digest: its program section's sha256 when the
    section records the weights' sha256 digests (format 1.3+: nothing more is read), else the sha256
    of the program section's digest and every weight segment's bytes (read in full)."""
    from ..serialize import reader

    if reader.weight_digests(art) is not None:
        return art.digest
    h = hashlib.sha256(art.digest.encode())
    for view in reader.segment_views(art):
        if view.numel():
            h.update(memoryview(view.numpy()))
    return "weights:" + h.hexdigest()


def check_source_weights(source, plan) -> None:
    """Raise CorruptArtifactError unless every weight segment of ``source`` (an opened Artifact whose
    lowering is being stored) holds the bytes its program section's digests record. A segment the
    entry stores (``plan``: the entry's weights.WeightPlan; the same storage, mapped from the source)
    was hashed as it was written; any other is hashed here. A source without digests was keyed by
    its bytes themselves (content_digest): nothing to check."""
    from ..errors import CorruptArtifactError
    from ..serialize import reader
    from ..serialize.layout import segments

    recorded = reader.weight_digests(source)
    if recorded is None:
        return
    written = {(seg.storage.data_ptr(), seg.nbytes): seg.digest for seg in plan.segments if seg.digest}
    for i, view in enumerate(reader.segment_views(source)):
        found = written.get((view.data_ptr(), view.numel()))
        if found is None:
            found = segments.digest(memoryview(view.numpy()) if view.numel() else b"")
        if found != recorded[i]:
            raise CorruptArtifactError(
                f"{source.path}: weight segment {i} does not hold the bytes the program section's digest "
                f"records; the file is damaged or its weights were replaced (re-export or re-copy it).")


def cache_key(program_digest: str, fingerprint: str, device: str) -> str:
    what = {"program": program_digest, "plan": fingerprint, "device": device, "torch": torch.__version__,
            "pt2b": __version__, "format": list(FORMAT_VERSION), "layout": CACHE_LAYOUT}
    return hashlib.sha256(json.dumps(what, sort_keys=True).encode()).hexdigest()


class Entry:
    """One cache slot: ``open()`` the lowered programs stored there, or ``store()`` them. A slot holds
    one lowering request of one artifact: every method lowered (a multi-method entry, its weights
    stored once), or the one method asked for."""

    def __init__(self, key: str, folder: pathlib.Path | None = None):
        self.key = key
        self.path = (folder or cache_dir()) / f"lowered-{key[:40]}.pt2b"

    def open(self, *, verify: bool = False) -> dict[str, Hit] | None:
        """Each stored method's answers without its graph, by name (None on a miss: absent, damaged,
        not this key's, an op the running torch lacks, or stored before entries recorded their ops);
        a lowered ExportedProgram is checked, built on first use, and, for an entry made by reusing
        repeated layers (the collapsed lowering and its recipe), expanded exactly as the lowering that
        stored it was. ``verify``: the entry's weights are checked against their digests too; an entry
        whose weights fail is removed (and so lowered again)."""
        from ..serialize import reader
        from ..util.gc_pause import gc_paused

        try:
            with gc_paused():
                art = reader.open_artifact(self.path)
                metadata = reader.read_metadata(art)
                if metadata.get(_KEY_FIELD) != self.key:
                    return None
                if verify:
                    if reader.weight_digests(art) is None:
                        raise ArtifactError("an entry without weight digests cannot be verified")
                    reader.verify_weights(art)
                hits = {}
                for name in art.method_names:
                    one = reader.method(art, name)
                    reader.check_ops(one)
                    hits[name] = _hit(one, reader.read_lowering(one), metadata, name)
        except ArtifactError:
            if self.path.exists():
                self.discard()
            return None
        return None if any(h is None for h in hits.values()) else hits

    def discard(self) -> None:
        """Remove the entry (damaged or failing verification): the next lowering writes it again."""
        try:
            self.path.unlink()
        except OSError:
            pass

    def store(self, lowered: dict, *, source) -> bool:
        """Write the LoweredPrograms ``lowered`` (method name -> program) of the opened Artifact
        ``source`` to the slot, each with its lowering record, once the source's weights are found to
        be the ones its digests record (check_source_weights: a CorruptArtifactError otherwise, and no
        entry); a cache that cannot be written only warns (lowering succeeded)."""
        from ..serialize.write.writer import MethodSource, write_artifact

        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            methods, metadata = [], {_KEY_FIELD: self.key, _OPS_FIELD: {}, _VALIDATION_FIELD: {}, _RECIPE_FIELD: {}}
            for name, low in lowered.items():
                ep = low.exported_program()
                metadata[_OPS_FIELD][name] = low.ops()
                if low.validation is not None:
                    metadata[_VALIDATION_FIELD][name] = low.validation.to_json()
                if low.reused is not None:  # the collapsed lowering: a fraction of the size to load
                    ep, metadata[_RECIPE_FIELD][name] = low.reused.collapsed, low.reused.recipe
                methods.append(MethodSource(name, ep, f"lowered:{low.preset}", low.lowering_record()))
            preset = next(iter(lowered.values())).preset
            write_artifact(None, self.path, ir_level="", methods=methods, metadata=metadata,
                           provenance={"lowered_from": os.fspath(source.path), "lowering": preset},
                           check_written=lambda plan: check_source_weights(source, plan))
            return True
        except (OSError, ExportError) as e:
            warnings.warn(f"pt2b lowering cache: cannot write {self.path} ({e}); continuing without it.",
                          RuntimeWarning, stacklevel=3)
            return False


def _hit(art, record, metadata: dict, name: str) -> Hit | None:
    """One method's Hit, or None when what the entry says of it does not hold together."""
    from ..lazy import Lazy
    from ..serialize import reader
    from ..util.gc_pause import gc_paused
    from .engines import expand, valid_recipe
    from .validate import Validation

    def of(field):
        value = metadata.get(field)
        return value.get(name) if isinstance(value, dict) else None

    recipe, ops, verdict = of(_RECIPE_FIELD), of(_OPS_FIELD), of(_VALIDATION_FIELD)
    if (recipe is not None and not valid_recipe(recipe)) or record is None or not _counts(ops):
        return None

    def build():
        with gc_paused():
            ep = reader.rebuild(art)
        return ep if recipe is None else expand(ep, recipe)

    return Hit(Lazy(build), dict(ops), dict(record["outside_opset"]),
               Validation.from_json(verdict) if isinstance(verdict, str) else None)


@dataclasses.dataclass
class Hit:
    """A cache entry's method opened without its graph: the lowered program on first use (a Lazy),
    its op counts, what fell outside the opset, and the validation verdict (None: stored without
    validation), as the lowering that stored it found them."""

    program: object  # Lazy[torch.export.ExportedProgram]
    ops: dict
    outside: dict
    validation: object = None


def _counts(ops) -> bool:
    return isinstance(ops, dict) and all(isinstance(k, str) and type(v) is int and v > 0 for k, v in ops.items())


def entries(folder: pathlib.Path | None = None) -> list[pathlib.Path]:
    folder = folder or cache_dir()
    return sorted(folder.glob("lowered-*.pt2b")) if folder.is_dir() else []


def clear(folder: pathlib.Path | None = None) -> int:
    """Remove every entry; returns how many were removed."""
    removed = 0
    for p in entries(folder):
        try:
            p.unlink()
            removed += 1
        except FileNotFoundError:
            pass
    return removed
