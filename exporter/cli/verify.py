"""`pt2b verify ART.pt2b`: every checksum of an artifact (each method's graph and the weights) and every
check a load makes against the running torch; with ``--checksums``, the file's own checks alone, without
importing torch (serialize/read/integrity.py)."""

from __future__ import annotations

from . import progress


def run(ns) -> int:
    from ..serialize.read import segment_hashes  # no torch: the weights are hashed while torch is imported
    from ..util.gc_pause import gc_paused

    # without cyclic collection: importing torch leaves hundreds of thousands of objects that each
    # collection the reader's imports and the program's decoding trigger would scan again
    with segment_hashes.Early(ns.artifact) as early, gc_paused():
        return _verify(ns, early)


def _verify(ns, early) -> int:
    if ns.checksums:
        from ..serialize.read import integrity

        with progress.status(f"verifying {ns.artifact}'s checksums"):
            done = integrity.verify_checksums(ns.artifact, early)
        return _report(ns, f"{ns.artifact}: file OK ({_methods(done.methods)} and {done.nbytes} bytes of weights; "
                       "checksums only: `pt2b verify` without --checksums also checks the program against torch)",
                       done.version, done.methods, done.nbytes,
                       [{"check": c} for c in ("header", "program_checksum", "table_bounds", "weight_checksums")])
    from ..serialize import reader
    from ..util.process_state import preserved

    with progress.status(f"verifying {ns.artifact}"), preserved():
        art = reader.open_artifact(ns.artifact)
        reader.read_metadata(art)  # load() reads it too
        checked = []
        for name in art.method_names:  # every method's graph: its walk and checks, which load() leaves to first use
            m = reader.method(art, name)
            checked.append((m, reader.check(m).serialized))
        n = reader.verify_weights(art, early)
    code = _report(ns, f"{ns.artifact}: OK ({_methods(len(art.method_names))} and {n} bytes of weights verified)",
                   art.version, len(art.method_names), n,
                   [{"check": "metadata"}, *({"check": "program", "method": name} for name in art.method_names),
                    {"check": "weights"}])
    _print_needs(ns, art, checked)
    return code


def _report(ns, text: str, version, methods: int, nbytes: int, checks: list[dict]) -> int:
    """The verdict: ``text``, or with --json its data (``checks``: what was checked, in order; each
    passed, or the command would have ended in its error)."""
    from ..versioning.formats import version_str
    from . import json_out

    if not json_out.wanted(ns):
        print(text)
        return 0
    json_out.emit({"file": ns.artifact, "ok": True, "checksums_only": bool(ns.checksums),
                   "format_version": version_str(version), "methods": methods, "weight_bytes": nbytes,
                   "checks": [{**c, "ok": True} for c in checks]})
    return 0


def _print_needs(ns, art, checked) -> None:
    """What the file needs of a process beyond torch (serialize/read/needs.py), each with where this one
    finds it, where it needs anything; a need this process lacks is the error of the check that refused it."""
    from ..serialize.read.needs import needs_to_load
    from . import json_out

    lines = needs_to_load(art, checked).lines()
    if lines and not json_out.wanted(ns):  # (none: torch alone)
        print(f"{ns.artifact}: needs to load:\n" + "\n".join(lines))


def _methods(n: int) -> str:
    return f"{n} methods" if n > 1 else "program"
