"""`pt2b verify ART.pt2b`: every checksum of an artifact (each method's graph and the weights)."""

from __future__ import annotations

from . import progress


def run(ns) -> int:
    from ..serialize.read import segment_hashes  # no torch: the weights are hashed while torch is imported

    early = segment_hashes.Early(ns.artifact)
    from ..serialize import reader

    with progress.status(f"verifying {ns.artifact}"):
        art = reader.open_artifact(ns.artifact)
        for name in art.method_names:  # every method's graph: its walk and checks, which load() leaves to first use
            reader.check(reader.method(art, name))
        n = reader.verify_weights(art, early)
    methods = f"{len(art.method_names)} methods" if len(art.method_names) > 1 else "program"
    print(f"{ns.artifact}: OK ({methods} and {n} bytes of weights verified)")
    return 0
