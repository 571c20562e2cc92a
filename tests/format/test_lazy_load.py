"""load() checks the file's header, checksums and every table but the graph, and answers from them
at once; the graph's checks run at its first use, before torch's deserializer (the fx graph, fake
tensors, the ExportedProgram) runs, once, and builds what an eager rebuild builds."""

from __future__ import annotations

import copy
import threading

import pytest
import torch

from exporter import export_model, load
from tools.corpus.zoo import make_case, zoo_names
from exporter.serialize import reader
from tests.support.artifact_surgery import damage_graph_table
from tests.support.helpers import assert_bitwise, assert_programs_equal


@pytest.fixture(scope="module")
def artifact(tmp_path_factory):
    case = make_case("transformer_encoder")
    path = tmp_path_factory.mktemp("lazy") / "m.pt2b"
    export_model(case.model, case.args, path, metadata={"k": 1})
    return path, case


def test_load_answers_from_the_table_without_building(artifact):
    path, _ = artifact
    prog = load(path)
    assert not prog._built.done
    assert prog.ops() and prog.metadata == {"k": 1} and prog.format_version and prog.operators
    assert not prog._built.done  # none of those built the program
    prog.exported_program()
    assert prog._built.done


@pytest.mark.parametrize("name", zoo_names())
def test_the_program_built_on_first_use_is_the_eager_rebuilds(name, tmp_path):
    """On the whole round-trip zoo: the same graph (node by node, metadata included), signature,
    state and constants, and the same outputs as reader.rebuild, which checks and builds at once."""
    case = make_case(name)
    path = tmp_path / "m.pt2b"
    export_model(case.model, case.args, path, kwargs=case.kwargs, dynamic_shapes=case.dynamic_shapes)
    prog = load(path)
    eager = reader.rebuild(reader.open_artifact(path))
    lazy = prog.exported_program()
    assert_programs_equal(lazy, eager)  # graph node by node, signature, state, constants, ranges
    assert lazy.graph_module.code == eager.graph_module.code
    args, kwargs = copy.deepcopy(case.args), copy.deepcopy(case.kwargs or {})
    assert_bitwise(prog(*args, **kwargs), eager.module()(*copy.deepcopy(case.args), **copy.deepcopy(case.kwargs or {})))


def test_threads_asking_first_build_it_once(artifact, monkeypatch):
    path, _ = artifact
    prog = load(path)
    calls, real = [], reader.build

    def counting(*a, **k):
        calls.append(1)
        return real(*a, **k)

    monkeypatch.setattr(reader, "build", counting)
    got = []
    threads = [threading.Thread(target=lambda: got.append(prog.exported_program())) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(calls) == 1 and len(got) == 4 and all(g is got[0] for g in got)


def test_damage_to_the_weights_is_refused_at_load_with_verify(tmp_path):
    """verify=True checks every weight segment in load(), before any program is built."""
    from exporter.errors import CorruptArtifactError

    case = make_case("mlp")
    path = tmp_path / "m.pt2b"
    export_model(case.model, case.args, path)
    data = bytearray(path.read_bytes())
    data[-8] ^= 0xFF  # the last weight segment's last bytes
    path.write_bytes(bytes(data))
    with pytest.raises(CorruptArtifactError, match="checksum"):
        load(path, verify=True)


@pytest.mark.parametrize("first_use", ["exported_program", "call", "check", "graph_signature", "provenance"])
def test_a_damaged_graph_loads_its_table_and_is_refused_at_first_use(tmp_path, first_use):
    """The op table answers; every use of the graph raises the verifier's error (every time: the
    check stays pending), before torch's deserializer sees a byte of it."""
    from exporter.errors import CorruptArtifactError

    path = damage_graph_table(tmp_path)
    prog = load(path)
    assert prog.ops() == load(path).ops() and prog.ops()
    use = {"exported_program": lambda: prog.exported_program(), "call": lambda: prog(torch.ones(2, 4)),
           "check": prog.check, "graph_signature": lambda: prog.graph_signature,
           "provenance": lambda: prog.provenance}[first_use]
    for _ in range(2):
        with pytest.raises(CorruptArtifactError,
                           match=r"program section is malformed: Program\.exported_program \(ExportedProgram\) vtable"):
            use()
    assert not prog._built.done


def test_the_deferred_walk_says_what_the_whole_walk_says(tmp_path):
    """buffer_bounds.problem over the whole buffer and load() + first use name the same place."""
    from exporter.errors import CorruptArtifactError
    from exporter.serialize.read import buffer_bounds

    path = damage_graph_table(tmp_path)
    art = reader.open_artifact(path)
    whole = buffer_bounds.problem(art.program.exportedProgram.buf)
    with pytest.raises(CorruptArtifactError) as e:
        load(path).check()
    assert whole and str(e.value) == f"{path}: program section is malformed: {whole}."


def test_pt2b_verify_walks_the_graph_load_defers(tmp_path, capsys):
    """`pt2b verify` checks everything, the graph's walk included: a damaged graph fails there
    with the verifier's message even though load() itself returns."""
    from exporter import cli

    path = damage_graph_table(tmp_path)
    load(path)  # the table answers
    assert cli.main(["verify", str(path)]) == 2
    err = capsys.readouterr().err
    assert "CorruptArtifactError" in err and "Program.exported_program (ExportedProgram) vtable" in err
