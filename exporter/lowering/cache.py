"""The lowering cache: load_for_backend's results stored as .pt2b files in a folder private to its
user, keyed by the artifact's content, the request, the user code and the versions, so a repeated
lowering is one load; and its housekeeping. Where it lives, what the key holds and why an entry can
be trusted: docs/lowering.md#the-lowering-cache and docs/untrusted.md#the-lowering-cache."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import pathlib
import stat
import warnings

import torch

from ..version import __version__
from ..errors import ArtifactError, ExportError
from ..util.env_switch import env_switch
from ..versioning.formats import FORMAT_VERSION
from .lower import Lowering

# bump when what an entry holds changes meaning (2: collapsed lowerings + recipe; 3: op counts;
# 4: entries hold every method lowered, their metadata fields keyed by method name; 5: keyed by
# content_digest; 6: the key holds the user code the lowering computes with (user_code.py), and an
# entry records its source, checked before it is served)
CACHE_LAYOUT = 6
_KEY_FIELD = "pt2b_lowering_cache_key"
_SOURCE_FIELD = "pt2b_cache_source"  # {"content": the source's content_digest, "request": what was asked}
_RECIPE_FIELD = "pt2b_reuse_recipe"  # present when the entry holds a collapsed lowering (reuse.py)
_VALIDATION_FIELD = "pt2b_validation"  # the lowering's validation (validate.py), when it was validated
_OPS_FIELD = "pt2b_lowered_ops"  # {op: call sites} of the lowered program (expanded): a hit answers ops() with it
_ENTRY_GLOB = "lowered-*.pt2b"
_TEMP_GLOB = ".lowered-*.tmp"  # what a store killed before its rename leaves (util/atomic.py names it)


def enabled(cache: bool | None) -> bool:
    """``cache`` as given, or when None: on unless $PT2B_CACHE is 0/off/false/no."""
    if cache is not None:
        return bool(cache)
    return env_switch("PT2B_CACHE", True)


NO_HOME = ("there is no home directory to hold it (HOME is unset and the user has no passwd entry); set "
           "PT2B_CACHE_DIR to a folder of yours to use the cache, or PT2B_CACHE=0 to go without it")


def cache_dir() -> pathlib.Path | None:
    """$PT2B_CACHE_DIR, else $XDG_CACHE_HOME/pt2b, else ~/.cache/pt2b; None without a home directory."""
    env = os.environ.get("PT2B_CACHE_DIR")
    if env:
        return pathlib.Path(env)
    xdg = os.environ.get("XDG_CACHE_HOME")
    if xdg and os.path.isabs(xdg):  # (a relative one is ignored, as the XDG specification says)
        return pathlib.Path(xdg) / "pt2b"
    try:
        return pathlib.Path.home() / ".cache" / "pt2b"
    except (RuntimeError, KeyError, OSError):  # no $HOME and no passwd entry for this user id
        return None


def refusal(folder: pathlib.Path) -> str | None:
    """Why ``folder`` must not hold the cache, or None. Whoever can write the folder can plant
    entries that load_for_backend would serve: it must be a folder of this user's that no other user
    can write (one another user owns, or with group or other write bits, is refused)."""
    try:
        st = _stat(folder)
    except OSError as e:
        return f"cannot read it ({e.strerror or e})"
    if not stat.S_ISDIR(st.st_mode):
        return "it is not a folder"
    uid = os.geteuid() if hasattr(os, "geteuid") else None
    if uid is not None and st.st_uid != uid:
        return (f"it is owned by user id {st.st_uid}, not by you (user id {uid}), and another user's "
                f"entries are not to be trusted; point PT2B_CACHE_DIR to a folder of yours")
    if os.name == "posix" and st.st_mode & 0o022:
        return (f"other users can write it (mode {stat.S_IMODE(st.st_mode):o}) and plant entries; make it "
                f"private (chmod 700 {folder}) or point PT2B_CACHE_DIR to a folder of yours")
    return None


def _stat(path) -> os.stat_result:
    """The owner and mode of ``path`` (following links, as the cache's files are reached): one place."""
    return os.stat(path)


def usable_folder() -> pathlib.Path | None:
    """The cache folder, created private to its user (0700) where missing; None, with one
    RuntimeWarning saying why, when there is none or it is refused (the lowering goes without it)."""
    folder = cache_dir()
    why = NO_HOME if folder is None else None
    if folder is not None:
        try:
            folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        except FileExistsError:  # not a folder: refusal says so
            pass
        except OSError as e:
            why = f"cannot create it ({e.strerror or e})"
        why = why or refusal(folder)
    if why is None:
        return folder
    warnings.warn(f"pt2b lowering cache: not using {folder or 'any folder'}: {why}. Lowering without the cache.",
                  RuntimeWarning, stacklevel=3)
    return None


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
    from ..layout import segments

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


def cache_key(source: str, request: dict) -> str:
    """The slot of ``request`` (the lowering plan's fingerprint, method, device and the user code's
    digest) of the source whose content_digest is ``source``, under these versions."""
    what = {"source": source, "request": request, "torch": torch.__version__, "pt2b": __version__,
            "format": list(FORMAT_VERSION), "layout": CACHE_LAYOUT}
    return hashlib.sha256(json.dumps(what, sort_keys=True).encode()).hexdigest()


def op_qualnames(art, methods) -> set[str]:
    """The names of the ops the methods ``methods`` of ``art`` call, from its operator table (no graph read)."""
    from ..serialize import reader

    return {q for name in methods for q, _, _, _ in reader.operator_records(reader.method(art, name))}


class Entry:
    """One cache slot: ``open()`` the lowered programs stored there, or ``store()`` them. A slot holds
    one lowering request of one artifact: every method lowered (a multi-method entry, its weights
    stored once), or the one method asked for. An entry records its source (content digest and
    request) as the writer found them; open() serves it only where they are this slot's."""

    def __init__(self, folder: pathlib.Path, source: str, request: dict, art=None, plan=None):
        self.source, self.request, self.plan = source, request, plan  # (the LoweringPlan whose lowerings it holds)
        self._digested = art  # the opened Artifact whose content_digest ``source`` is (spares reading it twice)
        self.key = cache_key(source, request)
        self.path = folder / f"lowered-{self.key[:40]}.pt2b"

    @classmethod
    def of(cls, art, plan, *, method: str | None, device: str) -> Entry | None:
        """The slot of lowering the opened Artifact ``art`` with the LoweringPlan ``plan``; None, with
        one RuntimeWarning, when the cache cannot be used (no folder, a folder refused, user code
        that reaches too far to key)."""
        from . import user_code

        folder = usable_folder()
        if folder is None:
            return None
        methods = art.method_names if method is None else [method]
        code = user_code.lowering_code_digest(plan.table, op_qualnames(art, methods))
        if code is None:
            warnings.warn("pt2b lowering cache: a decomposition or custom op of this lowering reaches more code "
                          "than the cache key can hold; lowering without the cache.", RuntimeWarning, stacklevel=3)
            return None
        request = {"plan": plan.fingerprint, "method": method, "device": device, "code": code}
        return cls(folder, content_digest(art), request, art, plan)

    def open(self, *, verify: bool = False) -> dict[str, Lowering] | None:
        """Each stored method's Lowering, its graph built on first use, by name (None on a miss: absent, damaged,
        not this key's, an op the running torch lacks, or stored before entries recorded their ops);
        a lowered ExportedProgram is checked, built on first use, and, for an entry made by reusing
        repeated layers (the collapsed lowering and its recipe), expanded exactly as the lowering that
        stored it was. An entry that names another source or request than this slot's (planted,
        or stored by a pt2b that keyed it wrongly) is removed. ``verify``: the entry's weights are
        checked against their digests too; an entry whose weights fail is removed (and so lowered
        again)."""
        from ..serialize import reader
        from ..util.gc_pause import gc_paused

        try:
            with gc_paused():
                art = reader.open_artifact(self.path)
                metadata = reader.read_metadata(art)
                if metadata.get(_KEY_FIELD) != self.key:
                    return None
                if metadata.get(_SOURCE_FIELD) != {"content": self.source, "request": self.request}:
                    raise ArtifactError("the entry was stored from another source or request than its slot's")
                if verify:
                    if reader.weight_digests(art) is None:
                        raise ArtifactError("an entry without weight digests cannot be verified")
                    reader.verify_weights(art)
                hits = {}
                for name in art.method_names:
                    one = reader.method(art, name)
                    reader.check_ops(one)
                    hits[name] = _hit(one, reader.read_lowering(one), metadata, name, self.plan)
        except ArtifactError:
            if self.path.exists():
                self.discard()
            return None
        return None if any(h is None for h in hits.values()) else hits

    def discard(self) -> None:
        """Remove the entry (damaged, misfiled or failing verification): the next lowering writes it again."""
        try:
            self.path.unlink()
        except OSError:
            pass

    def store(self, lowerings: dict, *, source) -> bool:
        """Write the Lowerings ``lowerings`` (method name -> lower.Lowering, made with this slot's plan) of the
        opened Artifact ``source`` to the slot, each with its lowering record, once the source's
        weights are found to be the ones its digests record (check_source_weights: a
        CorruptArtifactError otherwise, and no entry). The entry records the source it was made from,
        as the writer finds it (its content_digest and the request), whatever slot it is written to; a
        cache that cannot be written only warns (lowering succeeded)."""
        from ..serialize.write.writer import MethodSource, write_artifact
        from ..graph_walk import op_counts
        from .lower import lowering_record

        try:
            self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            # the request the lowerings were made with, as they record it (not the slot's: an entry says
            # what it holds, and open() serves it only where that is the slot's)
            fingerprints = {low.plan.fingerprint for low in lowerings.values()}
            request = dict(self.request, plan=fingerprints.pop() if len(fingerprints) == 1 else None)
            methods, metadata = [], {_KEY_FIELD: self.key, _OPS_FIELD: {}, _VALIDATION_FIELD: {}, _RECIPE_FIELD: {},
                                     _SOURCE_FIELD: {"content": self.source if source is self._digested else content_digest(source),
                                                    "request": request}}
            for name, low in lowerings.items():
                ep = low.exported_program()
                metadata[_OPS_FIELD][name] = op_counts(ep.graph_module)
                if low.validation is not None:
                    metadata[_VALIDATION_FIELD][name] = low.validation.to_json()
                if low.reused is not None:  # the collapsed lowering: a fraction of the size to load
                    ep, metadata[_RECIPE_FIELD][name] = low.reused.collapsed, low.reused.recipe
                methods.append(MethodSource(name, ep, f"lowered:{low.plan.label}",
                                            lowering_record(low.plan.label, low.plan.fingerprint, low.outside)))
            write_artifact(None, self.path, ir_level="", methods=methods, metadata=metadata,
                           provenance={"lowered_from": os.fspath(source.path),
                                       "lowering": next(iter(lowerings.values())).plan.label},
                           check_written=lambda written: check_source_weights(source, written))
            return True
        except (OSError, ExportError) as e:
            warnings.warn(f"pt2b lowering cache: cannot write {self.path} ({e}); continuing without it.",
                          RuntimeWarning, stacklevel=3)
            return False


def _hit(art, record, metadata: dict, name: str, plan) -> Lowering | None:
    """One method's Lowering as the entry holds it (its graph built on first use), or None when what
    the entry says of it does not hold together."""
    from ..lazy import Lazy
    from ..serialize import reader
    from ..util.gc_pause import gc_paused
    from .._torch.compat import as_aten_dialect
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
        return as_aten_dialect(ep if recipe is None else expand(ep, recipe))

    return Lowering(plan, Lazy(build), dict(record["outside_opset"]), ops=dict(ops), from_cache=True,
                    validation=Validation.from_json(verdict) if isinstance(verdict, str) else None)


def _counts(ops) -> bool:
    return isinstance(ops, dict) and all(isinstance(k, str) and type(v) is int and v > 0 for k, v in ops.items())


@dataclasses.dataclass
class Contents:
    """What the cache folder holds: entries, leftovers (temporary files of stores that were killed
    before their rename) and strays (anything else named like either: a folder, a FIFO)."""

    entries: list[pathlib.Path]
    leftovers: list[pathlib.Path]
    strays: list[pathlib.Path]
    size: int  # bytes of the entries and leftovers


def contents(folder: pathlib.Path | None = None) -> Contents:
    """The cache folder's contents (empty when there is no folder); never follows a link, so a
    link named like an entry counts as a file of the cache (removing it removes the link)."""
    folder = folder or cache_dir()
    found = Contents([], [], [], 0)
    if folder is None or not folder.is_dir():
        return found
    for kind, pattern in (("entries", _ENTRY_GLOB), ("leftovers", _TEMP_GLOB)):
        for p in sorted(folder.glob(pattern)):
            try:
                st = p.lstat()
            except OSError:  # removed meanwhile
                continue
            if stat.S_ISREG(st.st_mode) or stat.S_ISLNK(st.st_mode):
                getattr(found, kind).append(p)
                found.size += st.st_size
            else:
                found.strays.append(p)
    return found


def entries(folder: pathlib.Path | None = None) -> list[pathlib.Path]:
    """The entries in the cache folder (files named like one)."""
    return contents(folder).entries


@dataclasses.dataclass
class Cleared:
    """What clear() did."""

    entries: int  # entries removed
    leftovers: int  # temporary files removed
    kept: list[str]  # what could not be removed, each with why


def clear(folder: pathlib.Path | None = None) -> Cleared:
    """Remove every entry and leftover; strays (a folder named like an entry) and files that cannot
    be removed are kept and named. A store running meanwhile loses its temporary file and only
    warns (its lowering is returned)."""
    found = contents(folder)
    done = Cleared(0, 0, [f"{p} (not a file pt2b writes)" for p in found.strays])
    for kind, paths in (("entries", found.entries), ("leftovers", found.leftovers)):
        for p in paths:
            try:
                p.unlink()
            except FileNotFoundError:
                continue
            except OSError as e:
                done.kept.append(f"{p} ({e.strerror or e})")
                continue
            setattr(done, kind, getattr(done, kind) + 1)
    return done


def stored_or_lowered(hit: Lowering, source_ep):
    """The lowered program a cache entry holds; one whose graph does not load is lowered again from
    the source (``source_ep``: a Lazy reading it) with the entry's plan, less the decompositions its
    validation kept."""
    from ..ops import op_name
    from .lower import lower

    try:
        return hit.program.get()  # (_hit's Lazy: the entry's graph)
    except ArtifactError:
        kept = hit.validation.kept if hit.validation is not None else {}
        plan = hit.plan.without(op for op in hit.plan.table if op_name(op) in kept)
        return lower(source_ep.get(), plan).exported_program()
