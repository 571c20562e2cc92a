"""Corpora of real models for sweeping the pt2b pipeline (transformers_zoo: models from transformers' registry)."""
