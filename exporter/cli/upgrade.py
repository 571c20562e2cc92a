"""`pt2b upgrade`: rewrite artifacts to a (newer) format version and the running torch's op
schemas. The result is verified by loading it before the original is ever replaced; what an upgrade
changes is exporter/versioning/upgrade_plan.py."""

from __future__ import annotations

import dataclasses
import os
import pathlib

from ..errors import ArtifactError, ExportError, UnsupportedVersionError
from ..versioning import upgrade_plan
from ..versioning.formats import FORMAT_VERSION, parse_version, version_str
from . import progress


@dataclasses.dataclass
class UpgradeResult:
    source: str
    dest: str
    from_version: tuple[int, int]
    to_version: tuple[int, int]
    changes: list[str]
    written: bool

    @property
    def failed(self) -> bool:
        return any(c.startswith("FAILED") for c in self.changes)

    def line(self) -> str:
        if self.failed:
            return f"{self.source}: {self.changes[0]}"
        what = "; ".join(self.changes) if self.changes else "already current"
        verb = "upgraded" if self.written else ("would change" if self.changes else "unchanged")
        return f"{self.source}: {verb} ({version_str(self.from_version)} -> {version_str(self.to_version)}): {what}"


def upgrade_file(source, dest=None, *, check: bool = False, to: tuple[int, int] | None = None) -> UpgradeResult:
    """Upgrade ``source`` into ``dest`` (default: in place, atomically)."""
    from ..api import load
    from ..serialize import writer
    from ..util.atomic import atomic_path

    target = to or FORMAT_VERSION
    source = os.fspath(source)
    dest = os.fspath(dest) if dest is not None else source
    prog = load(source)  # older formats and drifted op schemas are upgraded in memory here
    _refuse_newer(source, prog.format_version)
    changes = list(dict.fromkeys(c for p in prog.methods.values() for c in upgrade_plan.changes(p, target)))
    result = UpgradeResult(source, dest, prog.format_version, target, changes, written=False)
    if check or (not changes and dest == source):
        return result
    provenance = upgrade_plan.provenance(prog, changes, target)
    # A temp file of its own (two upgrades of one file at once must not share one), named
    # .<name>.upgrade.<random>.tmp: a kill leaves nothing that looks like an artifact. It is
    # replaced by the writer (atomically), checked, then moved onto dest (atomically, folder
    # synced); any failure removes it and leaves dest as it was.
    with atomic_path(dest, tag="upgrade.") as tmp:
        methods = [writer.MethodSource(name, p.exported_program(), p.ir_level, p.lowering)
                   for name, p in prog.methods.items()]  # every method, the default first
        writer.write_artifact(None, tmp, ir_level="", metadata=prog.metadata, provenance=provenance,
                              version=target, methods=methods)
        check_prog = load(tmp, verify=True)  # the new file must load before the old one is touched
        if {n: p.ops() for n, p in check_prog.methods.items()} != {n: p.ops() for n, p in prog.methods.items()}:
            raise ExportError(f"{dest}: the upgraded artifact's op table differs from the loaded program's.")
        del check_prog  # (its mapping of the temp file)
    result.written = True
    return result


def _refuse_newer(source: str, version: tuple[int, int]) -> None:
    """A file of a format newer than this pt2b's is never rewritten: a later minor holds fields this pt2b
    does not know, and writing any version from here would drop them without a word. It is left as it
    is, with an UnsupportedVersionError before anything is written. (A file this pt2b knows may be
    written down with an explicit ``--to``: the writer refuses whatever the older version cannot hold.)"""
    if version > FORMAT_VERSION:
        have = version_str(version)
        raise UnsupportedVersionError(
            f"{source}: format {have} is newer than this pt2b's ({version_str(FORMAT_VERSION)}): a later pt2b "
            f"wrote it, and rewriting it here would drop what {have} added. Left untouched; upgrade it with "
            f"a pt2b that writes {have} or later.")


def upgrade_path(path, dest=None, *, check: bool = False, to=None, track=None) -> list[UpgradeResult]:
    """A file, or every *.pt2b in a folder (in place); errors are reported per file. ``track``
    (exporter.cli.progress.tracker) reports each file."""
    p = pathlib.Path(path)
    if not p.is_dir():
        files = track([p], label=lambda f: f.name) if track is not None else [p]
        return [upgrade_file(f, dest, check=check, to=to) for f in files]
    if dest is not None:
        raise ExportError("a folder is upgraded in place: give no destination.")
    # a leftover .<name>.upgrade.pt2b is a temp file an older pt2b's killed upgrade left behind, not an artifact
    files = [f for f in sorted(p.rglob("*.pt2b")) if not (f.name.startswith(".") and f.name.endswith(".upgrade.pt2b"))]
    out = []
    for f in (track(files, label=lambda f: str(f.relative_to(p))) if track is not None else files):
        try:
            out.append(upgrade_file(f, check=check, to=to))
        except (ArtifactError, ExportError) as e:
            out.append(UpgradeResult(str(f), str(f), (0, 0), (0, 0), [f"FAILED: {type(e).__name__}: {e}"], False))
    return out


def run(ns) -> int:
    try:
        to = parse_version(ns.to) if ns.to else None
    except ValueError as e:
        raise ExportError(str(e)) from None
    results = upgrade_path(ns.source, ns.dest, check=ns.check, to=to,
                           track=progress.tracker("checking" if ns.check else "upgrading", unit="file"))
    for r in results:
        print(r.line())
    failed = sum(r.failed for r in results)
    changed = sum(1 for r in results if r.changes and not r.failed)
    print(f"{len(results)} artifact(s): {sum(r.written for r in results)} written, "
          f"{changed} {'to change' if ns.check else 'changed'}, {failed} failed")
    return 1 if failed else 0
