"""load() checks the whole file and answers from the table at once; torch's deserializer (the fx
graph, fake tensors, the ExportedProgram) runs on first use, once, and builds what an eager
rebuild builds."""

from __future__ import annotations

import threading

import pytest
import torch

from exporter import export_model, load
from exporter.corpus.zoo import make_case
from exporter.serialize import reader
from helpers import assert_bitwise


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


def test_the_program_built_on_first_use_is_the_eager_rebuilds(artifact):
    path, case = artifact
    prog = load(path)
    eager = reader.rebuild(reader.open_artifact(path))
    lazy = prog.exported_program()
    assert lazy.graph_module.code == eager.graph_module.code
    assert str(lazy.graph_signature) == str(eager.graph_signature)
    assert {k: v.shape for k, v in lazy.state_dict.items()} == {k: v.shape for k, v in eager.state_dict.items()}
    assert_bitwise(prog(*case.args), eager.module()(*case.args))


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


def test_damage_the_checks_find_is_refused_at_load_not_at_first_use(tmp_path):
    """Every check of the file runs in load(): a weight whose bytes changed is refused there
    (verify=True), before any program is built."""
    from exporter.errors import CorruptArtifactError

    case = make_case("mlp")
    path = tmp_path / "m.pt2b"
    export_model(case.model, case.args, path)
    data = bytearray(path.read_bytes())
    data[-8] ^= 0xFF  # the last weight segment's last bytes
    path.write_bytes(bytes(data))
    with pytest.raises(CorruptArtifactError, match="checksum"):
        load(path, verify=True)
