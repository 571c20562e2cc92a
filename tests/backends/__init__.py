"""Backends (exporter/backends/): presets derived from the installed backend, foreign op lists, hand-offs."""
