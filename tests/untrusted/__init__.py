"""Untrusted input: the verifier, crafted and hostile files, fuzzing, no unpickling."""
