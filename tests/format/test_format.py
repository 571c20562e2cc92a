"""The container rules of docs/format.md: preamble, header, alignment, checksums,
version refusal, atomic writes and the errors for files that are not artifacts."""

import os
import struct
import zlib

import pytest
import torch

from exporter import export_model, load
from exporter.errors import (ArtifactError, CorruptArtifactError, ExportError, NotAnArtifactError,
                             UnsupportedVersionError)
from exporter.serialize import reader
from exporter.serialize.write import weights
from exporter.layout.container import HEADER_SIZE
from exporter.versioning.formats import FORMAT_MAJOR, FORMAT_MINOR


class Small(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(5, 3)
        self.register_buffer("halves", torch.arange(7, dtype=torch.float16))

    def forward(self, x):
        return self.lin(x) + self.halves.float().sum()


@pytest.fixture
def artifact(tmp_path):
    torch.manual_seed(0)
    path = tmp_path / "small.pt2b"
    export_model(Small(), (torch.randn(2, 5),), path)
    return path


def _rewrite_header(path, **changes):
    data = bytearray(path.read_bytes())
    fields = list(struct.unpack_from("<4sHHIIQQQQIIQ", data, 0))
    names = ["magic", "major", "minor", "header_size", "flags", "data_offset", "data_size",
             "program_offset", "program_size", "program_crc", "header_crc", "alignment"]
    for k, v in changes.items():
        fields[names.index(k)] = v
    struct.pack_into("<4sHHIIQQQQIIQ", data, 0, *fields)
    struct.pack_into("<I", data, 52, zlib.crc32(bytes(data[:52])))
    path.write_bytes(bytes(data))


def test_preamble_and_header(artifact):
    data = artifact.read_bytes()
    assert data[:4] == b"PT2B"
    assert struct.unpack_from("<HH", data, 4) == (FORMAT_MAJOR, FORMAT_MINOR)
    (_, _, _, header_size, flags, d_off, d_size, p_off, p_size, p_crc, _, align) = struct.unpack_from(
        "<4sHHIIQQQQIIQ", data, 0)
    assert header_size == HEADER_SIZE == 64 and flags == 0 and align == 64
    assert d_off % 64 == 0 and d_off >= HEADER_SIZE
    assert p_off >= d_off + d_size and p_off + p_size == len(data)
    assert zlib.crc32(data[p_off:p_off + p_size]) == p_crc
    assert data[p_off + 4:p_off + 8] == b"P2BF"  # FlatBuffers file identifier


def test_segments_aligned_and_weights_mapped_not_copied(artifact):
    art = reader.open_artifact(artifact)
    for seg in art.program.segments:
        assert seg.offset % 64 == 0
    tensors = reader.load_tensors(art)
    data = artifact.read_bytes()
    for name, (_, t, _) in tensors.items():
        if t.numel():
            # the tensor's bytes are the file's bytes at the segment's offset
            assert t.untyped_storage().data_ptr() % 64 == 0
            raw = t.contiguous().view(torch.uint8).reshape(-1).numpy().tobytes()
            assert raw in data
    prog = load(artifact)
    w = prog.exported_program().state_dict["lin.weight"]
    base = tensors["lin.weight"][1]
    assert w.untyped_storage().nbytes() == base.untyped_storage().nbytes()


def test_not_an_artifact(tmp_path):
    p = tmp_path / "x.pt2b"
    p.write_bytes(b"")
    with pytest.raises(NotAnArtifactError, match="too short"):
        load(p)
    p.write_bytes(b"hello world, not a pt2b file at all" * 3)
    with pytest.raises(NotAnArtifactError, match="not a .pt2b artifact"):
        load(p)
    with pytest.raises(NotAnArtifactError, match="is a directory"):
        load(tmp_path)
    with pytest.raises(ArtifactError, match="no such file"):
        load(tmp_path / "missing.pt2b")


def test_newer_major_refused_naming_both_versions(artifact):
    _rewrite_header(artifact, major=FORMAT_MAJOR + 1)
    with pytest.raises(UnsupportedVersionError) as e:
        load(artifact)
    assert f"{FORMAT_MAJOR + 1}.{FORMAT_MINOR}" in str(e.value)
    assert f"{FORMAT_MAJOR}.{FORMAT_MINOR}" in str(e.value)


def test_newer_minor_same_major_is_read(artifact):
    x = torch.randn(2, 5)
    before = load(artifact)(x)
    _rewrite_header(artifact, minor=FORMAT_MINOR + 7)
    assert torch.equal(load(artifact)(x), before)


def test_header_and_program_corruption_detected(artifact):
    data = bytearray(artifact.read_bytes())
    data[20] ^= 0xFF  # inside the header
    artifact.write_bytes(bytes(data))
    with pytest.raises(CorruptArtifactError, match="header checksum"):
        load(artifact)
    data[20] ^= 0xFF
    data[-10] ^= 0x01  # inside the program section
    artifact.write_bytes(bytes(data))
    with pytest.raises(CorruptArtifactError, match="program section checksum"):
        load(artifact)


def test_truncated_file_detected(artifact):
    data = artifact.read_bytes()
    artifact.write_bytes(data[: len(data) // 2])
    with pytest.raises(CorruptArtifactError, match="outside the file"):
        load(artifact)


def test_weight_corruption_detected_only_with_verify(artifact):
    art = reader.open_artifact(artifact)
    seg = art.program.segments[0]
    off = art.header.data_offset + seg.offset
    data = bytearray(artifact.read_bytes())
    data[off] ^= 0x40
    artifact.write_bytes(bytes(data))
    load(artifact)  # O(graph): weights are not read
    with pytest.raises(CorruptArtifactError, match="checksum mismatch in weight segment 0"):
        load(artifact, verify=True)


def test_atomic_write_keeps_previous_file_on_failure(artifact, monkeypatch):
    before = artifact.read_bytes()

    def boom(*a, **k):
        raise RuntimeError("injected failure while writing weights")

    monkeypatch.setattr(weights, "write_segments", boom)
    with pytest.raises(RuntimeError, match="injected failure"):
        export_model(Small(), (torch.randn(2, 5),), artifact)
    assert artifact.read_bytes() == before
    assert [p.name for p in artifact.parent.iterdir()] == [artifact.name]  # no temp file left


def test_bad_destinations(tmp_path):
    with pytest.raises(ExportError, match="is a directory"):
        export_model(Small(), (torch.randn(2, 5),), tmp_path)
    with pytest.raises(ExportError, match="does not exist"):
        export_model(Small(), (torch.randn(2, 5),), tmp_path / "nope" / "m.pt2b")
    os.chmod(tmp_path, 0o500)
    try:
        if os.geteuid() != 0:  # root ignores directory permissions
            with pytest.raises(ExportError, match="permission denied"):
                export_model(Small(), (torch.randn(2, 5),), tmp_path / "m.pt2b")
    finally:
        os.chmod(tmp_path, 0o700)


def test_bad_model_and_inputs(tmp_path):
    with pytest.raises(ExportError, match="needs a torch.nn.Module"):
        export_model(lambda x: x, (torch.randn(2),), tmp_path / "m.pt2b")
    with pytest.raises(ExportError, match="example args must be a tuple"):
        export_model(Small(), {"x": torch.randn(2, 5)}, tmp_path / "m.pt2b")
    with pytest.raises(ExportError, match="torch.export could not capture Small"):
        export_model(Small(), (torch.randn(2, 4),), tmp_path / "m.pt2b")
    assert not (tmp_path / "m.pt2b").exists()


def test_gc_is_paused_during_a_load_and_restored_after(tmp_path):
    import gc

    from exporter.util.gc_pause import gc_paused

    path = tmp_path / "m.pt2b"
    export_model(torch.nn.Linear(3, 2), (torch.randn(1, 3),), path)
    assert gc.isenabled()
    with gc_paused():
        assert not gc.isenabled()
        with gc_paused():
            assert not gc.isenabled()
        assert not gc.isenabled()  # the inner block does not re-enable it early
    assert gc.isenabled()
    with pytest.raises(ZeroDivisionError):
        with gc_paused():
            1 / 0
    assert gc.isenabled()
    load(path)
    assert gc.isenabled()
    gc.disable()
    try:
        load(path)
        assert not gc.isenabled()  # a caller's choice is kept
    finally:
        gc.enable()


def test_decoder_unions_are_what_create_builds():
    from torch._export.serde import schema as S

    from exporter._torch.serde import make_union

    for cls, name, value in [(S.Argument, "as_int", 3), (S.Argument, "as_tensor", S.TensorArgument(name="x")),
                             (S.Argument, "as_none", True), (S.SymInt, "as_int", -1)]:
        a, b = make_union(cls, name, value), cls.create(**{name: value})
        assert type(a) is type(b) and vars(a) == vars(b) and a == b and repr(a) == repr(b)
        assert a.type == name and a.value == value
        with pytest.raises(AttributeError):  # unset members read as torch's unions do
            getattr(a, next(f for f in ("as_float", "as_expr") if hasattr(type(a), "__dataclass_fields__")
                               and f in type(a).__dataclass_fields__ and f != name))


def test_a_member_the_running_torchs_schema_lacks_is_named(monkeypatch):
    """An older torch's export schema (2.11's) lacks members pt2b.fbs has (ScalarType.UINT32,
    Argument.as_float_lists): reading one says so (exporter/_torch/compat.py), not 'damaged'."""
    import enum

    from torch._export.serde import schema as S

    from exporter._torch import compat as torch_compat
    from exporter.errors import UnsupportedVersionError
    from exporter.serialize.mapping import schema_map

    older_scalar_type = enum.IntEnum("ScalarType", {"UNKNOWN": 0, "BYTE": 1})
    with pytest.raises(UnsupportedVersionError, match=r"has no ScalarType\.UINT32 in its export schema"):
        schema_map.dec_leaf(("enum", older_scalar_type), 34, "tensor 'x'")
    with pytest.raises(CorruptArtifactError, match="not a valid ScalarType"):
        schema_map.dec_leaf(("enum", older_scalar_type), 99, "tensor 'x'")

    tag = schema_map.tags(S.Argument)[0]["as_float_lists"]
    assert isinstance(schema_map.unknown_tag(S.Argument, 200, "node"), CorruptArtifactError)  # in no schema
    monkeypatch.setattr(torch_compat, "schema_union_members", lambda cls: frozenset({"as_int"}))
    err = schema_map.unknown_tag(S.Argument, tag, "node")
    assert isinstance(err, UnsupportedVersionError) and "has no Argument.as_float_lists" in str(err)
