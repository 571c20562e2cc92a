"""Named corpora of captured programs, shared by the opset explorer, `pt2b opset coverage` and the tests
(a developer tool: the installed package finds it through exporter.explorer.corpus.corpus_builders).

- "zoo": the model zoo (tools/corpus/zoo.py);
- "exportdb": the ExportDB examples inside torch that torch.export captures (strict, as ExportDB
  documents them);
- "transformers": the real-model sample (transformers_sample.txt: every op any transformers
  architecture of the corpus calls, and every task), built offline with random weights;
- "transformers-all": every architecture of the real-model corpus (about a thousand; hours).
A case torch.export cannot capture is left out (the real-model sweep reports those with torch's reason).
"""

from __future__ import annotations

import copy
import logging
import pathlib
import warnings
from collections.abc import Iterator

import torch

from exporter.explorer.corpus import DEFAULT_CORPORA as DEFAULT
from exporter.explorer.corpus import NAMED_CORPORA as NAMES  # the words --corpus takes: the CLI's home

SAMPLE_FILE = pathlib.Path(__file__).with_name("transformers_sample.txt")


def transformers_sample() -> list[str]:
    """The case names of the real-model sample, in file order."""
    lines = (ln.split("#")[0].strip() for ln in SAMPLE_FILE.read_text().splitlines())
    return [ln for ln in lines if ln]


def _zoo():
    from .zoo import make_case, zoo_names

    for name in zoo_names():
        c = make_case(name)
        yield f"zoo:{name}", lambda c=c: torch.export.export(copy.deepcopy(c.model), c.args, c.kwargs or {},
                                                             dynamic_shapes=c.dynamic_shapes, strict=c.strict)


def _exportdb():
    from torch._export.db.examples import all_examples

    for name, case in sorted(all_examples().items()):
        yield f"exportdb:{name}", lambda case=case: torch.export.export(
            copy.deepcopy(case.model), case.example_args, case.example_kwargs or {},
            dynamic_shapes=case.dynamic_shapes, strict=True)


def capture_real(case, notes: dict | None = None) -> torch.export.ExportedProgram:
    """torch.export of a real-model case (transformers_zoo.RealCase) as the corpus captures it: with
    its dynamic shapes, else static shapes where torch refuses them; a strict capture (transformers'
    static-cache recipe) that fails is tried non-strict. ``notes`` receives how it was captured
    ("dynamic", "strict" and, where a first try failed, torch's error)."""
    notes = {} if notes is None else notes
    from exporter.capture import with_plain_weights

    model = with_plain_weights(case.model)  # tensor-subclass weights unwrapped, as export_model does

    def export(dynamic_shapes, strict):
        return torch.export.export(model, copy.deepcopy(case.args), copy.deepcopy(case.kwargs or {}),
                                   dynamic_shapes=dynamic_shapes, strict=strict)

    def static(strict):
        try:
            return export(None, strict)
        except Exception as e:  # noqa: BLE001
            if not strict:
                raise
            notes["strict"] = "non-strict-after-strict-failed"
            notes["strict_error"] = f"{type(e).__name__}: {str(e).strip()[:300]}"
            return export(None, False)

    if case.dynamic_shapes is None:
        notes["dynamic"] = "static"
        return static(case.strict)
    try:
        ep = export(case.dynamic_shapes, case.strict)
    except Exception as e:  # noqa: BLE001 -- torch refused the dynamic dimension
        notes["dynamic"] = "static-after-dynamic-failed"
        notes["dynamic_error"] = f"{type(e).__name__}: {str(e).strip()[:300]}"
        return static(case.strict)
    dynamic = any(isinstance(s, torch.SymInt) for n in ep.graph.nodes if n.op == "placeholder"
                  and isinstance(n.meta.get("val"), torch.Tensor) for s in n.meta["val"].shape)
    notes["dynamic"] = "dynamic" if dynamic else "dynamic-requested-but-static"
    return ep


def _transformers_zoo():
    """tools/corpus/transformers_zoo.py, once transformers is known to be installed (the optional
    extra pt2b[corpus]): without it, an ExportError that says so."""
    import importlib.util

    if importlib.util.find_spec("transformers") is None:
        from exporter.errors import ExportError

        raise ExportError("the transformers corpora build their models with the transformers library, which is "
                          "not installed: pip install 'pt2b[corpus]', or name other corpora (zoo, exportdb) or "
                          ".pt2b files with --corpus.")
    from . import transformers_zoo

    return transformers_zoo


def _transformers(names):
    transformers_zoo = _transformers_zoo()
    for name in names:
        yield f"transformers:{name}", lambda name=name: capture_real(transformers_zoo.make_case(name))


def _sources(name: str):
    if name == "zoo":
        return _zoo()
    if name == "exportdb":
        return _exportdb()
    if name == "transformers":
        return _transformers(transformers_sample())
    if name == "transformers-all":
        return _transformers(_transformers_zoo().case_names())
    raise ValueError(f"unknown corpus {name!r}; named corpora: {', '.join(NAMES)}")


def count(names=DEFAULT) -> int:
    """How many programs the named corpora try to capture (those torch.export refuses included)."""
    n = 0
    for name in names:
        if name == "zoo":
            from .zoo import zoo_names

            n += len(zoo_names())
        elif name == "exportdb":
            from torch._export.db.examples import all_examples

            n += len(all_examples())
        elif name == "transformers":
            n += len(transformers_sample())
        elif name == "transformers-all":
            n += len(_transformers_zoo().case_names())
        else:
            _sources(name)  # raises: unknown corpus
    return n


def programs(names=DEFAULT, track=None) -> Iterator[tuple[str, torch.export.ExportedProgram]]:
    """(name, ExportedProgram) for every program of the named corpora that torch.export captures.
    ``track`` (exporter.cli.progress.tracker) reports each capture: one item per program tried, done when
    the caller asks for the next program."""
    names = tuple(names)
    sources = (src for corpus in names for src in _sources(corpus))
    if track is not None:
        sources = track(sources, total=count(names), label=lambda src: src[0])
    torch_log = logging.getLogger("torch")
    level = torch_log.level
    torch_log.setLevel(logging.CRITICAL)  # ExportDB also documents what export refuses, loudly
    try:
        for label, capture in sources:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                try:
                    ep = capture()
                except Exception:  # noqa: BLE001 -- what torch.export cannot capture is not in the corpus
                    continue
            yield label, ep
    finally:
        torch_log.setLevel(level)
