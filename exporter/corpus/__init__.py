"""Corpora of programs for sweeping the pt2b pipeline and for the opset explorer: transformers_zoo (every
transformers architecture buildable offline) and programs (named corpora: zoo, exportdb, transformers)."""
