"""The read stage: an opened artifact's methods as Pt2bPrograms (what ``load`` returns, and what a
lowering starts from); what the op table and records answer is read now, the graph on first use."""

from __future__ import annotations

from . import dims
from .lazy import Lazy
from .program import OperatorInfo, Pt2bProgram
from .serialize import reader
from .layout.generated import pt2b_generated as G
from .util.gc_pause import gc_paused
from ._torch.deferred_codegen import deferred

_KIND_NAMES = {v: k.lower() for k, v in vars(G.OperatorKind).items() if not k.startswith("_")}


def programs_of(art, *, verify: bool) -> Pt2bProgram:
    """The default method's program of an opened artifact, with every method's (``.methods``): one
    file mapping, so a storage the methods share is one set of bytes. ``verify``: every weight
    segment is checked against its recorded digest first, whichever method uses it."""
    if verify:
        reader.verify_weights(art)
    methods: dict[str, Pt2bProgram] = {}
    for name in art.method_names:
        methods[name] = program_of(reader.method(art, name), methods=methods)
    return methods[art.method_names[0]]


def program_of(art, *, methods: dict | None = None) -> Pt2bProgram:
    """The program of one method of an opened artifact (callers pause collection around opening and
    this): what the op table, metadata and records answer is read now, with every check opening the
    file made (header, checksums, the FlatBuffer walk of all but the graph); the graph's walk,
    decoding and checks on its first use, then torch's deserializer (the fx graph, fake tensors, the
    ExportedProgram). ``methods``: the dict of every method by name that the caller fills."""
    reader.check_ops(art)  # a missing op or an unreconcilable schema is refused now, from the op table

    def check():
        with gc_paused():
            return reader.check(art)

    checked = Lazy(check)

    def build():
        c = checked.get()
        with gc_paused(), deferred():  # the graph modules made generate their code on first use: torch's
            return reader.build(art, c)  # deserializer's never, the program's once

    def build_for_call():  # what a first call runs, where the ExportedProgram is not built yet
        c = checked.get()
        with gc_paused(), deferred():
            return reader.build_for_call(art, c)

    prog = art.program
    ops = [OperatorInfo(q, o, s, _KIND_NAMES.get(k, "?"), int(r.count))
           for (q, o, s, k), r in zip(reader.operator_records(art), prog.operators or [])]
    provenance = reader.read_provenance(art)
    if art.format_notes:  # an older major brought to today's by versioning/majors.py steps
        provenance["upgraded_format"] = "; ".join(art.format_notes)

    def upgraded():  # op schema upgrades are known once the graph is checked (in memory only:
        checked.get()  # `pt2b upgrade` folds them into its own entry)
        out = dict(provenance)
        for note in art.upgrade_notes:
            op, _, what = note.partition(": ")
            out[f"upgraded_op:{op}"] = what
        return out

    return Pt2bProgram(
        Lazy(build), path=art.path, format_version=art.version, torch_version=reader.text(prog.torchVersion),
        producer=reader.text(prog.producer), ir_level=reader.text(prog.irLevel), operators=ops,
        metadata=reader.read_metadata(art), provenance=Lazy(upgraded), lowering=reader.read_lowering(art),
        checked=checked, method=art.method, for_call=Lazy(build_for_call), methods=methods,
        dim_names=dims.from_provenance(provenance, art.method),
    )


def same_content(path, digest: str, name: str) -> Pt2bProgram:
    """Method ``name``'s program of the artifact at ``path``, refused where the file's content is no
    longer the one whose program section has ``digest`` (a cache hit's source, read on first use)."""
    from .errors import ArtifactError

    with gc_paused():
        art = reader.open_artifact(path)
        if art.digest != digest:
            raise ArtifactError(f"{art.path}: the file changed after load_for_backend served its lowering from "
                                "the cache; call load_for_backend again to lower the new content.")
        return program_of(reader.method(art, name))


def exported_program_of(program: Lazy):
    """The ExportedProgram of a Pt2bProgram read on first use."""
    return program.get().exported_program()
