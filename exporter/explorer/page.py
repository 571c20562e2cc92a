"""The opset explorer's page (`pt2b opset page`): its data, computed from the running torch and a corpus
of programs (corpus.py), never typed, embedded in one self-contained HTML file (page.html). What it
shows and how it knows: docs/explorer.md#the-page, docs/explorer.md#how-the-page-knows."""

from __future__ import annotations

import json
import pathlib

import torch

from ..lowering import presets as _presets
from ..lowering import tables
from ..ops import op_name, registered_op_names
from . import route_trace
from .corpus import CorpusProgram, corpus_routes

PAGE_TEMPLATE = pathlib.Path(__file__).with_name("page.html")


def build_data(corpus: list[CorpusProgram] | None = None, track=None, routes: dict | None = None) -> dict:
    """Everything the page needs, as plain JSON-able data: this torch's presets, decompositions and
    audit, with the routes of ``corpus`` (traced now; ``track`` reports each program) or ``routes``
    (corpus_routes' result, such as shipped_routes())."""
    from ..lowering import verdicts

    available = sorted(op_name(op) for op in {**tables.available_decompositions(), **tables.pt2b_decompositions()})
    avail_set = set(available)
    default_table = {op_name(op) for op in tables.torch_default_table()}
    running, releases = target_releases()
    preset_data = {}
    for release in releases:  # every frozen release's presets, as load_for_backend applies them on this torch
        for name in _presets.PRESETS:
            key = name if release == running else f"{name}@{release}"
            p = _presets.load(key)
            source = default_table if name == "core" else avail_set  # = lower._preset_base
            preset_data[key] = {"key": p.key, "description": p.description,
                                "table": sorted(n for n in p.decompose if n in source),
                                "opset": None if p.opset is None else list(p.opset)}
    backend_names = []
    for name, entry in _backend_presets().items():  # the installed backends, this torch only
        preset_data[name] = entry
        backend_names.append(name)
    if routes is None:
        routes = corpus_routes(corpus or [], track)
    stored = verdicts.read() or {"ops": {}}
    audit = {n: {"verdict": rec["verdict"], "detail": verdicts.describe(rec), "emits": rec.get("emits", [])}
             for n, rec in stored["ops"].items() if n in avail_set}
    return {"torch": torch.__version__, "pt2b_format": _format_version(), "available": available,
            "release": running, "releases": releases, "preset_names": list(_presets.PRESETS) + backend_names,
            "backend_presets": backend_names, "presets": preset_data,
            "trees": routes["trees"], "models": routes["models"], "left_out": routes["left_out"], "audit": audit,
            "infrastructure": sorted(route_trace.INFRASTRUCTURE), "kernels": _kernel_ops(routes["trees"]),
            "op_names": registered_op_names()}  # (the page's matcher tells a typo as OpMatcher does)


def _kernel_ops(trees: list) -> list[str]:
    """The custom ops whose own kernels the routes traced (an op-list lowering inlines them)."""
    found = set()

    def walk(tree):
        if "children" in tree and not tree["op"].startswith(("aten::", "prims::")):
            found.add(tree["op"])
        for child in tree.get("children", ()):
            walk(child)

    for tree in trees:
        walk(tree)
    return sorted(found)


def _backend_presets() -> dict:
    """The installed backends' presets (exporter.backends) as the page applies a preset: the ops a
    backend names and the table plan_lowering decomposes with for it (routes are those of torch's
    decomposition of each op, where a backend brings its own)."""
    from .. import backends
    from ..errors import BackendUnavailableError
    from ..lowering.plan import plan_lowering

    out = {}
    for name in backends.names():
        try:
            b = backends.get(name)
        except BackendUnavailableError:
            continue
        plan = plan_lowering(backend=b)
        table = sorted(op_name(op) for op in plan.table)
        if b.takes_what_its_table_leaves:
            opset, how = None, f"its own table ({len(table)} ops), and every op that leaves"
        else:
            opset, how = sorted(b.supported_ops), f"its own op list ({len(b.supported_ops)} ops)"
        out[name] = {"key": b.key, "description": f"{b.name} {b.version}: {how}, read from the installed backend "
                                                  f"({b.source}).", "table": table, "opset": opset,
                   # the list whose missing custom ops are lowered through their kernels (None: none are)
                   "lists": sorted(b.supported_ops) if plan.inlines is not None else None}
    return out


def target_releases() -> tuple[str, list[str]]:
    """(the running torch's release, every release a backend can target: those whose presets are
    frozen in schemas/opsets/ and the running one), oldest first."""
    running = _presets.torch_minor()
    found = set(_presets.frozen_releases("core")) | {running}
    return running, sorted(found, key=_presets.release_key)


def _format_version() -> str:
    from ..versioning.formats import FORMAT_VERSION

    return ".".join(map(str, FORMAT_VERSION))


def write_page(data: dict, path) -> pathlib.Path:
    """The self-contained HTML page (no server, no network) with ``data`` embedded."""
    from ..util.atomic import atomic_write

    payload = json.dumps(data, separators=(",", ":"), sort_keys=True)
    payload = payload.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")
    html = PAGE_TEMPLATE.read_text().replace("/*PT2B_DATA*/null", payload)
    with atomic_write(path) as f:
        f.write(html.encode())
    return pathlib.Path(path)
