"""The .pt2b format version constants, with the history of every bump.

Same major: readable (unknown newer fields ignored). Older major: upgraded. Newer: refused.
"""

from __future__ import annotations

# History (newest last). Each bump says what changed and why.
#   1.0  first release: preamble + 64-byte header, data section of 64-byte aligned
#        segments, FlatBuffers `Program` (schemas/pt2b.fbs) mirroring torch.export's
#        serialization schema 8.20, CRC32 checksums, operator schema table.
#   1.1  Program.lowering (table Lowering): a program written after load_for_backend records the
#        request it was lowered for (label, fingerprint, torch version, ops outside the opset),
#        so a backend handed a lowered artifact can check what it holds. Appended field: 1.0
#        readers ignore it; a 1.0 file is read as "not lowered by pt2b".
#   1.2  Program.default_method + Program.methods (table Method): several entry points in one
#        artifact (prefill/decode, encode/decode) over one set of weight segments. Appended fields:
#        the root still holds the default method, so 1.0/1.1 readers read that one; a 1.1 file is
#        read as one method named "forward".
#   1.3  Program.weight_digests: sha256 of every weight segment, recorded at write time. CRC32 finds
#        damage but is easy to forge; the lowering cache keys entries by content, so a second file
#        with the same program and other weights (CRCs patched to match) could be served, or stored,
#        as the first one's lowering. The digests make the program section a cryptographic commitment
#        to the weights without reading them on every load; verify=True checks them. Appended field:
#        1.2 readers ignore it; a 1.2 file has no digests (its weights are hashed when needed).
FORMAT_MAJOR = 1
FORMAT_MINOR = 3

FORMAT_VERSION = (FORMAT_MAJOR, FORMAT_MINOR)

# Every released format version (goldens in tests/golden/<v>/, schema in schemas/history/<v>/).
KNOWN_VERSIONS: dict[tuple[int, int], str] = {
    (1, 0): "first release",
    (1, 1): "Program.lowering: the request a lowered program was lowered for",
    (1, 2): "Program.methods: several entry points over one set of weights",
    (1, 3): "Program.weight_digests: sha256 of every weight segment",
}

# Program-table fields each minor version added: writing an older minor leaves them out, and
# refuses (naming them) when the program uses them. Field -> what it holds, for that message.
FIELDS_ADDED: dict[tuple[int, int], dict[str, str]] = {
    (1, 1): {"lowering": "the record of how pt2b lowered this program"},
    (1, 2): {"methods": "the program's other entry points (a multi-method artifact)",
             "default_method": "the name of its default method when that is not 'forward'"},
    (1, 3): {"weight_digests": "the sha256 of every weight segment (an older version is written without "
                               "them: nothing a program uses)"},
}


def version_str(version: tuple[int, int]) -> str:
    return f"{version[0]}.{version[1]}"


def parse_version(text) -> tuple[int, int]:
    """(major, minor) of a released version named "X.Y"; ValueError naming the known ones otherwise."""
    try:
        major, minor = (int(x) for x in str(text).split("."))
    except ValueError:
        raise ValueError(f"format_version must look like 'MAJOR.MINOR' (e.g. '1.0'), got {text!r}") from None
    if (major, minor) not in KNOWN_VERSIONS:
        known = ", ".join(version_str(v) for v in sorted(KNOWN_VERSIONS))
        raise ValueError(f"format version {major}.{minor} does not exist; known versions: {known}")
    return major, minor
