"""The programs of a .pt2 archive checked as pt2b checks its own, before torch's deserializer reads
them: torch.export.load evaluates their symbolic expressions and resolves their names and targets."""

from __future__ import annotations

from ..errors import ArtifactError, CorruptArtifactError
from ..util import nesting
from .pt2_pickles import program_entries

# A program's JSON nests one level per dataclass, union, list and argument; subgraphs nest inside
# their parent's arguments. The JSON decoder and torch's dataclass builder recurse on it, so its depth
# is bounded before either runs, far above what real programs hold (a test measures the zoo).
MAX_PROGRAM_DEPTH = 256


def check_programs(f, source) -> None:
    """CorruptArtifactError (or ArtifactError for what torch's own schema refuses) unless every
    program in the open archive ``f`` passes pt2b's checks on untrusted programs: targets and
    operators through torch's registry, expressions parsed and never evaluated, names, guards, and
    state and module paths that would break out of the code torch generates from them."""
    from torch.export.pt2_archive import PT2ArchiveReader

    from .._torch.serde import schema as S
    from .._torch.serializer import bytes_to_dataclass
    from ..serialize.read import untrusted

    try:
        archive = PT2ArchiveReader(f)
    except Exception:  # not the zip layout: torch.export.load reads the legacy one, refused by its pickles
        return
    for name in program_entries(archive.get_file_names()):  # every entry torch reads as a program
        where = f"{source}: {name}"
        data = archive.read_bytes(name)
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as e:
            raise CorruptArtifactError(f"{where}: the program is not UTF-8 JSON ({e}).") from None
        nesting.check_text(text, MAX_PROGRAM_DEPTH, where, "the program's JSON", quotes='"')
        try:
            serialized = bytes_to_dataclass(S.ExportedProgram, data)
        except Exception as e:
            raise ArtifactError(f"{where}: the program does not follow torch's export schema "
                                f"({type(e).__name__}: {e}).") from None
        untrusted.check_program(serialized, where)
        unsafe = _paths_breaking_out(serialized)
        if unsafe:
            raise CorruptArtifactError(
                f"{where}: state or module path {unsafe[0]!r} holds a component that breaks out of the string "
                f"torch's code generation writes it into ({len(unsafe)} such path{'s' if len(unsafe) > 1 else ''}): "
                f"torch.export.load would run it as code. Convert only files you trust with `--trust-pickle`.")
        gm = serialized.graph_module
        root = gm.module_call_graph[0].signature if gm.module_call_graph else None
        untrusted.check_guards(untrusted.distinct_guards(serialized.guards_code), None,
                               list(root.forward_arg_names or []) if root else [], f"{where}: guards_code")


def _paths_breaking_out(serialized) -> list[str]:
    """The state and module paths of which a component names.breaks_out (pt2b aliases such a component
    in its own files; torch's deserializer, which reads the .pt2, pastes it as it is)."""
    from .. import names

    found = []

    def note(path: str) -> str:
        if any(names.breaks_out(c) for c in path.split(".")):
            found.append(path)
        return path

    names.rename_state_paths(serialized, note)
    return found
