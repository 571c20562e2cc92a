"""What both directions agree on about weight segments: the names of the tensor kinds a record
carries and the digest format 1.3 records of every segment's bytes."""

from __future__ import annotations

import hashlib

from ..generated import pt2b_generated as G

KIND_NAMES = {G.TensorKind.PARAMETER: "parameter", G.TensorKind.BUFFER: "buffer",
              G.TensorKind.CONSTANT: "constant", G.TensorKind.EXAMPLE_INPUT: "example input"}

DIGEST_SIZE = 32  # sha256


def digest(data) -> bytes:
    """The digest format 1.3 records of a segment's bytes (sha256)."""
    return hashlib.sha256(data).digest()
