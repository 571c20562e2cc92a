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
        print(f"{ns.artifact}: file OK ({_methods(done.methods)} and {done.nbytes} bytes of weights; checksums "
              "only: `pt2b verify` without --checksums also checks the program against torch)")
        return 0
    from ..serialize import reader
    from ..util.process_state import preserved

    with progress.status(f"verifying {ns.artifact}"), preserved():
        art = reader.open_artifact(ns.artifact)
        reader.read_metadata(art)  # load() reads it too
        for name in art.method_names:  # every method's graph: its walk and checks, which load() leaves to first use
            reader.check(reader.method(art, name))
        n = reader.verify_weights(art, early)
    print(f"{ns.artifact}: OK ({_methods(len(art.method_names))} and {n} bytes of weights verified)")
    return 0


def _methods(n: int) -> str:
    return f"{n} methods" if n > 1 else "program"
