"""`pt2b cache [--clear]`: where the lowering cache is and what it holds; --clear empties it."""

from __future__ import annotations


def run(ns) -> int:
    from ..lowering import cache

    folder = cache.cache_dir()
    if ns.clear:
        print(f"removed {cache.clear()} entries from {folder}")
        return 0
    files = cache.entries()
    size = sum(p.stat().st_size for p in files if p.exists())
    state = "on" if cache.enabled(None) else "off (PT2B_CACHE)"
    print(f"lowering cache {folder} ({state}): {len(files)} entries, {size / 1e6:.1f} MB")
    return 0
