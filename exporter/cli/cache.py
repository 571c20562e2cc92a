"""`pt2b cache [--clear]`: where the lowering cache is and what it holds (entries, leftovers of killed
stores, anything else named like them); --clear removes every entry and leftover."""

from __future__ import annotations


def run(ns) -> int:
    from ..lowering import cache

    folder = cache.cache_dir()
    if folder is None:
        print(f"lowering cache: none, {cache.NO_HOME}")
        return 0
    if ns.clear:
        done = cache.clear(folder)
        print(f"removed {done.entries} entries and {done.leftovers} leftover temporary files from {folder}")
        for what in done.kept:
            print(f"  kept {what}")
        return 0
    found = cache.contents(folder)
    state = "on" if cache.enabled(None) else "off (PT2B_CACHE)"
    why = cache.refusal(folder) if folder.exists() else None
    if why is not None:
        state = f"refused: {why}"
    print(f"lowering cache {folder} ({state}): {len(found.entries)} entries, {len(found.leftovers)} leftover "
          f"temporary files, {found.size / 1e6:.1f} MB")
    for p in found.strays:
        print(f"  not pt2b's (left as is): {p}")
    return 0
