"""`pt2b upgrade`: check mode, new file, in place (atomic, verified before replacing), folders."""

import hashlib
import shutil

import pytest
import torch

from exporter import export_model, load
from exporter.errors import ExportError
from exporter.serialize import reader
from exporter.cli import upgrade as upgrade_tool
from exporter.versioning.formats import FORMAT_VERSION, version_str
from tests.cli.test_cli_convert import run_cli


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 3)

    def forward(self, x):
        return torch.nn.functional.gelu(self.lin(x))


@pytest.fixture
def artifact(tmp_path):
    torch.manual_seed(0)
    path = tmp_path / "net.pt2b"
    export_model(Net(), (torch.randn(2, 4),), path, metadata={"owner": "me"})
    return path


def _pretend_older_torch(path, version="2.9.1"):
    """Rewrite the recorded producing torch version (as an artifact from an older torch has): the
    program table's own field, which the graph's copy of the version may precede or follow."""
    import struct
    import zlib

    original = path.read_bytes()
    cur = torch.__version__.encode()
    fake = version.encode().ljust(len(cur), b"+")
    at = original.find(cur)
    while at > 0:
        data = bytearray(original)
        data[at:at + len(cur)] = fake
        (_, _, _, _, _, _, _, p_off, p_size, _, _, _) = struct.unpack_from("<4sHHIIQQQQIIQ", data, 0)
        struct.pack_into("<I", data, 48, zlib.crc32(bytes(data[p_off:p_off + p_size])))  # the program checksum
        struct.pack_into("<I", data, 52, zlib.crc32(bytes(data[:52])))
        path.write_bytes(bytes(data))
        if reader.open_artifact(path).program.torchVersion.decode() == fake.decode():
            return
        at = original.find(cur, at + 1)
    path.write_bytes(original)
    raise AssertionError("the program table's torch version was not found")


def test_check_reports_and_writes_nothing(artifact):
    before = artifact.read_bytes()
    code, out, _ = run_cli("upgrade", "--check", str(artifact))
    cur = version_str(FORMAT_VERSION)
    assert code == 0 and f"unchanged ({cur} -> {cur}): already current" in out
    _pretend_older_torch(artifact)
    edited = artifact.read_bytes()
    code, out, _ = run_cli("upgrade", "--check", str(artifact))
    assert code == 0 and "would change" in out and "op schemas recorded by torch 2.9.1" in out
    assert artifact.read_bytes() == edited != before


def test_upgrade_in_place_and_to_new_file(artifact, tmp_path):
    x = torch.randn(2, 4)
    expected = load(artifact)(x)
    _pretend_older_torch(artifact)
    res = upgrade_tool.upgrade_file(artifact, tmp_path / "new.pt2b")
    assert res.written and (tmp_path / "new.pt2b").exists()
    new = load(tmp_path / "new.pt2b")
    assert new.torch_version == torch.__version__ and new.metadata == {"owner": "me"}
    assert any(k.startswith(f"upgrade@{version_str(FORMAT_VERSION)}") for k in new.provenance)
    assert torch.equal(new(x), expected)
    res = upgrade_tool.upgrade_file(artifact)  # in place
    assert res.written and load(artifact).torch_version == torch.__version__
    assert sorted(p.name for p in tmp_path.iterdir()) == ["net.pt2b", "new.pt2b"]  # no temp files


def test_in_place_upgrade_keeps_the_original_when_verification_fails(artifact, monkeypatch):
    _pretend_older_torch(artifact)
    before = artifact.read_bytes()
    real_load = load

    def failing_load(path, **kw):
        if ".upgrade." in str(path):
            raise ExportError("injected: the upgraded file does not load")
        return real_load(path, **kw)

    import exporter.api

    monkeypatch.setattr(exporter.api, "load", failing_load)
    with pytest.raises(ExportError, match="injected"):
        upgrade_tool.upgrade_file(artifact)
    assert artifact.read_bytes() == before
    assert [p.name for p in artifact.parent.iterdir()] == ["net.pt2b"]


def test_folder_upgrade_summary(artifact, tmp_path):
    sub = tmp_path / "models"
    sub.mkdir()
    for i in range(3):
        shutil.copy(artifact, sub / f"m{i}.pt2b")
    _pretend_older_torch(sub / "m1.pt2b")
    (sub / "broken.pt2b").write_bytes(artifact.read_bytes()[:30])  # truncated
    code, out, _ = run_cli("upgrade", str(sub))
    assert code == 1  # one artifact failed
    assert "4 artifact(s): 1 written, 1 changed, 1 failed" in out
    assert "broken.pt2b: FAILED: CorruptArtifactError" in out and "truncated header" in out


def test_unknown_target_version(artifact):
    code, _, err = run_cli("upgrade", str(artifact), "--to", "9.9")
    assert code == 2 and "format version 9.9 does not exist; known versions: 1.0, 1.1" in err


def test_cli_import_registers_custom_ops(tmp_path):
    from tools.corpus.zoo import make_case

    case = make_case("custom_op")
    path = tmp_path / "c.pt2b"
    export_model(case.model, case.args, path)
    code, out, err = run_cli("--import", "tools.corpus.zoo", "upgrade", "--check", str(path))
    assert code == 0, err
    code, _, err = run_cli("--import", "no_such_mod_q", "inspect", str(path))
    assert code == 2 and "--import no_such_mod_q" in err


@pytest.mark.parametrize("name", ["gelu_backward_1_11", "linspace_1_10", "sdpa_2_0"])
def test_upgrade_rewrites_historical_op_schemas(tmp_path, name):
    import pathlib

    from exporter.versioning.op_table import resolve
    from tests.support.golden_io import load_io

    golden = pathlib.Path(__file__).parents[1] / "golden" / "ops" / f"{name}.pt2b"
    old = load(golden)
    assert any(k.startswith("upgraded_op:") for k in old.provenance)  # upgraded in memory on load
    res = upgrade_tool.upgrade_file(golden, tmp_path / "new.pt2b")
    assert res.written and any("op schemas recorded by torch" in c for c in res.changes)
    new = load(tmp_path / "new.pt2b")
    assert not any(k.startswith("upgraded_op:") for k in new.provenance)  # nothing left to upgrade
    assert new.torch_version == torch.__version__
    for op in new.operators:
        if op.kind == "aten":
            assert op.schema == str(resolve(op.qualified_name, op.overload)._schema)
    (args, kwargs), expected = load_io(golden.with_suffix(".io.npz"))
    torch.testing.assert_close(new(*args, **kwargs), expected, rtol=1e-6, atol=1e-6)
    code, out, _ = run_cli("upgrade", "--check", str(tmp_path / "new.pt2b"))
    assert "already current" in out


def test_older_minor_upgraded_and_written_back(artifact, tmp_path):
    """A 1.0 file (written by export_model(format_version="1.0")) is read, upgraded to the current
    minor by `pt2b upgrade`, and written back to 1.0 by --to 1.0; outputs stay bitwise equal."""
    x = torch.randn(2, 4)
    expected = load(artifact)(x)
    old = tmp_path / "old.pt2b"
    export_model(load(artifact).exported_program(), path=old, format_version="1.0")
    assert load(old).format_version == (1, 0) and load(old).lowering is None
    code, out, _ = run_cli("upgrade", str(old), str(tmp_path / "new.pt2b"))
    assert code == 0 and f"format 1.0 -> {version_str(FORMAT_VERSION)}" in out
    new = load(tmp_path / "new.pt2b")
    assert new.format_version == FORMAT_VERSION and torch.equal(new(x), expected)
    code, out, _ = run_cli("upgrade", str(tmp_path / "new.pt2b"), str(tmp_path / "back.pt2b"), "--to", "1.0")
    assert code == 0 and load(tmp_path / "back.pt2b").format_version == (1, 0)
    assert torch.equal(load(tmp_path / "back.pt2b")(x), expected)


def test_a_lowered_program_does_not_fit_format_1_0(artifact, tmp_path):
    """The lowering record is a 1.1 field: writing 1.0 refuses and says what to do instead."""
    from exporter import load_for_backend

    lowered = load_for_backend(artifact, "core", cache=False)
    path = tmp_path / "low.pt2b"
    export_model(lowered, path=path)
    prog = load(path)
    assert lowered.preset == "core@" + ".".join(torch.__version__.split(".")[:2])  # the frozen list used
    assert prog.lowering == lowered.lowering_record() == {
        "request": lowered.preset, "fingerprint": hashlib.sha256(lowered.fingerprint.encode()).hexdigest(),
        "torch_version": torch.__version__, "outside_opset": dict(lowered.outside_opset)}
    assert prog.ir_level == f"lowered:{lowered.preset}"
    with pytest.raises(ExportError, match=r"format 1\.0 cannot hold this program: Program\.lowering \(the record "
                                          r"of how pt2b lowered this program, added in 1\.1\)\. Write format 1\.1"):
        export_model(lowered, path=tmp_path / "low10.pt2b", format_version="1.0")
    assert not (tmp_path / "low10.pt2b").exists()
    code, _, err = run_cli("upgrade", str(path), str(tmp_path / "x.pt2b"), "--to", "1.0")
    assert code != 0 and "cannot hold this program" in err and not (tmp_path / "x.pt2b").exists()
    # dropping the record is the documented way down
    export_model(lowered.exported_program(), path=tmp_path / "plain10.pt2b", format_version="1.0")
    x = torch.randn(2, 4)
    assert torch.equal(load(tmp_path / "plain10.pt2b")(x), load(path)(x))
    code, out, _ = run_cli("inspect", str(path))
    assert code == 0 and f"lowered for:     {lowered.preset} by torch {torch.__version__}" in out
    code, out, _ = run_cli("lower", str(artifact), "--preset", "core", "--no-cache", "-o", str(tmp_path / "cli.pt2b"))
    assert code == 0 and load(tmp_path / "cli.pt2b").lowering == prog.lowering
    code, out, _ = run_cli("inspect", str(artifact))
    assert code == 0 and "lowered for:     (not lowered by pt2b)" in out
