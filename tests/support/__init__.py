"""Helpers the tests share (tools/ reuses some): assertions, golden I/O, artifact surgery, the
corpora's case builders."""
