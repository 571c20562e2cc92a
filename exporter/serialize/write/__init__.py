"""The write side of the format: an ExportedProgram -> a .pt2b file, atomically (writer.py runs the
steps): torch's serializer, serde_repairs (programs it writes but cannot read), versioning's op
table (and target_torch, older majors), encode_schema (schema tree -> FlatBuffers tables), weights
(segments planned and written), then the header (../layout/container) and a read back."""
