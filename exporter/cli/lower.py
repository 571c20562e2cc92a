"""`pt2b lower ART.pt2b`: lower an artifact for a backend and print the resulting opset (-o writes it,
--json gives it as data); the request read from the command line and the facts `pt2b run` shares."""

from __future__ import annotations

import sys

from ..errors import ExportError
from . import json_out, progress


def read_ops_file(path: str) -> list[str]:
    """The ops of a --supported file: one a line, # comments and blank lines left out."""
    try:
        with open(path) as f:
            return [ln.split("#")[0].strip() for ln in f if ln.split("#")[0].strip()]
    except OSError as e:
        raise ExportError(f"cannot read supported ops from {path!r}: {e.strerror or e}") from None


def lower_from_args(ns, *, backend: str | None = None, fallback: str | None = None):
    """load_for_backend with the request of `pt2b lower`/`pt2b run`'s options (``backend``: the
    backend whose op list to lower to; `pt2b lower` takes it from --backend; ``fallback``: what
    --fallback asks of the lowering)."""
    from ..api import load_for_backend

    supported = read_ops_file(ns.supported) if ns.supported else None
    if ns.strict:  # an earlier release's spelling of --lossless
        print("pt2b: --strict is spelt --lossless now (--strict goes in the next release).", file=sys.stderr)
    with progress.status(f"lowering {ns.artifact}"):
        return load_for_backend(ns.artifact, ns.preset, backend=backend, supported_ops=supported,
                                keep=ns.keep or None, decompose=ns.decompose or None,
                                cache=False if ns.no_cache else None, lossless=ns.lossless or ns.strict,
                                validate=not ns.no_validate, method=ns.method, fallback=fallback)


def run(ns) -> int:
    from ..api import export_model

    if ns.to:
        return _write_backend_file(ns)
    lowered = lower_from_args(ns, backend=ns.backend, fallback=ns.fallback)
    methods = lowered.methods
    if json_out.wanted(ns):
        json_out.emit({"file": ns.artifact, "default_method": next(iter(methods)),
                       "methods": {name: lowering_facts(low) for name, low in methods.items()}, "wrote": ns.output})
    else:
        for name, low in methods.items():
            print((f"method {name}: " if len(methods) > 1 else "") + low.report())
    if ns.output:
        with progress.status(f"writing {ns.output}"):  # with the record of how each was lowered
            export_model(lowered if len(methods) == 1 else methods, path=ns.output)
        if not json_out.wanted(ns):
            print(f"wrote {ns.output}")
    return 0


def lowering_facts(low) -> dict:
    """What LoweredProgram.report() says of one lowered method, as data (`pt2b lower --json`)."""
    from ..lowering.assertions import ASSERTION_OPS, runtime_assertions

    ops = low.ops()
    return {"lowered_for": low.lowered_for, "description": low.description, "from_cache": low.from_cache,
            "validation": validation_facts(low.validation), "ops": ops, "call_sites": sum(ops.values()),
            "outside_opset": dict(low.outside_opset),
            "outside_opset_why": {name: low.explain(name).splitlines()[0] for name in low.outside_opset},
            "fallback": low.fallback, "unused_keep": low.unused_keep(),
            "unknown_supported_ops": list(low.unknown_supported_ops), "inlined_custom_ops": low.inlined_custom_ops(),
            # (listing them builds the program: only where there are some, as report() does)
            "runtime_assertions": (runtime_assertions(low.exported_program(), low.backend)
                                   if ASSERTION_OPS & set(ops) else [])}


def validation_facts(found) -> dict | None:
    """A validation's (the lowering's, or a backend hand-off's) fields and its sentence; None where
    none ran."""
    return None if found is None else {**json_out.plain(found), "text": found.describe()}


def hand_off_options(ns) -> dict:
    """``--option KEY=VALUE`` as the keyword arguments of a backend's hand-off, each value read as a Python
    literal (``True``, ``3``, ``'fp16'``) and kept as text where it is none (``compute_precision=fp32``)."""
    import ast

    from ..errors import BackendHandOffError

    options = {}
    for given in getattr(ns, "option", None) or ():
        key, eq, text = given.partition("=")
        if not eq or not key.strip().isidentifier():
            raise BackendHandOffError(f"--option {given!r} is not KEY=VALUE with KEY a keyword argument of the "
                                      f"backend's hand-off: write e.g. --option specialize=True.")
        try:
            options[key.strip()] = ast.literal_eval(text)
        except (ValueError, SyntaxError):
            options[key.strip()] = text
    return options


def _write_backend_file(ns) -> int:
    """`pt2b lower ART --to NAME -o FILE`: lowered to the backend's own op list, handed over (validated
    unless --no-validate) and written as the backend's own file."""
    from .. import backends
    from ..errors import BackendHandOffError

    if not ns.output:
        raise BackendHandOffError(f"--to {ns.to} writes the backend's own file: give its path with -o "
                                  f"(e.g. -o model{backends.get(ns.to).file_suffix}).")
    if ns.fallback:  # (a split program has no one file of the backend's)
        raise BackendHandOffError(f"--to {ns.to} writes {ns.to}'s own file, which cannot hold a program split with "
                                  f"the reference: drop --fallback (`pt2b run --backend {ns.to} --fallback "
                                  f"reference` runs it split).")
    if ns.backend and ns.backend != ns.to:
        raise BackendHandOffError(f"--to {ns.to} lowers to {ns.to}'s own op list: drop --backend {ns.backend}.")
    backends.get(ns.to)  # known and installed, before any lowering
    lowered = lower_from_args(ns, backend=ns.to)
    with progress.status(f"handing {ns.artifact} to {ns.to}"):
        compiled = backends.to_backend(lowered, validate=not ns.no_validate, frozen_state=ns.frozen_state,
                                       **hand_off_options(ns))
    with progress.status(f"writing {ns.output}"):
        compiled.save(ns.output)
    if json_out.wanted(ns):
        json_out.emit({"file": ns.artifact, "to": ns.to, "backend": compiled.backend.key,
                       "methods": {name: lowering_facts(low) for name, low in lowered.methods.items()},
                       "hand_off_validation": validation_facts(compiled.validation), "wrote": ns.output})
        return 0
    if compiled.validation is not None:
        print(compiled.validation.describe())
    print(f"wrote {ns.output} ({compiled.backend.key})")
    return 0
