"""Trace the opset explorer's default corpus for the running torch and write the routes pt2b ships:
schemas/explorer/routes@<torch major.minor>.json (package data: exporter/_data/explorer/).

    python -m tools.explorer_data [--corpus zoo transformers]
    python -m tools.explorer_data --sweep bench/records/explorer_routes@2.13.json.gz

`--sweep` ships every architecture of the real-model corpus: the zoo is traced now, and each
transformers case's routes come from a sweep record file written (resumably, case by case, one
process each) by `python -m tools.real_models --stages routes --resume --out FILE`. A case torch.export
does not capture is not in the corpus; a captured case whose routes could not be traced is listed as
left out, with why.

`pt2b opset page` and `pt2b opset closure` without --corpus read this file instead of capturing the
corpus (which needs transformers and takes minutes to hours); --corpus still traces the user's own
programs.
"""

from __future__ import annotations

import argparse
import gzip
import json
import sys
import time
import warnings

SWEEP_CORPUS = ["zoo", "transformers-all"]


def sweep_routes(records: list[dict], zoo: dict) -> dict:
    """The page's routes of the zoo (``zoo``: corpus_routes' result) and of every captured case of a
    routes sweep (``records``: tools/real_models.py records), programs named as tools/corpus/programs.py
    names them."""
    from exporter.explorer.corpus import RoutesBuilder

    out = RoutesBuilder()
    for m in zoo["models"]:
        out.add(m["name"], [zoo["trees"][i] for i in m["trees"]], m["leaves"], m["unlowered"])
    for e in zoo["left_out"]:
        out.leave_out(e["name"], e["error"])
    for rec in sorted(records, key=lambda r: r["name"]):
        stages = rec.get("stages", {})
        if stages.get("capture", {}).get("status") != "ok":
            continue  # not captured by torch.export: not in the corpus
        name = f"transformers:{rec['name']}"
        routes = rec.get("routes")
        if routes is not None:
            out.add(name, routes["trees"], routes["leaves"], routes["unlowered"])
        else:
            st = stages.get("routes", {})
            out.leave_out(name, st.get("error") or st.get("why") or "its routes were not traced")
    return out.result()


def main(argv=None) -> int:
    from exporter import package_data
    from exporter.cli import progress
    from exporter.explorer import corpus as explorer_corpus
    from exporter.lowering import presets

    ap = argparse.ArgumentParser(prog="python -m tools.explorer_data", description=__doc__.splitlines()[0])
    ap.add_argument("--corpus", nargs="*", default=list(explorer_corpus.DEFAULT_CORPORA),
                    help="named corpora (default: %(default)s)")
    ap.add_argument("--sweep", metavar="FILE", help="the transformers cases' routes from this routes sweep "
                    "(tools/real_models.py --stages routes); the zoo traced now")
    ap.add_argument("-o", "--out", help="where to write (default: the package data file of this torch release)")
    ns = ap.parse_args(argv)
    start = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        names = ("zoo",) if ns.sweep else tuple(ns.corpus)
        corpus = explorer_corpus.default_corpus(names, progress.tracker("capturing", unit="program"))
        routes = explorer_corpus.corpus_routes(corpus, progress.tracker("tracing routes", unit="program"))
    if ns.sweep:
        opener = gzip.open if ns.sweep.endswith(".gz") else open
        with opener(ns.sweep, "rt") as f:
            records = json.load(f)["records"]
        routes = sweep_routes(records, routes)
    import torch

    doc = {"torch": torch.__version__.split("+")[0], "corpus": SWEEP_CORPUS if ns.sweep else list(ns.corpus), **routes}
    path = package_data.path("explorer", f"routes@{presets.torch_minor()}.json")
    if ns.out:
        import pathlib

        path = pathlib.Path(ns.out)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, separators=(",", ":"), sort_keys=True) + "\n")
    print(f"wrote {path.resolve()}: {len(routes['models'])} programs, {len(routes['left_out'])} left out, "
          f"{len(routes['trees'])} distinct trees, {time.perf_counter() - start:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
