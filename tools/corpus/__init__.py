"""The corpora of programs that test, benchmark and sweep pt2b, and feed the opset explorer: zoo, methods,
transformers_zoo (with variants) and programs (the named corpora). Developer tools: the wheel leaves them out."""
