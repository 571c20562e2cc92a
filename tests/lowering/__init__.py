"""Lowering (load_for_backend): presets, decomposition, the lowering engines, validation, the cache, eager mode."""
