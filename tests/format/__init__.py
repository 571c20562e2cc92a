"""The file format: container, schema and codegen, format versions, reading and writing, weights,
methods, atomic and concurrent I/O."""
