"""Trace the opset explorer's default corpus for the running torch and write the routes pt2b ships:
schemas/explorer/routes@<torch major.minor>.json (package data: exporter/_data/explorer/).

    python -m tools.explorer_data [--corpus zoo transformers]

`pt2b opset page` and `pt2b opset closure` without --corpus read this file instead of capturing the
corpus (which needs transformers and takes minutes); --corpus still traces the user's own programs.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import warnings


def main(argv=None) -> int:
    from exporter import package_data
    from exporter.cli import progress
    from exporter.corpus import programs
    from exporter.explorer import corpus as explorer_corpus
    from exporter.lowering import presets

    ap = argparse.ArgumentParser(prog="python -m tools.explorer_data", description=__doc__.splitlines()[0])
    ap.add_argument("--corpus", nargs="*", default=list(programs.DEFAULT), help="named corpora (default: %(default)s)")
    ns = ap.parse_args(argv)
    start = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        corpus = explorer_corpus.default_corpus(tuple(ns.corpus), progress.tracker("capturing", unit="program"))
        routes = explorer_corpus.corpus_routes(corpus, progress.tracker("tracing routes", unit="program"))
    import torch

    doc = {"torch": torch.__version__.split("+")[0], "corpus": list(ns.corpus), **routes}
    path = package_data.path("explorer", f"routes@{presets.torch_minor()}.json")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, separators=(",", ":"), sort_keys=True) + "\n")
    print(f"wrote {path.resolve()}: {len(routes['models'])} programs, {len(routes['left_out'])} left out, "
          f"{time.perf_counter() - start:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
