"""Across torch releases and format versions: goldens, release goldens, frozen presets, target torch,
schema drift, upgrade."""
