"""`pt2b opset show|diff|coverage|page|closure|audit`: the lowering presets (schemas/opsets/) and the
opset explorer (exporter/explorer/) on the command line."""

from __future__ import annotations

import sys

from . import json_out, progress
from .lower import read_ops_file


def run(ns) -> int:
    from ..lowering import presets

    if ns.opset_command == "show":
        preset = presets.load(ns.preset)
        print(presets.describe(preset))
        from ..lowering import verdicts

        stored = verdicts.read(preset.torch_version)
        if stored:
            mine = {k: stored["ops"][k] for k in preset.decompose if k in stored["ops"]}
            print(f"decompositions by measured numerics (pt2b opset audit): {verdicts.totals(mine)}")
            for name, rec in verdicts.worst_cases(mine, 10):
                print(f"  {rec['verdict']:6s} {name}: {verdicts.describe(rec)}")
        return 0
    if ns.opset_command == "coverage":
        import tempfile

        from ..explorer import coverage

        supported = read_ops_file(ns.supported) if ns.supported else None
        with tempfile.TemporaryDirectory() as tmp:
            paths = _corpus_artifacts(ns.corpus, tmp)
            rows = coverage.measure(paths, ns.preset, supported_ops=supported, keep=ns.keep or None,
                                    track=progress.tracker("lowering", unit="model"), workers=ns.workers,
                                    ray=ns.ray, records=ns.records)
            label = f"supported ops of {ns.supported}" if supported else f"preset {ns.preset}"
            if json_out.wanted(ns):
                json_out.emit(_coverage_data(rows, label))
            else:
                print(coverage.report(rows, label))
        return 0
    if ns.opset_command in ("page", "closure"):
        import warnings

        from ..explorer import corpus as explorer_corpus
        from ..explorer import page, selection

        sel = None
        if ns.opset_command == "closure":
            sel = selection.Selection(preset=None if ns.supported else ns.preset,
                                      supported=tuple(read_ops_file(ns.supported)) if ns.supported else (),
                                      keep=tuple(ns.keep or ()), decompose=tuple(ns.decompose or ()))
            from ..request import plan_request

            # the request as `pt2b lower` makes it, before the corpus: the same UnknownOpsWarning for names this
            # torch lacks, the same LoweringError for a bad keep or decompose
            plan_request(**sel.load_kwargs())
        with warnings.catch_warnings():  # torch's deprecation chatter while tracing the corpus
            warnings.simplefilter("ignore")
            shipped = None if ns.corpus else explorer_corpus.shipped_routes()
            if shipped is not None:  # the default corpus, traced for this torch release when pt2b was built
                data = page.build_data(routes=shipped)
            else:
                named, paths = _split_corpus(ns.corpus)
                corpus = []
                if named:
                    if not ns.corpus:  # a torch release pt2b ships no routes for: the builders trace them
                        releases = explorer_corpus.shipped_releases()
                        explorer_corpus.corpus_builders(_no_shipped_routes(releases))
                    corpus += explorer_corpus.default_corpus(named, progress.tracker("capturing", unit="program"))
                if paths:
                    corpus += explorer_corpus.artifact_corpus(paths, progress.tracker("loading", unit="artifact"))
                data = page.build_data(corpus, progress.tracker("tracing routes", unit="program"))
        _say_left_out(data["left_out"], getattr(ns, "verbose", False))
        if ns.opset_command == "page":
            path = page.write_page(data, ns.output)
            print(f"wrote {path} ({len(data['models'])} corpus programs, {len(data['available'])} decompositions); "
                  f"open it in a browser (file://{path.resolve()})")
            return 0
        if json_out.wanted(ns):
            json_out.emit(_closure_data(data, sel))
        else:
            print(selection.closure_report(data, sel))
        return 0
    if ns.opset_command == "audit":
        from ..explorer import audit
        from ..lowering import verdicts

        def finding(i, n, name, rec):
            if rec["verdict"] in ("wrong", "lossy"):
                progress.write(f"[{i}/{n}] {rec['verdict']:6s} {name}: {verdicts.describe(rec)}")
                sys.stdout.flush()

        results = audit.run_audit(only=ns.ops or None, progress=finding,
                                  track=progress.tracker("auditing", unit="op"))
        stored = verdicts.read() if ns.ops else None
        if stored is not None:  # --ops re-measures those ops in the shipped audit, keeps the others
            results = dict(sorted({**stored["ops"], **results}.items()))
        path = audit.write(results, ns.output or verdicts.data_path().name)  # (never into the installed package)
        print(f"{len(results)} decompositions audited: {verdicts.totals(results)}; wrote {path}")
        return 0
    a, b = presets.load(ns.a), presets.load(ns.b)
    for field, (only_a, only_b) in presets.diff(a, b).items():
        print(f"{field}: {len(only_a)} only in {a.key}, {len(only_b)} only in {b.key}")
        print("".join(f"  - {n}\n" for n in only_a) + "".join(f"  + {n}\n" for n in only_b), end="")
    return 0


def _say_left_out(left_out: list, verbose: bool) -> None:
    """The corpus programs whose lowering with every decomposition fails, on stderr: one line naming
    them, or (``verbose``) one line each with why."""
    if verbose:
        for m in left_out:
            print(f"pt2b: left out {m['name']}: its lowering with every decomposition fails ({m['error']})",
                  file=sys.stderr)
    elif left_out:
        print(f"pt2b: left out {len(left_out)} corpus program(s) whose lowering with every decomposition fails: "
              f"{', '.join(m['name'] for m in left_out)} (--verbose says why)", file=sys.stderr)


def _coverage_data(rows, label: str) -> dict:
    """`pt2b opset coverage --json`: what its report says, as data."""
    from ..explorer.coverage import greedy_next

    using: dict[str, int] = {}
    for r in rows:
        for op in r.ops:
            using[op] = using.get(op, 0) + 1
    return {"label": label, "models": len(rows), "covered": sum(1 for r in rows if r.covered),
            "per_model": [{"path": r.path, "covered": r.covered, "ops": r.ops, "missing": r.missing,
                           "error": r.error or None} for r in rows],
            "ops": dict(sorted(using.items())),
            "implement_next": [{"op": op, "models_covered": n}
                               for op, n in greedy_next([set(r.missing) for r in rows if not r.error])]}


def _closure_data(data: dict, sel) -> dict:
    """`pt2b opset closure --json`: what its report says, as data."""
    from ..explorer import selection

    res = selection.evaluate(data, sel)
    table, _ = selection.table_and_accepts(data, sel)
    return {"selection": {"preset": sel.preset, "supported": sel.supported, "keep": sel.keep,
                          "decompose": sel.decompose},
            "decompositions": len(table), "models": len(res["models"]), "covered": res["covered"],
            "per_model": {name: {"covered": not r["missing"], "missing": r["missing"]}
                          for name, r in res["models"].items()},
            "ops": res["counts"], "unreachable": selection.unreachable(res),
            "implement_next": [{"op": op, "models_covered": n} for op, n in res["next"]],
            "left_out": [{"name": m["name"], "error": m["error"]} for m in data["left_out"]]}


def _split_corpus(entries) -> tuple[tuple[str, ...], list[str]]:
    """--corpus entries: names of the corpora tools/corpus/ builds and artifact paths; none given: the
    default named corpora."""
    from ..explorer.corpus import DEFAULT_CORPORA, NAMED_CORPORA

    if not entries:
        return DEFAULT_CORPORA, []
    return tuple(e for e in entries if e in NAMED_CORPORA), [e for e in entries if e not in NAMED_CORPORA]


def _corpus_artifacts(entries, folder: str) -> list[str]:
    """Artifact paths for --corpus: named corpora are captured and written into ``folder``."""
    import re

    from ..api import export_model
    from ..explorer import coverage
    from ..explorer.corpus import named_programs

    named, paths = _split_corpus(entries)
    out = []
    for label, ep in (named_programs(named, progress.tracker("capturing", unit="program")) if named else ()):
        path = f"{folder}/{re.sub(r'[^A-Za-z0-9_.-]', '_', label)}.pt2b"
        export_model(ep, path=path)
        out.append(path)
    return out + (coverage.artifacts(paths) if paths else [])


def _no_shipped_routes(releases: list[str]) -> str:
    """What a command without --corpus asks the corpus builders for on a torch release whose routes pt2b
    does not ship."""
    import torch

    return (f"the default corpus's routes for torch {torch.__version__.split('+')[0]} (pt2b ships them for "
            f"torch {', '.join(releases) or 'no release'})")
