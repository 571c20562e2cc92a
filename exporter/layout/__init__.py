"""What the write and read sides agree on about the bytes, the layer below both and below versioning:
container (the preamble and 64-byte header), fbs (the table layout of schemas/pt2b.fbs as data),
segments (tensor kinds, segment digests); generated/ holds flatc's code for the schema."""
