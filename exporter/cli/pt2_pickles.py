"""What torch.export.load would unpickle from a .pt2 archive (torch.export.save's zip), found from the
archive's entries, their JSON configs and pickle opcodes alone: nothing here unpickles or runs them."""

from __future__ import annotations

import dataclasses
import io
import json
import pickletools
import posixpath
import zipfile

from ..errors import ArtifactError

# torch.export.save's layout (torch/export/pt2_archive/constants.py), under the archive's root folder.
# Each models/<name>.json is a model; its weights and constants are listed in JSON configs, and an
# entry a config marks "use_pickle" is handed to torch.load(weights_only=False) (a constant named
# custom_obj_* or opaque_obj_* to the TorchScript unpickler or pickle.loads, marked or not). Its
# example inputs are always a torch.save pickle. The legacy layouts pickle whole state dicts.
_MODELS, _MODEL_SUFFIX = "models/", ".json"


def program_entries(names) -> list[str]:
    """The archive entries torch.export.load reads as programs: every one under models/, whatever it
    ends with (torch slices the model's name off as if it ended in .json)."""
    return [n for n in names if n.startswith(_MODELS)]


def model_name(entry: str) -> str:
    """The model name torch gives the program entry ``entry`` (its sample inputs and weights are named by it)."""
    return entry[len(_MODELS):-len(_MODEL_SUFFIX)]
_PAYLOADS = (("data/weights/{}_weights_config.json", "data/weights/", "weight"),
             ("data/constants/{}_constants_config.json", "data/constants/", "constant"))
_SAMPLE_INPUTS = "data/sample_inputs/{}.pt"
_ALWAYS_PICKLED = ("custom_obj_", "opaque_obj_")
_LEGACY = ("serialized_state_dict.pt", "serialized_constants.pt", "serialized_example_inputs.pt")

# Bounds on what is read to decide: a JSON config, or one pickle (an entry, or the data.pkl inside
# one). torch.export.save writes kilobytes there; a bigger one is refused as unreadable.
_MAX_CONFIG = 64 << 20
_MAX_PICKLE = 16 << 20
_UNREADABLE = "(unreadable)"
_DYNAMIC = "(a global named at load time)"


@dataclasses.dataclass(frozen=True)
class Pickled:
    entry: str  # the archive entry, under its root folder
    holds: str  # what torch would load from it
    imports: tuple[str, ...]  # "module.name" of each global its pickle names, as far as the scan sees

    def describe(self) -> str:
        return f"{self.entry} ({self.holds}; imports {', '.join(self.imports) or 'no global'})"


def refused(f) -> list[Pickled]:
    """What reading the open archive ``f`` with torch.export.load would unpickle without restriction:
    the entries marked as pickled, then (when there are none) the example inputs torch's weights-only
    unpickler would not take. Entries are read with torch's own archive reader (the lookups torch
    makes, its case-insensitive names included), whose reads unpickle nothing."""
    out = _legacy_entries(f)
    f.seek(0)
    from torch.export.pt2_archive import PT2ArchiveReader

    try:
        archive = PT2ArchiveReader(f)
    except Exception:  # (torch's reader raises what miniz says) torch.export.load then reads only the legacy layout
        return out
    names = archive.get_file_names()
    models = [model_name(n) for n in program_entries(names)]
    for model in models:
        for config, base, what in _PAYLOADS:
            legacy = f"{base}{model}.pt"
            if legacy in names:
                out.append(_pickled(archive, legacy, f"the {what}s of model {model!r} (legacy layout)"))
            elif config.format(model) in names:
                for fqn, path_name in _pickled_payloads(archive, config.format(model)):
                    out.append(_pickled(archive, posixpath.join(base, path_name), f"{what} {fqn!r}"))
    return out or _example_inputs_refused(archive, models)


def _legacy_entries(f) -> list[Pickled]:
    """torch.export.load's fallback for an archive its reader cannot load reads these pickles by exact
    name with Python's zipfile; any entry of such a name, anywhere, counts."""
    try:
        with zipfile.ZipFile(f) as zf:
            return [Pickled(i.filename, "a whole state dict, constants or inputs (torch's legacy layout)",
                            _imports(_read_zip(zf, i))) for i in zf.infolist()
                    if posixpath.basename(i.filename) in _LEGACY]
    except (zipfile.BadZipFile, OSError, EOFError, ValueError, NotImplementedError):
        return []


def _example_inputs_refused(archive, models: list[str]) -> list[Pickled]:
    """The example-input entries that torch's weights-only unpickler would not read: one whose pickle
    names a global outside that unpickler's allowlist or cannot be scanned, or one it fails on here.
    torch.export.load unpickles such an entry without restriction once weights-only loading fails.
    Each of the others is read here as torch will read it (the same bytes, the same call), so torch's
    read succeeds too and never falls back."""
    import torch
    from .._torch.unpickler import weights_only_allowed_globals

    allowed = set(weights_only_allowed_globals())
    out = []
    for model in models:
        rel = _SAMPLE_INPUTS.format(model)
        try:  # looked up as torch does: by name, whether listed or not (its reader ignores case)
            data = _record(archive, rel, None)
        except ArtifactError:  # none: torch's read fails before it unpickles them
            continue
        if not data:  # empty: torch unpickles nothing
            continue
        holds = f"the example inputs of model {model!r}"
        imports = _imports(data)
        if not set(imports) <= allowed:
            out.append(Pickled(rel, holds, imports))
            continue
        try:
            torch.load(io.BytesIO(data), weights_only=True)
        except Exception as e:  # what the weights-only unpickler refuses, torch would unpickle freely
            out.append(Pickled(rel, f"{holds}, which torch's weights-only unpickler refuses ({type(e).__name__})",
                               imports))
    return out


def _record(archive, name: str, limit: int | None) -> bytes:
    """Entry ``name`` as torch reads it; at most ``limit`` bytes, else an ArtifactError before reading."""
    try:
        if limit is not None and archive.archive_file.get_record_size(name) > limit:
            raise ArtifactError(f"archive entry {name}: more than {limit} bytes, too big for what it should "
                                "hold; not an archive torch.export.save wrote.")
        return archive.read_bytes(name)
    except RuntimeError as e:
        raise ArtifactError(f"archive entry {name}: cannot be read ({str(e).splitlines()[0]}).") from None


def _pickled_payloads(archive, rel: str) -> list[tuple[str, str]]:
    """(name, entry name) of each payload the config ``rel`` marks as pickled: any "use_pickle" but
    false, and every custom_obj_*/opaque_obj_* entry."""
    try:
        config = json.loads(_record(archive, rel, _MAX_CONFIG))["config"]
        out = []
        for fqn, meta in config.items():
            path_name = str(meta.get("path_name", ""))
            if meta.get("use_pickle") is not False or path_name.startswith(_ALWAYS_PICKLED):
                out.append((str(fqn), path_name))
        return out
    except (ValueError, KeyError, TypeError, AttributeError, RecursionError):
        raise ArtifactError(f"archive entry {rel}: not a payload config torch.export.save writes (a JSON "
                            "object whose 'config' maps names to payloads); cannot tell what it would unpickle.") from None


def _pickled(archive, rel: str, holds: str) -> Pickled:
    try:
        data = _record(archive, rel, _MAX_PICKLE)
    except ArtifactError:
        return Pickled(rel, holds, (_UNREADABLE,))
    return Pickled(rel, holds, _imports(data))


def _read_zip(zf: zipfile.ZipFile, info: zipfile.ZipInfo) -> bytes:
    if info.file_size > _MAX_PICKLE:
        return b""
    with zf.open(info) as f:
        return f.read(_MAX_PICKLE)


def _imports(data: bytes) -> tuple[str, ...]:
    """The globals named by the pickle ``data``: torch.save's zip (its *.pkl records), else one pickle."""
    if not data.startswith(b"PK"):
        return tuple(_globals(data))
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as inner:
            pkls = [i for i in inner.infolist() if i.filename.endswith(".pkl")]
            found = [g for pkl in pkls for g in _globals(_read_zip(inner, pkl))]
            return tuple(dict.fromkeys(found)) if pkls else (_UNREADABLE,)
    except (zipfile.BadZipFile, OSError, EOFError, ValueError, NotImplementedError):
        return (_UNREADABLE,)


_STRINGS = {"STRING", "BINSTRING", "SHORT_BINSTRING", "UNICODE", "BINUNICODE", "SHORT_BINUNICODE", "BINUNICODE8"}
_GETS = {"GET", "BINGET", "LONG_BINGET"}
_PUTS = {"PUT", "BINPUT", "LONG_BINPUT"}
_NO_PUSH = {"PROTO", "FRAME", "STOP"}


def _globals(data: bytes) -> list[str]:
    """"module.name" of each global a pickle names, read from its opcodes (pickletools.genops executes
    nothing). A global whose name the scan cannot follow (STACK_GLOBAL fed by anything but strings,
    the copyreg extension codes) is _DYNAMIC; opcodes that do not read as a pickle add _UNREADABLE."""
    out: list[str] = []
    recent: list = []  # what the last opcodes pushed: a string, or None for anything else
    memo: dict = {}
    try:
        for op, arg, _ in pickletools.genops(data):
            name = op.name
            if name in ("GLOBAL", "INST"):
                out.append(".".join(str(arg).split(" ", 1)))
                recent.append(None)
            elif name == "STACK_GLOBAL":
                module, attr = recent[-2:] if len(recent) >= 2 else (None, None)
                out.append(f"{module}.{attr}" if isinstance(module, str) and isinstance(attr, str) else _DYNAMIC)
                recent.append(None)
            elif name.startswith("EXT"):
                out.append(_DYNAMIC)
                recent.append(None)
            elif name in _STRINGS:
                recent.append(arg.decode("latin-1") if isinstance(arg, bytes) else arg if isinstance(arg, str) else None)
            elif name in _GETS:
                recent.append(memo.get(arg))
            elif name == "MEMOIZE":
                memo[len(memo)] = recent[-1] if recent else None
            elif name in _PUTS:
                memo[arg] = recent[-1] if recent else None
            elif name not in _NO_PUSH:
                recent.append(None)
            del recent[:-2]
    except (ValueError, EOFError, UnicodeDecodeError):
        out.append(_UNREADABLE)
    if not data:
        out.append(_UNREADABLE)
    return list(dict.fromkeys(out))
