"""The read side of the format: a .pt2b file -> an ExportedProgram, checked at every step before the
next one trusts it (reader.py runs them in this order):

    ../layout/container  preamble and header (the format version: older majors through versioning)
    buffer_bounds        every offset, length and enum of the program section (a FlatBuffers verifier)
    unpack_tables        pt2b's own tables (tensor records, segments, op table, metadata)
    decode_schema        torch's schema tree of each method, straight from the buffer
    untrusted            the decoded program: targets, expressions, names, guards
    (versioning)         op schemas reconciled with the running torch's (schema_drift, upgraders)
    weights              segments mapped back (mmap) and materialized as tensors
    deserialize          torch's deserializer, with cheaper fake tensors and expression parsing
"""
