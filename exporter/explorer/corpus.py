"""The opset explorer's corpus: the programs it shows (named corpora of exporter/corpus/programs.py or
.pt2b artifacts) and their decomposition routes, traced now (route_trace.py) or as shipped with pt2b
for a torch release (exporter/_data/explorer/routes@<release>.json, written by tools/explorer_data.py)."""

from __future__ import annotations

import dataclasses
import json
import os

import torch

from ..errors import LoweringError
from ..lowering import presets as _presets
from . import route_trace


@dataclasses.dataclass
class CorpusProgram:
    name: str
    ep: torch.export.ExportedProgram
    more: tuple = ()  # a multi-method artifact's other methods: the model's call sites are all of theirs


def default_corpus(names=None, track=None) -> list[CorpusProgram]:
    """The programs of the named corpora (exporter/corpus/programs.py; default: the model zoo and the
    transformers sample, every op any transformers architecture of the corpus calls). ``track``
    (exporter.cli.progress.tracker) reports each capture."""
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


def shipped_routes(release: str | None = None) -> dict | None:
    """The routes of the default corpus computed for a torch release by tools/explorer_data.py and
    shipped with pt2b (exporter/_data/explorer/routes@<release>.json), or None where none is."""
    from .. import package_data

    name = f"routes@{release or _presets.torch_minor()}.json"
    return package_data.read_json("explorer", name) if package_data.path("explorer", name).exists() else None
