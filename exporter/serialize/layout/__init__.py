"""What the write and read sides agree on about the bytes: container (the preamble and 64-byte
header), fbs (the table layout of schemas/pt2b.fbs as data), segments (tensor kinds, segment
digests)."""
