"""The `pt2b` command line: export, inspect, convert, verify, lower, run, upgrade, demo."""

from __future__ import annotations

import argparse
import importlib
import os
import re
import sys
import threading

from ..errors import ArtifactError, ExportError, Pt2bError
from . import json_out, progress, terminal

# The command line's wiring: each command's code is the module of its name (exporter/cli/<command>.py,
# with ``run(ns) -> int``), imported only when that command runs.


class _HelpFormatter(argparse.HelpFormatter):
    """Writes ``{presets}`` in a help text as the preset names (exporter.lowering.presets.PRESETS), read
    when help is printed: building the parser (every `pt2b` call, --version too) imports no lowering."""

    def _get_help_string(self, action):
        text = super()._get_help_string(action)
        if text and "{presets}" in text:
            from ..lowering.preset_names import PRESETS

            text = text.replace("{presets}", ", ".join(PRESETS))
        if text and "{backends}" in text:
            from ..backends import names

            text = text.replace("{backends}", ", ".join(names()))
        return text


class _Parser(argparse.ArgumentParser):
    """An ArgumentParser (and its subcommands' parsers) with _HelpFormatter."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("formatter_class", _HelpFormatter)
        super().__init__(*args, **kwargs)

    def error(self, message):
        """argparse's usage error, an unknown command or choice with the closest names offered."""
        m = re.match(r"argument .*: invalid choice: '(.*)' \(choose from (.*)\)$", message)
        if m:
            from ..util.closest import did_you_mean

            message += did_you_mean(m.group(1), re.findall(r"'([^']*)'", m.group(2)))
        super().error(message)


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="pt2b", description=__doc__)
    p.add_argument("--version", action="store_true", help="print the versions of pt2b, its artifact format and torch")
    p.add_argument("-q", "--quiet", action="store_true",
                   help="no progress bars (they are drawn on stderr only when it is a terminal; also PT2B_QUIET=1)")
    p.add_argument("--import", dest="imports", action="append", default=[], metavar="MODULE",
                   help="import MODULE first (e.g. the library that registers your custom ops); repeatable")
    sub = p.add_subparsers(dest="command")  # required, unless --version (main checks)
    json_flag = dict(action="store_true", help="print one JSON document on stdout instead of the text (an error too: "
                                               "{\"error\": {\"type\", \"message\"}}); progress and warnings stay "
                                               "on stderr")
    from ..hf import MAX_CACHE_LEN, TASKS  # (names only: exporter.hf imports transformers when a model is built)

    e = sub.add_parser("export", help="capture a model from MODULE:CALLABLE, or a transformers model for a task "
                                      "(--hf), and write a .pt2b",
                       usage="pt2b export MODULE:CALLABLE OUT.pt2b [--strict]\n"
                             "       pt2b export --hf SOURCE --task TASK -o OUT.pt2b [--max-cache-len N] [--dtype D] [--batch N] "
                             "[--seq N]")
    e.add_argument("factory", nargs="?", help="MODULE:CALLABLE returning (model, args[, kwargs[, dynamic_shapes]])")
    e.add_argument("output", nargs="?", help="the .pt2b to write (or -o)")
    e.add_argument("-o", dest="output_option", metavar="OUT.pt2b", help="the .pt2b to write")
    e.add_argument("--strict", action="store_true", help="use torch.export's strict (dynamo) mode")
    e.add_argument("--hf", metavar="SOURCE", help="a transformers model instead of MODULE:CALLABLE: a local folder "
                   "(config.json, weights in *.safetensors; without them the weights are random), a config.json or a "
                   "model type (llama, bert, ...); nothing is downloaded")
    e.add_argument("--task", choices=list(TASKS), help="with --hf: what to export, as optimum-cli names it: its "
                   "inputs, dynamic sizes, cache and methods (text-generation: prefill and decode over a static KV cache)")
    e.add_argument("--max-cache-len", type=int, metavar="N", help="--task text-generation: the KV cache's length, "
                   f"prompt plus generated tokens (default {MAX_CACHE_LEN}, at most the model's max_position_embeddings)")
    e.add_argument("--dtype", choices=["float32", "float16", "bfloat16"], help="with --hf: the weights' dtype "
                   "(default: the config's torch_dtype where a folder gives weights, else float32)")
    e.add_argument("--batch", type=int, metavar="N", help="with --hf: the example's batch size (2 or more where the "
                   "batch is dynamic; text-generation: the cache's batch, default 1)")
    e.add_argument("--seq", type=int, metavar="N", help="with --hf: the example's sequence length (2 or more)")
    i = sub.add_parser("inspect", help="summarize an artifact: versions, ops, signature, symbols, weights")
    i.add_argument("artifact")
    i.add_argument("--json", **json_flag)
    c = sub.add_parser("convert", help="convert between torch.export.save's .pt2 and .pt2b (direction from the source "
                                       "file); a .pt2 with pickled content is refused unless --trust-pickle",
                       description="Convert between torch.export.save's .pt2 and .pt2b (the direction from the source "
                                   "file). Reading a .pt2 can unpickle (torch.export.load), and unpickling can run "
                                   "any code: a .pt2 holding pickled content is refused, naming what is pickled, "
                                   "before anything of it is unpickled, and so is a program that fails pt2b's checks "
                                   "on untrusted programs (torch's deserializer evaluates its symbolic expressions), "
                                   "unless you pass --trust-pickle.")
    c.add_argument("source")
    c.add_argument("dest")
    c.add_argument("--trust-pickle", action="store_true",
                   help="the .pt2 is trusted: read its pickled content and its program with torch alone, as "
                        "torch.export.load does (it can run any code)")
    v = sub.add_parser("verify", help="check every checksum of an artifact, weights included")
    v.add_argument("artifact")
    v.add_argument("--checksums", action="store_true",
                   help="only the file's own checks (header, tables' bounds, every checksum), without importing "
                        "torch: a copy checked at the speed of reading it, on a machine with or without torch")
    v.add_argument("--json", **json_flag)
    for name, helptext in (("lower", "lower an artifact for a backend and print the resulting opset"),
                           ("run", "lower an artifact and run it with the reference runtime")):
        lo = sub.add_parser(name, help=helptext)
        lo.add_argument("artifact")
        lo.add_argument("--json", **json_flag)
        lo.add_argument("--preset", default="core", help="{presets} (optionally @<torch version>)")
        lo.add_argument("--backend", metavar="NAME", help="lower to this installed backend's own op list ({backends})"
                        + ("" if name == "lower" else ", and run on its hand-off instead of runtime_ref"))
        lo.add_argument("--supported", metavar="OPS.txt", help="file with one supported op per line (overrides --preset)")
        lo.add_argument("--keep", nargs="*", metavar="OP", help="ops never to decompose")
        lo.add_argument("--decompose", nargs="*", metavar="OP",
                        help="ops to decompose beyond the preset (torch's registered decompositions)")
        lo.add_argument("--no-cache", action="store_true", help="neither read nor write the lowering cache")
        lo.add_argument("--method", metavar="NAME", help="the method of a multi-method artifact (default: "
                        + ("every method" if name == "lower" else "the default method") + ")")
        lo.add_argument("--lossless", action="store_true",
                        help="apply no decomposition the audit classes lossy or wrong (schemas/opsets/audit@*.json)")
        lo.add_argument("--strict", action="store_true", help=argparse.SUPPRESS)  # an earlier release's --lossless
        lo.add_argument("--no-validate", action="store_true",
                        help="do not run the lowered program against the unlowered one on the stored example inputs"
                        + ("" if name == "lower" else ", nor the backend's against the lowered one"))
        lo.add_argument("--frozen-state", action="store_true", help="hand a program that writes its buffers to "
                        "the backend with them as constants (every call starts from their exported values); by "
                        "default they are handed over as an input and an output and carried from call to call")
        lo.add_argument("--option", action="append", default=[], metavar="KEY=VALUE",
                        help="an option of the backend's hand-off (with --to or --backend; repeatable; docs/backends.md "
                        "lists them), its value read as a Python literal: --option specialize=True")
        lo.add_argument("--fallback", choices=["reference"], help="with --backend (or --supported): leave to the reference the ops "
                        "no decomposition brings to the backend's list"
                        + (" (the report names them)" if name == "lower" else ", and run on the reference what the "
                           "backend cannot take (the program split between them; the share each runs is printed)"))
        if name == "lower":
            lo.add_argument("-o", "--output", help="write the lowered program as a .pt2b (with --to: the backend's "
                            "own file)")
            lo.add_argument("--to", metavar="NAME", help="lower to this installed backend's op list, hand it over and "
                            "write the backend's own file to -o (m.onnx, m.pte, m.vmfb, OpenVINO's m.xml, AOTInductor's "
                            "m.pt2): its own runtime loads it without pt2b")
        else:
            lo.add_argument("--inputs", nargs="*", metavar="X.npy", help="positional inputs (default: the stored example inputs)")
            lo.add_argument("--extra-ops", nargs="*", metavar="OP", default=[],
                            help="ops runtime_ref runs beyond its opset (custom ops, with --import of their library)")
            lo.add_argument("--device", default="cpu")
            lo.add_argument("--repeat", type=int, default=3, metavar="N", help="timed runs after the first (default 3)")
    u = sub.add_parser("upgrade", help="rewrite artifacts to the current format and op schemas")
    u.add_argument("source", help="a .pt2b file or a folder of them (upgraded in place)")
    u.add_argument("dest", nargs="?", help="destination file (default: in place, atomically)")
    u.add_argument("--check", action="store_true", help="report what would change; write nothing")
    u.add_argument("--to", metavar="X.Y", help="target format version (default: current)")
    o = sub.add_parser("opset", help="show or compare lowering presets (schemas/opsets/)")
    osub = o.add_subparsers(dest="opset_command", required=True)
    show = osub.add_parser("show", help="a preset's opset and decomposition count")
    show.add_argument("preset", help="{presets}, optionally @<torch version>")
    dif = osub.add_parser("diff", help="what changed between two presets (e.g. core@2.13 core-tag@2.13)")
    dif.add_argument("a")
    dif.add_argument("b")
    cov = osub.add_parser("coverage", help="how many models of a corpus a preset or supported-ops list covers, "
                                           "and which ops to implement next")
    corpus_help = (".pt2b files or folders, or corpora built from a source checkout: zoo, exportdb, "
                   "transformers (every op of the transformers architectures), transformers-all (default: zoo "
                   "transformers; page and closure read their routes as shipped for this torch release where "
                   "pt2b has them)")
    cov.add_argument("--corpus", nargs="*", metavar="PATH|NAME", help=corpus_help)
    cov.add_argument("--preset", default="core")
    cov.add_argument("--supported", metavar="OPS.txt", help="file with one supported op per line (overrides --preset)")
    cov.add_argument("--keep", nargs="*", metavar="OP")
    cov.add_argument("--workers", type=int, default=1, help="models lowered at once, each in its own process")
    cov.add_argument("--ray", metavar="auto|ADDRESS", help="lower the models on a Ray cluster (pip install 'pt2b[ray]')")
    cov.add_argument("--records", metavar="FILE.jsonl", help="the sweep's records: a run stopped part-way goes on "
                     "from them (docs/sweeps.md)")
    cov.add_argument("--json", **json_flag)
    page = osub.add_parser("page", help="write the opset explorer: one self-contained HTML page")
    page.add_argument("-o", "--output", default="opsets.html")
    page.add_argument("--corpus", nargs="*", metavar="PATH|NAME", help=corpus_help)
    page.add_argument("--verbose", action="store_true", help="say why each left-out corpus program fails")
    clo = osub.add_parser("closure", help="what lowering to a supported-ops list (or a preset) leaves over a "
                                          "corpus: the op set, the ops that cannot be reached and their routes")
    clo.add_argument("--supported", metavar="OPS.txt", help="file with one supported op per line (overrides --preset)")
    clo.add_argument("--preset", default="core")
    clo.add_argument("--keep", nargs="*", metavar="OP")
    clo.add_argument("--decompose", nargs="*", metavar="OP")
    clo.add_argument("--corpus", nargs="*", metavar="PATH|NAME", help=corpus_help)
    clo.add_argument("--verbose", action="store_true", help="say why each left-out corpus program fails")
    clo.add_argument("--json", **json_flag)
    aud = osub.add_parser("audit", help="measure every preset decomposition on OpInfo samples; writes "
                                        "audit@<torch>.json (pt2b ships its own: schemas/opsets/ in a checkout)")
    aud.add_argument("--ops", nargs="*", metavar="OP", help="only these ops (e.g. aten::var_mean.correction); "
                     "their records replace those of the audit pt2b ships, the others are kept")
    aud.add_argument("-o", "--output", help="where to write (default: audit@<torch major.minor>.json here; "
                                            "pt2b's developers pass schemas/opsets/audit@<torch>.json)")
    ca = sub.add_parser("cache", help="where the lowering cache is, what it holds; --clear empties it")
    ca.add_argument("--clear", action="store_true")
    ca.add_argument("--json", **json_flag)
    d = sub.add_parser("demo", help="export a small transformer, load it, run it")
    d.add_argument("-o", "--output", default="demo_transformer.pt2b")
    return p


def import_user_module(name: str):
    """``importlib.import_module(name)`` as `python -m` would find it: the current folder is searched
    too, after everything installed (a file there never shadows an installed package), and only for
    this import."""
    cwd = os.getcwd()
    added = cwd not in sys.path and "" not in sys.path
    if added:
        sys.path.append(cwd)
    try:
        return importlib.import_module(name)
    finally:
        if added and cwd in sys.path:
            sys.path.remove(cwd)


def _check_names(ns) -> None:
    """A preset or backend named on the command line that is none, answered before the command's
    heavy imports (torch), with the closest names."""
    from ..errors import BackendUnavailableError, LoweringError
    from ..lowering.preset_names import unknown_preset
    from ..backends import names
    from ..util.closest import did_you_mean

    preset = getattr(ns, "preset", None)  # (a backend's name is an earlier release's spelling: warned later)
    if isinstance(preset, str) and preset not in names() and (why := unknown_preset(preset, names())):
        raise LoweringError(why)
    backend = getattr(ns, "backend", None)
    if isinstance(backend, str):
        if backend not in names():
            raise BackendUnavailableError(f"unknown backend {backend!r};{did_you_mean(backend, names())} pt2b "
                                          f"knows {', '.join(names())}.")


def _quiet_broken_pipe() -> int:
    """The reader of stdout is gone (`pt2b inspect m.pt2b | head`): what is left unwritten is dropped and
    the command ends as a process killed by SIGPIPE would (status 141), without a traceback."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):
        pass
    return 141


def main(argv=None) -> int:
    parser = build_parser()
    ns = parser.parse_args(argv)
    if ns.version:
        from .versions import versions

        print(versions())
        return 0
    if ns.command is None:
        parser.error("the following arguments are required: command")
    progress.set_quiet(True if ns.quiet else None)
    # Strings from a file reach every line a command writes (its output, an error's message, the
    # warnings of what it calls): a terminal shows their control characters as escapes, never obeys them.
    # With --json, stdout holds one JSON document (the command's data or its error): what the command
    # and the libraries it calls print goes to stderr meanwhile (json_out.stdout_aside).
    with terminal.escaped_output():
        try:
            with json_out.stdout_aside(json_out.wanted(ns)):
                _check_names(ns)
                for mod in ns.imports:
                    try:
                        import_user_module(mod)
                    except ImportError as e:
                        raise ExportError(f"--import {mod}: {e}") from e
                with progress.torch_internals_quiet():
                    return importlib.import_module(f".{ns.command}", __name__).run(ns)
        except Pt2bError as e:
            progress.close_all()
            kind = "artifact error" if isinstance(e, ArtifactError) else "error"
            print(f"pt2b: {kind} ({type(e).__name__}): {e}", file=sys.stderr)
            if json_out.wanted(ns):
                try:
                    json_out.write(json_out.error_document(e))
                except BrokenPipeError:
                    return _quiet_broken_pipe()
            return 2
        except BrokenPipeError:
            progress.close_all()
            return _quiet_broken_pipe()
        except BaseException:  # a bug, Ctrl-C: the traceback starts below the bars, not on their line
            progress.close_all()
            raise



def console(argv=None) -> None:
    """The `pt2b` executable (and `python -m exporter`): ``main``, then the process ends at once, its
    output flushed. Python's own shutdown would only take apart what the command built (torch's
    modules, the program's objects), which for a large model takes longer than `pt2b verify`'s check of
    the program. An exception out of ``main`` (a bug, Ctrl-C, argparse's exits) takes
    Python's usual way out, and so does a command that leaves a thread of its own running (none does:
    Python would wait for it)."""
    code = main(argv)
    if any(t.is_alive() and not t.daemon for t in threading.enumerate() if t is not threading.main_thread()):
        sys.exit(code)
    if "logging" in sys.modules:  # what its handlers hold (logging flushes them at exit)
        sys.modules["logging"].shutdown()
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except (OSError, ValueError):  # a reader gone (`pt2b inspect m.pt2b | head`): as main's BrokenPipeError
        os._exit(_quiet_broken_pipe())
    os._exit(code)
