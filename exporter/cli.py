"""The `pt2b` command line: export, inspect, convert, verify, lower, run, upgrade, demo."""

from __future__ import annotations

import argparse
import importlib
import sys

from . import progress
from .errors import ArtifactError, ExportError, Pt2bError


def _load_factory(spec: str):
    mod_name, sep, attr = spec.partition(":")
    if not sep or not mod_name or not attr:
        raise ExportError(f"expected MODULE:CALLABLE (e.g. mypkg.models:make_model), got {spec!r}.")
    try:
        mod = importlib.import_module(mod_name)
    except ImportError as e:
        raise ExportError(f"cannot import {mod_name!r}: {e}") from e
    try:
        return getattr(mod, attr)
    except AttributeError:
        raise ExportError(f"module {mod_name!r} has no attribute {attr!r}.") from None


def _unpack_factory_result(res):
    """(model, args, kwargs, dynamic_shapes, strict) from what a factory returned."""
    if hasattr(res, "model") and hasattr(res, "args"):
        return (res.model, res.args, getattr(res, "kwargs", None), getattr(res, "dynamic_shapes", None),
                getattr(res, "strict", False))
    if isinstance(res, tuple) and 2 <= len(res) <= 4:
        model, args, *rest = res
        kwargs = rest[0] if rest else None
        dyn = rest[1] if len(rest) > 1 else None
        return model, args, kwargs, dyn, False
    raise ExportError(
        "the factory must return (model, args[, kwargs[, dynamic_shapes]]) or an object with "
        f".model and .args; got {type(res).__name__}."
    )


def cmd_export(ns) -> int:
    from .api import export_model

    with progress.status(f"building {ns.factory}"):
        model, args, kwargs, dyn, strict = _unpack_factory_result(_load_factory(ns.factory)())
    with progress.status(f"capturing and writing {ns.output}"):
        export_model(model, args, ns.output, kwargs=kwargs, dynamic_shapes=dyn, strict=strict or ns.strict)
    print(f"wrote {ns.output}")
    return 0


def cmd_inspect(ns) -> int:
    from .inspect_artifact import summarize

    print(summarize(ns.artifact))
    return 0


def cmd_convert(ns) -> int:
    from .convert import convert

    with progress.status(f"converting {ns.source}"):
        direction = convert(ns.source, ns.dest)
    print(f"converted {ns.source} -> {ns.dest} ({direction})")
    return 0


def cmd_verify(ns) -> int:
    from .serialize import reader

    with progress.status(f"verifying {ns.artifact}"):
        art = reader.open_artifact(ns.artifact)
        for name in art.method_names:  # every method's graph: its walk and checks, which load() leaves to first use
            reader.check(reader.method(art, name))
        n = reader.verify_weights(art)
    methods = f"{len(art.method_names)} methods" if len(art.method_names) > 1 else "program"
    print(f"{ns.artifact}: OK ({methods} and {n} bytes of weights verified)")
    return 0


def _read_ops_file(path: str) -> list[str]:
    try:
        with open(path) as f:
            return [ln.split("#")[0].strip() for ln in f if ln.split("#")[0].strip()]
    except OSError as e:
        raise ExportError(f"cannot read supported ops from {path!r}: {e.strerror or e}") from None


def _lower_from_args(ns):
    from .api import load_for_backend

    supported = _read_ops_file(ns.supported) if ns.supported else None
    with progress.status(f"lowering {ns.artifact}"):
        return load_for_backend(ns.artifact, ns.preset, supported_ops=supported, keep=ns.keep or None,
                                decompose=ns.decompose or None, cache=False if ns.no_cache else None,
                                strict=ns.strict, validate=not ns.no_validate, method=ns.method)


def cmd_cache(ns) -> int:
    from .lowering import cache

    folder = cache.cache_dir()
    if ns.clear:
        print(f"removed {cache.clear()} entries from {folder}")
        return 0
    files = cache.entries()
    size = sum(p.stat().st_size for p in files if p.exists())
    state = "on" if cache.enabled(None) else "off (PT2B_CACHE)"
    print(f"lowering cache {folder} ({state}): {len(files)} entries, {size / 1e6:.1f} MB")
    return 0


def cmd_lower(ns) -> int:
    from .api import export_model

    lowered = _lower_from_args(ns)
    methods = lowered.methods
    for name, low in methods.items():
        print((f"method {name}: " if len(methods) > 1 else "") + low.report())
    if ns.output:
        with progress.status(f"writing {ns.output}"):  # with the record of how each was lowered
            export_model(lowered if len(methods) == 1 else methods, path=ns.output)
        print(f"wrote {ns.output}")
    return 0


def _read_inputs(paths, lowered):
    import numpy as np
    import torch

    if not paths:
        example = lowered.exported_program().example_inputs
        if example is None:
            raise ExportError("the artifact stores no example inputs; pass --inputs a.npy b.npy ...")
        return example
    args = []
    for p in paths:
        try:
            args.append(torch.from_numpy(np.load(p, allow_pickle=False)))
        except (OSError, ValueError) as e:
            raise ExportError(f"cannot read input {p!r} (a .npy file is expected): {e}") from None
    return tuple(args), {}


def cmd_run(ns) -> int:
    import torch.utils._pytree as pytree

    from runtime_ref import Runtime

    lowered = _lower_from_args(ns)
    with progress.status(f"running {ns.artifact} on runtime_ref"):
        rt = Runtime(lowered, device=ns.device, extra_ops=ns.extra_ops)
        args, kwargs = _read_inputs(ns.inputs, lowered)
        out = rt(*args, **kwargs)
    for i, leaf in enumerate(pytree.tree_leaves(out)):
        desc = f"{str(leaf.dtype).removeprefix('torch.')}{list(leaf.shape)}" if hasattr(leaf, "dtype") else repr(leaf)
        print(f"output {i}: {desc}")
    return 0


def cmd_upgrade(ns) -> int:
    from .versioning.formats import parse_version
    from .versioning.upgrade_tool import upgrade_path

    try:
        to = parse_version(ns.to) if ns.to else None
    except ValueError as e:
        raise ExportError(str(e)) from None
    results = upgrade_path(ns.source, ns.dest, check=ns.check, to=to,
                           track=progress.tracker("checking" if ns.check else "upgrading", unit="file"))
    for r in results:
        print(r.line())
    failed = sum(r.failed for r in results)
    changed = sum(1 for r in results if r.changes and not r.failed)
    print(f"{len(results)} artifact(s): {sum(r.written for r in results)} written, "
          f"{changed} {'to change' if ns.check else 'changed'}, {failed} failed")
    return 1 if failed else 0


def cmd_opset(ns) -> int:
    from .lowering import presets

    if ns.opset_command == "show":
        preset = presets.load(ns.preset)
        print(presets.describe(preset))
        from .lowering import audit

        stored = audit.read(preset.torch_version)
        if stored:
            mine = {k: stored["ops"][k] for k in preset.decompose if k in stored["ops"]}
            print(f"decompositions by measured numerics (pt2b opset audit): {audit.totals(mine)}")
            for name, rec in audit.worst_cases(mine, 10):
                print(f"  {rec['verdict']:6s} {name}: {audit.describe(rec)}")
        return 0
    if ns.opset_command == "coverage":
        import tempfile

        from .lowering import coverage

        supported = _read_ops_file(ns.supported) if ns.supported else None
        with tempfile.TemporaryDirectory() as tmp:
            paths = _corpus_artifacts(ns.corpus, tmp)
            rows = coverage.measure(paths, ns.preset, supported_ops=supported, keep=ns.keep or None,
                                    track=progress.tracker("lowering", unit="model"))
            label = f"supported ops of {ns.supported}" if supported else f"preset {ns.preset}"
            print(coverage.report(rows, label))
        return 0
    if ns.opset_command in ("page", "closure"):
        import warnings

        from .lowering import explorer

        with warnings.catch_warnings():  # torch's deprecation chatter while tracing the corpus
            warnings.simplefilter("ignore")
            shipped = None if ns.corpus else explorer.shipped_routes()
            if shipped is not None:  # the default corpus, traced for this torch release when pt2b was built
                data = explorer.build_data(routes=shipped)
            else:
                named, paths = _split_corpus(ns.corpus)
                corpus = []
                if named:
                    corpus += explorer.default_corpus(named, progress.tracker("capturing", unit="program"))
                if paths:
                    corpus += explorer.artifact_corpus(paths, progress.tracker("loading", unit="artifact"))
                data = explorer.build_data(corpus, progress.tracker("tracing routes", unit="program"))
        for m in data["left_out"]:
            print(f"pt2b: left out {m['name']}: its lowering with every decomposition fails ({m['error']})",
                  file=sys.stderr)
        if ns.opset_command == "page":
            path = explorer.write_page(data, ns.output)
            print(f"wrote {path} ({len(data['models'])} corpus programs, {len(data['available'])} decompositions); "
                  f"open it in a browser (file://{path.resolve()})")
            return 0
        sel = explorer.Selection(preset=None if ns.supported else ns.preset,
                                 supported=tuple(_read_ops_file(ns.supported)) if ns.supported else (),
                                 keep=tuple(ns.keep or ()), decompose=tuple(ns.decompose or ()))
        print(explorer.closure_report(data, sel))
        return 0
    if ns.opset_command == "audit":
        from .lowering import audit

        def finding(i, n, name, rec):
            if rec["verdict"] in ("wrong", "lossy"):
                progress.write(f"[{i}/{n}] {rec['verdict']:6s} {name}: {audit.describe(rec)}")
                sys.stdout.flush()

        results = audit.run_audit(only=ns.ops or None, progress=finding,
                                  track=progress.tracker("auditing", unit="op"))
        stored = audit.read() if ns.ops else None
        if stored is not None:  # --ops re-measures those ops in the shipped audit, keeps the others
            results = dict(sorted({**stored["ops"], **results}.items()))
        path = audit.write(results, ns.output or audit.data_path().name)  # (never into the installed package)
        print(f"{len(results)} decompositions audited: {audit.totals(results)}; wrote {path}")
        return 0
    a, b = presets.load(ns.a), presets.load(ns.b)
    for field, (only_a, only_b) in presets.diff(a, b).items():
        print(f"{field}: {len(only_a)} only in {a.key}, {len(only_b)} only in {b.key}")
        print("".join(f"  - {n}\n" for n in only_a) + "".join(f"  + {n}\n" for n in only_b), end="")
    return 0


def _split_corpus(entries) -> tuple[tuple[str, ...], list[str]]:
    """--corpus entries: names of built-in corpora (exporter/corpus/programs.py) and artifact paths;
    none given: the default named corpora."""
    from .corpus import programs

    if not entries:
        return programs.DEFAULT, []
    return tuple(e for e in entries if e in programs.NAMES), [e for e in entries if e not in programs.NAMES]


def _corpus_artifacts(entries, folder: str) -> list[str]:
    """Artifact paths for --corpus: named corpora are captured and written into ``folder``."""
    import re

    from .api import export_model
    from .corpus import programs
    from .lowering import coverage

    named, paths = _split_corpus(entries)
    out = []
    for label, ep in programs.programs(named, progress.tracker("capturing", unit="program")):
        path = f"{folder}/{re.sub(r'[^A-Za-z0-9_.-]', '_', label)}.pt2b"
        export_model(ep, path=path)
        out.append(path)
    return out + (coverage.artifacts(paths) if paths else [])


def cmd_demo(ns) -> int:
    from .demo import run_demo

    run_demo(ns.output)
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="pt2b", description=__doc__)
    p.add_argument("--version", action="store_true", help="print the versions of pt2b, its artifact format and torch")
    p.add_argument("-q", "--quiet", action="store_true",
                   help="no progress bars (they are drawn on stderr only when it is a terminal; also PT2B_QUIET=1)")
    p.add_argument("--import", dest="imports", action="append", default=[], metavar="MODULE",
                   help="import MODULE first (e.g. the library that registers your custom ops); repeatable")
    sub = p.add_subparsers(dest="command")  # required, unless --version (main checks)
    e = sub.add_parser("export", help="capture a model from MODULE:CALLABLE and write a .pt2b")
    e.add_argument("factory", help="MODULE:CALLABLE returning (model, args[, kwargs[, dynamic_shapes]])")
    e.add_argument("output")
    e.add_argument("--strict", action="store_true", help="use torch.export's strict (dynamo) mode")
    e.set_defaults(func=cmd_export)
    i = sub.add_parser("inspect", help="summarize an artifact: versions, ops, signature, symbols, weights")
    i.add_argument("artifact")
    i.set_defaults(func=cmd_inspect)
    c = sub.add_parser("convert", help="convert between torch.export.save's .pt2 and .pt2b (direction from the source file)")
    c.add_argument("source")
    c.add_argument("dest")
    c.set_defaults(func=cmd_convert)
    v = sub.add_parser("verify", help="check every checksum of an artifact, weights included")
    v.add_argument("artifact")
    v.set_defaults(func=cmd_verify)
    for name, helptext, func in (("lower", "lower an artifact for a backend and print the resulting opset", cmd_lower),
                                 ("run", "lower an artifact and run it with the reference runtime", cmd_run)):
        lo = sub.add_parser(name, help=helptext)
        lo.add_argument("artifact")
        lo.add_argument("--preset", default="core", help="none, core, core-tag, max (optionally @<torch version>)")
        lo.add_argument("--supported", metavar="OPS.txt", help="file with one supported op per line (overrides --preset)")
        lo.add_argument("--keep", nargs="*", metavar="OP", help="ops never to decompose")
        lo.add_argument("--decompose", nargs="*", metavar="OP",
                        help="ops to decompose beyond the preset (torch's registered decompositions)")
        lo.add_argument("--no-cache", action="store_true", help="neither read nor write the lowering cache")
        lo.add_argument("--method", metavar="NAME", help="the method of a multi-method artifact (default: "
                        + ("every method" if name == "lower" else "the default method") + ")")
        lo.add_argument("--strict", action="store_true",
                        help="apply no decomposition the audit classes lossy or wrong (schemas/opsets/audit@*.json)")
        lo.add_argument("--no-validate", action="store_true",
                        help="do not run the lowered program against the unlowered one on the stored example inputs")
        if name == "lower":
            lo.add_argument("-o", "--output", help="write the lowered program as a .pt2b")
        else:
            lo.add_argument("--inputs", nargs="*", metavar="X.npy", help="positional inputs (default: the stored example inputs)")
            lo.add_argument("--extra-ops", nargs="*", metavar="OP", default=[],
                            help="ops runtime_ref runs beyond its opset (custom ops, with --import of their library)")
            lo.add_argument("--device", default="cpu")
        lo.set_defaults(func=func)
    u = sub.add_parser("upgrade", help="rewrite artifacts to the current format and op schemas")
    u.add_argument("source", help="a .pt2b file or a folder of them (upgraded in place)")
    u.add_argument("dest", nargs="?", help="destination file (default: in place, atomically)")
    u.add_argument("--check", action="store_true", help="report what would change; write nothing")
    u.add_argument("--to", metavar="X.Y", help="target format version (default: current)")
    u.set_defaults(func=cmd_upgrade)
    o = sub.add_parser("opset", help="show or compare lowering presets (schemas/opsets/)")
    osub = o.add_subparsers(dest="opset_command", required=True)
    show = osub.add_parser("show", help="a preset's opset and decomposition count")
    show.add_argument("preset", help="none, core, core-tag, max, optionally @<torch version>")
    dif = osub.add_parser("diff", help="what changed between two presets (e.g. core@2.13 core-tag@2.13)")
    dif.add_argument("a")
    dif.add_argument("b")
    cov = osub.add_parser("coverage", help="how many models of a corpus a preset or supported-ops list covers, "
                                           "and which ops to implement next")
    corpus_help = (".pt2b files or folders, or built-in corpora: zoo, exportdb, transformers (every op of the "
                   "transformers architectures), transformers-all (default: zoo transformers; page and closure read "
                   "their routes as shipped for this torch release where pt2b has them)")
    cov.add_argument("--corpus", nargs="*", metavar="PATH|NAME", help=corpus_help)
    cov.add_argument("--preset", default="core")
    cov.add_argument("--supported", metavar="OPS.txt", help="file with one supported op per line (overrides --preset)")
    cov.add_argument("--keep", nargs="*", metavar="OP")
    page = osub.add_parser("page", help="write the opset explorer: one self-contained HTML page")
    page.add_argument("-o", "--output", default="opsets.html")
    page.add_argument("--corpus", nargs="*", metavar="PATH|NAME", help=corpus_help)
    clo = osub.add_parser("closure", help="what lowering to a supported-ops list (or a preset) leaves over a "
                                          "corpus: the op set, the ops that cannot be reached and their routes")
    clo.add_argument("--supported", metavar="OPS.txt", help="file with one supported op per line (overrides --preset)")
    clo.add_argument("--preset", default="core")
    clo.add_argument("--keep", nargs="*", metavar="OP")
    clo.add_argument("--decompose", nargs="*", metavar="OP")
    clo.add_argument("--corpus", nargs="*", metavar="PATH|NAME", help=corpus_help)
    aud = osub.add_parser("audit", help="measure every preset decomposition on OpInfo samples; writes "
                                        "audit@<torch>.json (pt2b ships its own: schemas/opsets/ in a checkout)")
    aud.add_argument("--ops", nargs="*", metavar="OP", help="only these ops (e.g. aten::var_mean.correction); "
                     "their records replace those of the audit pt2b ships, the others are kept")
    aud.add_argument("-o", "--output", help="where to write (default: audit@<torch major.minor>.json here; "
                                            "pt2b's developers pass schemas/opsets/audit@<torch>.json)")
    o.set_defaults(func=cmd_opset)
    ca = sub.add_parser("cache", help="where the lowering cache is, what it holds; --clear empties it")
    ca.add_argument("--clear", action="store_true")
    ca.set_defaults(func=cmd_cache)
    d = sub.add_parser("demo", help="export a small transformer, load it, run it")
    d.add_argument("-o", "--output", default="demo_transformer.pt2b")
    d.set_defaults(func=cmd_demo)
    return p


def versions() -> str:
    """`pt2b --version`: pt2b's version, the artifact format version it writes, torch's version and
    the torch releases pt2b supports (its installed metadata: pyproject.toml's dependency)."""
    from importlib import metadata

    import torch
    from packaging.requirements import Requirement

    from .version import __version__
    from .versioning.formats import FORMAT_VERSION, version_str

    try:
        wanted = next((str(req.specifier) for req in map(Requirement, metadata.requires("pt2b") or ())
                       if req.name == "torch" and req.marker is None), "")
    except metadata.PackageNotFoundError:  # run from a source tree that is not installed
        wanted = ""
    supported = f" (pt2b supports torch {wanted})" if wanted else ""
    return f"pt2b {__version__}\nformat {version_str(FORMAT_VERSION)}\ntorch {torch.__version__}{supported}"


def main(argv=None) -> int:
    parser = build_parser()
    ns = parser.parse_args(argv)
    if ns.version:
        print(versions())
        return 0
    if ns.command is None:
        parser.error("the following arguments are required: command")
    progress.set_quiet(True if ns.quiet else None)
    try:
        for mod in ns.imports:
            try:
                importlib.import_module(mod)
            except ImportError as e:
                raise ExportError(f"--import {mod}: {e}") from e
        with progress.torch_internals_quiet():
            return ns.func(ns)
    except Pt2bError as e:
        progress.close_all()
        kind = "artifact error" if isinstance(e, ArtifactError) else "error"
        print(f"pt2b: {kind} ({type(e).__name__}): {e}", file=sys.stderr)
        return 2
    except BaseException:  # a bug, Ctrl-C: the traceback starts below the bars, not on their line
        progress.close_all()
        raise


if __name__ == "__main__":
    sys.exit(main())
