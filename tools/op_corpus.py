"""Find the op-level corpus's cases for the running torch and write tests/op_corpus@<torch>.json.

    python -m tools.op_corpus [--jobs 2] [--check]

Each OpInfo op is tried in every form, dtype and dtype mix tests/support/op_corpus.py lists; a spec is kept
when eager runs it deterministically and torch.export captures it with eager's bits. --check
compares with the file instead of writing it (exit 1 when they differ). Takes ~15 min on 2 cores.
"""

from __future__ import annotations

import argparse
import collections
import json
import multiprocessing
import sys
import time


def _specs_for(op):
    from tests.support import op_corpus

    return [s.__dict__ for s in op_corpus.specs_for(op)]


def _init():
    import torch

    torch.set_num_threads(1)


def counts(specs: list[dict]) -> dict:
    by = lambda key: dict(sorted(collections.Counter(key(s) for s in specs).items()))  # noqa: E731
    return {"cases": len(specs), "ops": len({s["op"] for s in specs}), "by_form": by(lambda s: s["form"]),
            "by_dtype": by(lambda s: s["dtype"] + (f"+{s['other']}" if s["other"] else "")),
            "by_kind": by(lambda s: s["kind"])}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tools.op_corpus", description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--check", action="store_true")
    ns = ap.parse_args(argv)
    _init()
    import torch
    from tests.support import op_corpus

    ops = sorted(op_corpus.opinfos())
    start = time.perf_counter()
    specs = []
    with multiprocessing.get_context("fork").Pool(ns.jobs, initializer=_init, maxtasksperchild=40) as pool:
        for k, found in enumerate(pool.imap(_specs_for, ops, chunksize=4)):
            specs += found
            if k % 100 == 0:
                print(f"{k}/{len(ops)} ops, {len(specs)} cases, {time.perf_counter() - start:.0f} s", file=sys.stderr)
    doc = {"torch": torch.__version__.split("+")[0], "counts": counts(specs), "specs": specs}
    path = op_corpus.manifest_path()
    head = json.dumps({k: v for k, v in doc.items() if k != "specs"}, indent=1)[:-2]
    text = head + ',\n "specs": [\n' + ",\n".join(json.dumps(s) for s in specs) + "\n ]\n}\n"  # a spec a line
    if ns.check:
        same = path.exists() and json.loads(path.read_text())["specs"] == specs
        print(f"{path.name}: {'up to date' if same else 'differs from what this torch finds'}")
        return 0 if same else 1
    path.write_text(text)
    print(f"wrote {path} ({len(specs)} cases of {doc['counts']['ops']} ops) in {time.perf_counter() - start:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
