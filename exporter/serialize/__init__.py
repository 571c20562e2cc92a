"""The .pt2b format: reading and writing the container (preamble and header, weight segments, the
FlatBuffers program). Enter through ``from exporter.serialize import reader, writer`` (loaded on first
use: the writer imports torch._dynamo). The file: docs/format.md; the steps: docs/architecture.md#the-pipeline.

    write/     ExportedProgram -> file
    read/      file -> ExportedProgram, in the order a file is read
    mapping/   torch's schema <-> pt2b.fbs
What both directions share about the bytes, and flatc's code for schemas/pt2b.fbs, are below this
package and versioning alike: exporter/layout/ (and exporter/layout/generated/)."""

from __future__ import annotations


def __getattr__(name: str):
    if name == "reader":
        from .read import reader
        return reader
    if name == "writer":
        from .write import writer
        return writer
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
