"""The opset explorer's corpus: the programs it shows (.pt2b artifacts, or named corpora built by the
developer tools in tools/corpus/, which the wheel leaves out) and their decomposition routes, traced now
(route_trace.py) or as shipped with pt2b for a torch release (exporter/_data/explorer/routes@<release>.json,
written by tools/explorer_data.py)."""

from __future__ import annotations

import dataclasses
import importlib
import json
import os
import pathlib
import sys

import torch

from ..errors import LoweringError
from ..lowering import presets as _presets
from . import route_trace


# the names --corpus takes for the corpora tools/corpus/programs.py builds (it reads them from here)
NAMED_CORPORA = ("zoo", "exportdb", "transformers", "transformers-all")
DEFAULT_CORPORA = ("zoo", "transformers")  # the corpus of a command given no --corpus


@dataclasses.dataclass
class CorpusProgram:
    name: str
    ep: torch.export.ExportedProgram
    more: tuple = ()  # a multi-method artifact's other methods: the model's call sites are all of theirs


def _import_builders():
    """tools.corpus.programs where `tools` is importable, else None."""
    try:
        return importlib.import_module("tools.corpus.programs")
    except ModuleNotFoundError as e:
        if e.name not in ("tools", "tools.corpus", "tools.corpus.programs"):
            raise  # a dependency of the builders themselves is missing: its own message says which
        return None


def corpus_builders(what: str = "the named corpora"):
    """tools/corpus/programs.py, the builders of the named corpora. They are developer tools, not part of
    the installed package: found where `tools` is importable, or in the source checkout this package
    runs from (its root joins sys.path, as `python -m` run there would do). Elsewhere a LoweringError
    says what to do instead; ``what`` names what was asked for."""
    found = _import_builders()
    checkout = str(pathlib.Path(__file__).resolve().parents[2])
    in_checkout = pathlib.Path(checkout, "tools", "corpus", "programs.py").is_file()
    if found is None and in_checkout and checkout not in sys.path:
        sys.path.append(checkout)
        found = _import_builders()
    if found is None:
        raise LoweringError(
            f"cannot build {what}: the named corpora ({', '.join(NAMED_CORPORA)}) are built by "
            "pt2b's corpus builders, tools/corpus/ in pt2b's source checkout, which this installation "
            "does not include. Pass .pt2b artifacts (files or folders) with --corpus, or run from a "
            "source checkout of pt2b (an editable install of it, or its root on PYTHONPATH).")
    return found


def default_corpus(names=None, track=None) -> list[CorpusProgram]:
    """The programs of the named corpora (default: the model zoo and the transformers sample, every op
    any transformers architecture of the corpus calls), built by tools/corpus/ (corpus_builders).
    ``track`` (exporter.cli.progress.tracker) reports each capture."""
    return [CorpusProgram(label, ep) for label, ep in named_programs(names or DEFAULT_CORPORA, track)]


def named_programs(names, track=None):
    """(name, ExportedProgram) of every program of the named corpora that torch.export captures, built by
    tools/corpus/ (corpus_builders); ``track`` (exporter.cli.progress.tracker) reports each capture."""
    names = tuple(names)
    programs = corpus_builders(f"the {'corpus' if len(names) == 1 else 'corpora'} {', '.join(names)}")
    return programs.programs(names, track)


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


class RoutesBuilder:
    """The routes of a corpus as the page holds them, built one program at a time: each distinct tree
    stored once, each program naming its trees by index; the programs left out, with why."""

    def __init__(self):
        self._index: dict[str, int] = {}
        self.trees: list = []
        self.models: list = []
        self.left_out: list = []

    def add(self, name: str, trees, leaves, unlowered) -> None:
        ids = []
        for t in trees:
            key = json.dumps(t, sort_keys=True)
            if key not in self._index:
                self._index[key] = len(self.trees)
                self.trees.append(t)
            ids.append(self._index[key])
        self.models.append({"name": name, "trees": ids, "leaves": list(leaves), "unlowered": list(unlowered)})

    def leave_out(self, name: str, error: str) -> None:
        self.left_out.append({"name": name, "error": error})

    def result(self) -> dict:
        return {"trees": self.trees, "models": self.models, "left_out": self.left_out}


def corpus_routes(corpus: list[CorpusProgram], track=None) -> dict:
    """What the page shows of each corpus program: the decomposition trees of its calls, the ops its
    lowering reaches, the ops nothing decomposes; the programs whose lowering fails, with why.
    ``track`` (exporter.cli.progress.tracker) reports each program."""
    out = RoutesBuilder()
    for prog in (track(corpus, label=lambda p: p.name) if track is not None else corpus):
        try:
            rs = [route_trace.record(ep) for ep in (prog.ep, *prog.more)]
        except LoweringError as e:  # tracing routes lowers with every decomposition: where that fails
            out.leave_out(prog.name, str(e).splitlines()[0])
            continue
        out.add(prog.name, [t for r in rs for t in r.trees], dict.fromkeys(op for r in rs for op in r.leaves),
                dict.fromkeys(op for r in rs for op in r.unlowered))
    return out.result()


def shipped_releases() -> list[str]:
    """The torch releases (major.minor) pt2b ships the default corpus's routes for."""
    from .. import package_data

    folder = package_data.path("explorer")
    files = folder.glob("routes@*.json") if folder.is_dir() else ()
    return sorted(p.name[len("routes@"):-len(".json")] for p in files)


def shipped_routes(release: str | None = None) -> dict | None:
    """The routes of the default corpus computed for a torch release by tools/explorer_data.py and
    shipped with pt2b (exporter/_data/explorer/routes@<release>.json), or None where none is."""
    from .. import package_data

    name = f"routes@{release or _presets.torch_minor()}.json"
    return package_data.read_json("explorer", name) if package_data.path("explorer", name).exists() else None
