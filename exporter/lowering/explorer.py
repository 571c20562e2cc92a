"""The opset explorer: data generated from the running torch and a corpus of programs, the
`pt2b opset page` HTML file built from it, and `pt2b opset closure`.

Everything the page shows is computed here, never typed: every op with a registered decomposition,
the presets of schemas/opsets/, the audit verdicts, and for each corpus program the decomposition
routes of its call sites recorded during one real lowering (route_trace.py). The page evaluates a
selection (preset or supported ops, toggled decompositions, kept ops) with the same rules as
plan_lowering; tests/test_explorer.py checks it against load_for_backend in a real browser.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import logging
import os
import pathlib
import warnings

import torch

from ..errors import LoweringError
from ..ops import op_name
from . import presets as _presets
from . import route_trace, tables
from .coverage import greedy_next

PAGE_TEMPLATE = pathlib.Path(__file__).with_name("explorer_page.html")
ATEN_LIKE = ("aten::", "prims::")


@dataclasses.dataclass
class CorpusProgram:
    name: str
    ep: torch.export.ExportedProgram
    more: tuple = ()  # a multi-method artifact's other methods: the model's call sites are all of theirs


def default_corpus(names=None, track=None) -> list[CorpusProgram]:
    """The programs of the named corpora (exporter/corpus/programs.py; default: the model zoo and the
    transformers sample, every op any transformers architecture of the corpus calls). ``track``
    (exporter.progress.tracker) reports each capture."""
    from ..corpus import programs

    return [CorpusProgram(label, ep) for label, ep in programs.programs(names or programs.DEFAULT, track)]


def artifact_corpus(paths, track=None) -> list[CorpusProgram]:
    """The programs of .pt2b artifacts (files, or folders searched recursively); ``track`` reports each load."""
    from ..serialize.read.reader import read_programs
    from .coverage import artifacts

    files = artifacts(paths)
    if not files:
        raise LoweringError(f"no .pt2b artifacts found in {', '.join(map(str, paths))}.")
    files = track(files, label=os.path.basename) if track is not None else files
    out = []
    for f in files:
        first, *more = read_programs(f).values()  # every method: one model, counted over all of them
        out.append(CorpusProgram(os.path.basename(f), first, tuple(more)))
    return out


def corpus_routes(corpus: list[CorpusProgram], track=None) -> dict:
    """What the page shows of each corpus program: the decomposition trees of its calls, the ops its
    lowering reaches, the ops nothing decomposes; the programs whose lowering fails, with why.
    ``track`` (exporter.progress.tracker) reports each program."""
    trees: dict[str, int] = {}
    tree_list: list = []
    models, left_out = [], []
    for prog in (track(corpus, label=lambda p: p.name) if track is not None else corpus):
        try:
            rs = [route_trace.record(ep) for ep in (prog.ep, *prog.more)]
        except LoweringError as e:  # tracing routes lowers with every decomposition: where that fails
            left_out.append({"name": prog.name, "error": str(e).splitlines()[0]})
            continue
        leaves = list(dict.fromkeys(op for r in rs for op in r.leaves))
        unlowered = list(dict.fromkeys(op for r in rs for op in r.unlowered))
        ids = []
        for t in (t for r in rs for t in r.trees):
            key = json.dumps(t, sort_keys=True)
            if key not in trees:
                trees[key] = len(tree_list)
                tree_list.append(t)
            ids.append(trees[key])
        models.append({"name": prog.name, "trees": ids, "leaves": leaves, "unlowered": unlowered})
    return {"trees": tree_list, "models": models, "left_out": left_out}


def shipped_routes(release: str | None = None) -> dict | None:
    """The routes of the default corpus computed for a torch release by tools/explorer_data.py and
    shipped with pt2b (exporter/_data/explorer/routes@<release>.json), or None where none is."""
    from .. import package_data

    name = f"routes@{release or _presets.torch_minor()}.json"
    return package_data.read_json("explorer", name) if package_data.path("explorer", name).exists() else None


def build_data(corpus: list[CorpusProgram] | None = None, track=None, routes: dict | None = None) -> dict:
    """Everything the page needs, as plain JSON-able data: this torch's presets, decompositions and
    audit, with the routes of ``corpus`` (traced now; ``track`` reports each program) or ``routes``
    (corpus_routes' result, such as shipped_routes())."""
    from . import audit

    available = sorted(op_name(op) for op in tables.available_decompositions())
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
    if routes is None:
        routes = corpus_routes(corpus or [], track)
    stored = audit.read() or {"ops": {}}
    verdicts = {n: {"verdict": rec["verdict"], "detail": audit.describe(rec), "emits": rec.get("emits", [])}
                for n, rec in stored["ops"].items() if n in avail_set}
    return {"torch": torch.__version__, "pt2b_format": _format_version(), "available": available,
            "release": running, "releases": releases, "preset_names": list(_presets.PRESETS), "presets": preset_data,
            "trees": routes["trees"], "models": routes["models"], "left_out": routes["left_out"], "audit": verdicts,
            "infrastructure": sorted(route_trace.INFRASTRUCTURE)}


def target_releases() -> tuple[str, list[str]]:
    """(the running torch's release, every release a backend can target: those whose presets are
    frozen in schemas/opsets/ and the running one), oldest first."""
    running = _presets.torch_minor()
    found = set(_presets.frozen_releases("core")) | {running}
    return running, sorted(found, key=_presets.release_key)


def _format_version() -> str:
    from ..versioning.formats import FORMAT_VERSION

    return ".".join(map(str, FORMAT_VERSION))


# ----------------------------------------------------------------------------------------------
# A selection, evaluated the way the page does it (and, in tests, compared with load_for_backend)
# ----------------------------------------------------------------------------------------------


@dataclasses.dataclass
class Selection:
    preset: str | None = "core"            # None: supported-ops mode
    supported: tuple[str, ...] = ()
    keep: tuple[str, ...] = ()
    decompose: tuple[str, ...] = ()

    def load_kwargs(self) -> dict:
        kw = {"preset": self.preset} if self.preset is not None else {"supported_ops": list(self.supported)}
        if self.keep:
            kw["keep"] = list(self.keep)
        if self.decompose:
            kw["decompose"] = list(self.decompose)
        return kw


def table_and_accepts(data: dict, sel: Selection):
    """(op names decomposed, accepts(op name)) for ``sel`` with plan_lowering's rules."""
    keep, extra = set(sel.keep), set(sel.decompose) & set(data["available"])
    if sel.preset is None:
        sup = set(sel.supported)
        table = {n for n in data["available"] if n not in sup and n not in keep} | (extra - keep)
        opset = sup
    else:
        p = data["presets"][sel.preset]
        table = ({n for n in p["table"] if n not in keep} | extra) - keep
        opset = None if p["opset"] is None else set(p["opset"])

    def accepts(op: str) -> bool:
        if opset is None:
            return op not in table or op in keep
        return op in opset or op in keep or (not op.startswith(ATEN_LIKE) and op not in table)

    return table, accepts


def evaluate(data: dict, sel: Selection) -> dict:
    """Per model: its lowered op set and the ops outside what the selection accepts; the op counts
    across the corpus; coverage; the greedy "implement next" list."""
    table, accepts = table_and_accepts(data, sel)
    infra = set(data["infrastructure"])
    per_model = {}
    for m in data["models"]:
        routes = route_trace.ProgramRoutes([data["trees"][i] for i in m["trees"]], m["leaves"], m["unlowered"], True)
        ops = [o for o in route_trace.evaluate(routes, table) if o not in infra]
        per_model[m["name"]] = {"ops": ops, "missing": [o for o in ops if not accepts(o)]}
    counts: dict[str, int] = {}
    for r in per_model.values():
        for o in r["ops"]:
            counts[o] = counts.get(o, 0) + 1
    covered = sum(1 for r in per_model.values() if not r["missing"])
    return {"models": per_model, "counts": dict(sorted(counts.items())), "covered": covered,
            "next": greedy_next([set(r["missing"]) for r in per_model.values()])}


def route_of(data: dict, op: str, table: set) -> dict | None:
    """The first recorded call site of ``op`` in the corpus, expanded under ``table``."""
    def find(tree):
        if tree["op"] == op:
            return tree
        for c in tree.get("children", ()):
            hit = find(c)
            if hit is not None:
                return hit
        return None

    for t in data["trees"]:
        hit = find(t)
        if hit is not None:
            return _expand(hit, table)
    return None


def _expand(tree: dict, table: set) -> dict:
    if "children" in tree and tree["op"] in table:
        return {"op": tree["op"], "children": [_expand(c, table) for c in tree["children"]]}
    return {"op": tree["op"]}


def render_route(tree: dict, indent: str = "") -> list[str]:
    lines = [indent + tree["op"] + ("  ->" if tree.get("children") else "")]
    for c in tree.get("children", ()):
        lines += render_route(c, indent + "    ")
    return lines


def closure_report(data: dict, sel: Selection) -> str:
    res = evaluate(data, sel)
    table, _ = table_and_accepts(data, sel)
    n = len(res["models"])
    what = f"supported ops ({len(sel.supported)})" if sel.preset is None else f"preset {sel.preset}"
    lines = [f"{what}: {len(table)} decompositions apply; {res['covered']} of {n} corpus models lower to accepted ops only"]
    lines.append(f"ops in the lowered corpus ({len(res['counts'])}; models using each):")
    missing_all: dict[str, list[str]] = {}
    for name, r in res["models"].items():
        for o in r["missing"]:
            missing_all.setdefault(o, []).append(name)
    for o, c in sorted(res["counts"].items(), key=lambda kv: (-kv[1], kv[0])):
        lines.append(f"  {c:4d}  {o}" + ("   (cannot be reached: not accepted)" if o in missing_all else ""))
    if missing_all:
        lines.append(f"cannot reach the accepted set ({len(missing_all)} ops):")
        for o, names in sorted(missing_all.items()):
            lines.append(f"  {o}: needed by {len(names)} model(s), e.g. {names[0]}")
            for parent in _parents_of(data, o, table)[:1]:
                route = route_of(data, parent, table)
                if route is not None:
                    lines += ["      " + ln for ln in render_route(route)]
    if res["next"]:
        lines.append("implement next (models covered after each):")
        lines += [f"  {o} -> {k} of {n}" for o, k in res["next"]]
    return "\n".join(lines)


def _parents_of(data: dict, op: str, table: set) -> list[str]:
    """Decomposed ops whose route emits ``op`` under ``table`` (for explaining where it comes from)."""
    out = []

    def walk(tree):
        if "children" in tree and tree["op"] in table:
            if any(c["op"] == op for c in tree["children"]) and tree["op"] not in out:
                out.append(tree["op"])
            for c in tree["children"]:
                walk(c)

    for t in data["trees"]:
        walk(t)
    return out


def write_page(data: dict, path) -> pathlib.Path:
    """The self-contained HTML page (no server, no network) with ``data`` embedded."""
    from ..util.atomic import atomic_write

    payload = json.dumps(data, separators=(",", ":"), sort_keys=True)
    payload = payload.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")
    html = PAGE_TEMPLATE.read_text().replace("/*PT2B_DATA*/null", payload)
    with atomic_write(path) as f:
        f.write(html.encode())
    return pathlib.Path(path)
