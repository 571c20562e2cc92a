"""The read side of the format: a .pt2b file -> an ExportedProgram, checked at every step before the
next one trusts it (reader.py runs them in this order; why: docs/architecture.md#load-load,
docs/untrusted.md#the-checks-in-order):

    ../layout/container  preamble and header (older majors through versioning)
    buffer_bounds        the FlatBuffers buffer check of the program section
    unpack_tables        pt2b's own tables (tensor records, segments, op table, metadata)
    decode_schema        torch's schema tree of each method
    untrusted            the decoded program: targets, expressions, names, guards
    (versioning)         op schemas reconciled with the running torch's
    weights              segments mapped back (mmap) as tensors
    deserialize          torch's deserializer, made cheaper"""
