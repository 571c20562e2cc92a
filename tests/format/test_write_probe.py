"""The writer takes the direct road for big weights only where it measured faster (direct.faster_here: one
timed write each way, once per filesystem), falls back where the filesystem refuses O_DIRECT, and a byte
damaged between the write and its read-back check is an ExportError, never a file."""

from __future__ import annotations

import errno
import os

import pytest
import torch

from exporter import export_model, load
from exporter.errors import ExportError
from exporter.layout.container import HEADER_SIZE, unpack_header
from exporter.serialize.write import direct, writer
from tests.format.test_write_direct import IDS, Tied, _needs_direct

pytestmark = pytest.mark.skipif(not hasattr(os, "O_DIRECT"), reason="O_DIRECT is Linux's")


@pytest.fixture
def big(monkeypatch):
    """Every data section counts as big (direct writes considered), buffers of 64 KiB, no decision
    remembered; returns the lengths given to a direct write."""
    monkeypatch.setattr(direct, "DIRECT_FROM", 0)
    monkeypatch.setattr(direct, "BUFFER", 64 << 10)
    monkeypatch.setattr(direct, "_faster", {})
    monkeypatch.delenv("PT2B_DIRECT_WRITES", raising=False)
    calls = []
    real = direct.DirectSink.write

    def counted(sink, data):
        calls.append(len(data))
        return real(sink, data)

    monkeypatch.setattr(direct.DirectSink, "write", counted)
    return calls


@pytest.mark.parametrize("faster", [True, False])
def test_the_measured_road_is_taken_and_the_bytes_are_the_same(tmp_path, big, monkeypatch, faster):
    _needs_direct(tmp_path)
    m = Tied().eval()
    with monkeypatch.context() as small:
        small.setattr(direct, "DIRECT_FROM", 1 << 62)
        export_model(m, (IDS,), tmp_path / "want.pt2b")
    asked = []
    monkeypatch.setattr(direct, "measure", lambda folder: asked.append(folder) or faster)
    export_model(m, (IDS,), tmp_path / "got.pt2b")
    assert asked == [str(tmp_path)]
    assert bool(big) == faster
    assert (tmp_path / "got.pt2b").read_bytes() == (tmp_path / "want.pt2b").read_bytes()
    assert torch.equal(load(tmp_path / "got.pt2b", verify=True)(IDS), m(IDS))


def test_measured_once_per_filesystem(tmp_path, big, monkeypatch):
    asked = []
    monkeypatch.setattr(direct, "measure", lambda folder: asked.append(folder) or False)
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    for name in ("a/1.pt2b", "a/2.pt2b", "b/3.pt2b"):  # two folders, one filesystem
        export_model(Tied().eval(), (IDS,), tmp_path / name)
    assert asked == [str(tmp_path / "a")] and not big
    assert direct._faster == {os.stat(tmp_path).st_dev: False}


@pytest.mark.parametrize("buffered_s, direct_s, chosen", [(1.0, 0.5, True), (1.0, 1.0, True), (1.0, 1.2, True),
                                                         (1.0, 1.3, False), (1.0, 2.0, False)])
def test_direct_writes_are_kept_unless_clearly_slower(tmp_path, monkeypatch, buffered_s, direct_s, chosen):
    """A tie or a small margin is noise (the small probe is the page cache's best case): only a direct write
    more than SLOWER_BY times slower than the buffered one turns direct writes off."""
    took = []

    def timed(folder, data, use_direct):
        assert len(data) == direct.BUFFER and folder == tmp_path
        took.append(use_direct)
        return direct_s if use_direct else buffered_s

    monkeypatch.setattr(direct, "_timed_write", timed)
    assert direct.SLOWER_BY == 1.25
    assert direct.measure(tmp_path) is chosen
    assert took == [False, True, True, False]  # in turns


def test_a_folder_refusing_o_direct_measures_slower_and_gets_the_buffered_write(tmp_path, big, monkeypatch):
    real_open = os.open

    def no_direct_open(path, flags, *a, **k):
        if flags & os.O_DIRECT:
            raise OSError(errno.EINVAL, os.strerror(errno.EINVAL))
        return real_open(path, flags, *a, **k)

    m = Tied().eval()
    export_model(m, (IDS,), tmp_path / "want.pt2b")
    monkeypatch.setattr(direct, "_faster", {})
    big.clear()
    monkeypatch.setattr(os, "open", no_direct_open)
    assert direct.measure(tmp_path) is False
    export_model(m, (IDS,), tmp_path / "got.pt2b")
    assert not big and direct._faster == {os.stat(tmp_path).st_dev: False}
    assert (tmp_path / "got.pt2b").read_bytes() == (tmp_path / "want.pt2b").read_bytes()
    assert sorted(os.listdir(tmp_path)) == ["got.pt2b", "want.pt2b"]  # no probe file left


def test_the_probe_leaves_no_file(tmp_path, monkeypatch):
    monkeypatch.setattr(direct, "BUFFER", 1 << 20)
    assert direct.measure(tmp_path) in (True, False)  # (the real timing: either road may win here)
    assert os.listdir(tmp_path) == []


def test_switched_off_never_probes(tmp_path, big, monkeypatch):
    monkeypatch.setenv("PT2B_DIRECT_WRITES", "0")
    monkeypatch.setattr(direct, "measure", lambda folder: pytest.fail("probed although switched off"))
    export_model(Tied().eval(), (IDS,), tmp_path / "m.pt2b")
    assert not big and direct._faster == {}


@pytest.mark.parametrize("road", ["buffered", "direct"])
def test_a_byte_damaged_between_write_and_check_is_caught(tmp_path, big, monkeypatch, road):
    """One bit of the program section flipped in the file after the writer wrote it and before its check
    reads it back: the check refuses the file, nothing is left at the destination."""
    if road == "direct":
        _needs_direct(tmp_path)
    monkeypatch.setattr(direct, "measure", lambda folder: road == "direct")
    real_check = writer.check_readable

    def damaged(tmp, dest):
        with open(tmp, "r+b") as f:
            header = unpack_header(f.read(HEADER_SIZE), tmp, os.path.getsize(tmp))
            f.seek(header.program_offset + header.program_size // 2)
            byte = f.read(1)
            f.seek(-1, os.SEEK_CUR)
            f.write(bytes([byte[0] ^ 0x10]))
        return real_check(tmp, dest)

    monkeypatch.setattr(writer, "check_readable", damaged)
    dest = tmp_path / "m.pt2b"
    with pytest.raises(ExportError) as info:
        export_model(Tied().eval(), (IDS,), dest)
    assert str(info.value) == (f"pt2b would refuse to load what it was about to write, so {str(dest)!r} was not "
                               f"written: CorruptArtifactError: {dest}: program section checksum mismatch; the file "
                               f"is damaged (re-export or re-copy it).")
    assert bool(big) == (road == "direct")
    assert os.listdir(tmp_path) == []
