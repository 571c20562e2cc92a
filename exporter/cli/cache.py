"""`pt2b cache [--clear]`: where the lowering cache is and what it holds (entries, leftovers of killed
stores, anything else named like them); --clear removes every entry and leftover; --json: as data."""

from __future__ import annotations

from . import json_out


def run(ns) -> int:
    from ..lowering import cache

    folder = cache.cache_dir()
    as_json = json_out.wanted(ns)
    if folder is None:
        if as_json:
            json_out.emit({"location": None, "state": "none", "why": cache.NO_HOME})
        else:
            print(f"lowering cache: none, {cache.NO_HOME}")
        return 0
    if ns.clear:
        done = cache.clear(folder)
        if as_json:
            json_out.emit({"location": folder, "removed_entries": done.entries,
                           "removed_leftovers": done.leftovers, "kept": done.kept})
            return 0
        print(f"removed {done.entries} entries and {done.leftovers} leftover temporary files from {folder}")
        for what in done.kept:
            print(f"  kept {what}")
        return 0
    found = cache.contents(folder)
    state, why = ("on", None) if cache.enabled(None) else ("off", "PT2B_CACHE turns it off")
    refused = cache.refusal(folder) if folder.exists() else None
    if refused is not None:
        state, why = "refused", refused
    if as_json:
        json_out.emit({"location": folder, "state": state, "why": why, "bytes": found.size,
                       "entries": [_file(p) for p in found.entries], "leftovers": [_file(p) for p in found.leftovers],
                       "strays": found.strays})
        return 0
    label = {"on": "on", "off": "off (PT2B_CACHE)", "refused": f"refused: {why}"}[state]
    print(f"lowering cache {folder} ({label}): {len(found.entries)} entries, {len(found.leftovers)} leftover temporary "
          f"files, {found.size / 1e6:.1f} MB")
    for p in found.strays:
        print(f"  not pt2b's (left as is): {p}")
    return 0


def _file(path) -> dict:
    """A file of the cache: its name and size in bytes (None: removed since it was listed)."""
    try:
        size = path.lstat().st_size
    except OSError:
        size = None
    return {"name": path.name, "bytes": size}
