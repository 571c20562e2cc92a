"""Big weight sections are written around the page cache with O_DIRECT (serialize/write/direct.py): the
file is byte for byte the buffered write's, the writer falls back to the buffered write where the
filesystem refuses the flag, and a direct write that fails or is killed leaves the previous file or
nothing, like any other write (docs/format.md "Files and concurrency")."""

from __future__ import annotations

import errno
import gc
import os
import resource
import signal

import pytest
import torch

from exporter import export_model, load
from exporter.errors import ExportError
from exporter.serialize.write import direct, writer
from tests.format import test_atomic_kill as kill

pytestmark = pytest.mark.skipif(not hasattr(os, "O_DIRECT"), reason="O_DIRECT is Linux's")


class Tied(torch.nn.Module):
    """Segments of odd sizes (none a multiple of the 4 KiB block), a tied weight, a buffer."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.emb = torch.nn.Embedding(1000, 77)
        self.mid = torch.nn.Linear(77, 333)
        self.out = torch.nn.Linear(333, 77)
        self.head = torch.nn.Linear(77, 1000, bias=False)
        self.head.weight = self.emb.weight
        self.register_buffer("scale", torch.linspace(0.5, 1.5, 77, dtype=torch.float64))

    def forward(self, ids):
        h = self.emb(ids)
        h = self.out(self.mid(h).relu()) * self.scale.float()
        return self.head(h)


IDS = torch.arange(12).reshape(2, 6)


@pytest.fixture
def direct_small(monkeypatch):
    """Every data section written directly, through buffers of 64 KiB (so several, and both buffers)."""
    monkeypatch.setattr(direct, "DIRECT_FROM", 0)
    monkeypatch.setattr(direct, "BUFFER", 64 << 10)
    monkeypatch.setattr(direct, "faster_here", lambda folder: True)  # (the probe's choice: test_write_probe.py)
    calls = []
    real = direct._pwrite_all

    def counted(fd, view, offset):
        calls.append((offset, len(view)))
        return real(fd, view, offset)

    monkeypatch.setattr(direct, "_pwrite_all", counted)
    return calls


def _needs_direct(folder) -> None:
    """Skip unless ``folder``'s filesystem takes O_DIRECT writes (tmpfs before Linux 6.6 and some overlay
    or network filesystems refuse them, and the writer then falls back: the tests above cover that)."""
    if not direct.folder_takes_direct_writes(folder):
        pytest.skip(f"the filesystem of {folder} refuses O_DIRECT writes")


def _open_fds() -> int:
    """This process's open file descriptors, once what is garbage already has been collected (a file
    mapping an earlier load left to the collector holds one until then)."""
    gc.collect()
    return len(os.listdir("/proc/self/fd"))


def _pwrites_are_aligned(calls) -> None:
    assert calls, "nothing was written directly"
    assert all(off % direct.BLOCK == 0 and n % direct.BLOCK == 0 for off, n in calls), calls
    assert [off for off, _ in calls] == sorted(off for off, _ in calls)


@pytest.mark.parametrize("block", [4 << 10, 1 << 20], ids=["4KiB", "1MiB"])
def test_direct_write_is_the_buffered_write_byte_for_byte(tmp_path, direct_small, monkeypatch, block):
    """(Blocks of 1 MiB: the direct write's zeros after the data section reach past the program table's
    end, and the file is cut back to its length.)"""
    _needs_direct(tmp_path)
    monkeypatch.setattr(direct, "BLOCK", block)
    monkeypatch.setattr(direct, "BUFFER", max(direct.BUFFER, 2 * block))
    m = Tied().eval()
    with monkeypatch.context() as buffered:
        buffered.setattr(direct, "DIRECT_FROM", 1 << 62)
        export_model(m, (IDS,), tmp_path / "buffered.pt2b")
    assert not direct_small
    export_model(m, (IDS,), tmp_path / "direct.pt2b")
    _pwrites_are_aligned(direct_small)
    size = os.path.getsize(tmp_path / "direct.pt2b")
    assert size // 2 < sum(n for _, n in direct_small) < size + 2 * block  # the weights, not the program table
    assert len(direct_small) > 3 or block > 4096  # several buffers, in turns
    assert (tmp_path / "direct.pt2b").read_bytes() == (tmp_path / "buffered.pt2b").read_bytes()
    got = load(tmp_path / "direct.pt2b", verify=True)(IDS)
    assert torch.equal(got, m(IDS))


def test_small_sections_stay_in_the_page_cache(tmp_path, monkeypatch):
    opened = []
    monkeypatch.setattr(direct, "DirectSink", lambda fd: opened.append(fd))
    export_model(Tied().eval(), (IDS,), tmp_path / "m.pt2b")
    assert opened == []


@pytest.mark.parametrize("how", ["no-flag", "open-refused", "write-refused", "switched-off"])
def test_a_filesystem_without_direct_writes_gets_the_buffered_write(tmp_path, direct_small, monkeypatch, how):
    m = Tied().eval()
    export_model(m, (IDS,), tmp_path / "want.pt2b")
    direct_small.clear()
    if how == "no-flag":  # macOS, Windows
        monkeypatch.delattr(os, "O_DIRECT")
    elif how == "switched-off":  # a filesystem that takes direct writes slowly: the user's choice
        monkeypatch.setenv("PT2B_DIRECT_WRITES", " Off ")
    elif how == "open-refused":
        real_open = os.open

        def no_direct_open(path, flags, *a, **k):
            if flags & direct.os.O_DIRECT:
                raise OSError(errno.EINVAL, os.strerror(errno.EINVAL))
            return real_open(path, flags, *a, **k)

        monkeypatch.setattr(os, "open", no_direct_open)
    else:  # the flag taken at open, the aligned write refused (some FUSE and network filesystems)
        def refused(fd, data, offset):
            raise OSError(errno.EINVAL, os.strerror(errno.EINVAL))

        monkeypatch.setattr(os, "pwrite", refused)
    fds = _open_fds()
    export_model(m, (IDS,), tmp_path / "got.pt2b")
    assert direct_small == [] and _open_fds() == fds
    assert (tmp_path / "got.pt2b").read_bytes() == (tmp_path / "want.pt2b").read_bytes()


@pytest.mark.parametrize("value, on", [(None, True), ("", True), ("1", True), ("yes", True), ("0", False),
                                       ("off", False), ("FALSE", False), (" no ", False)])
def test_direct_writes_switch(tmp_path, direct_small, monkeypatch, value, on):
    """PT2B_DIRECT_WRITES as every pt2b switch is read: unset or empty is the default (on)."""
    _needs_direct(tmp_path)
    if value is None:
        monkeypatch.delenv("PT2B_DIRECT_WRITES", raising=False)
    else:
        monkeypatch.setenv("PT2B_DIRECT_WRITES", value)
    export_model(Tied().eval(), (IDS,), tmp_path / "m.pt2b")
    assert bool(direct_small) == on


def test_disk_full_during_a_direct_write(tmp_path, direct_small, monkeypatch):
    _needs_direct(tmp_path)
    dest = tmp_path / "out" / "m.pt2b"
    dest.parent.mkdir()
    export_model(kill.Small(1), (kill.X_SMALL,), dest)
    before, listing = dest.read_bytes(), sorted(os.listdir(dest.parent))
    real = direct._pwrite_all

    def fills(fd, view, offset):
        if offset >= 2 * direct.BUFFER:  # the third buffer finds the disk full
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real(fd, view, offset)

    monkeypatch.setattr(direct, "_pwrite_all", fills)
    fds = _open_fds()
    with pytest.raises(ExportError, match="disk is full") as info:
        export_model(kill.Small(2), (kill.X_SMALL,), dest)
    assert str(dest) in str(info.value) and isinstance(info.value.__cause__, OSError)
    assert sorted(os.listdir(dest.parent)) == listing and _open_fds() == fds
    kill._assert_intact(dest, before, kill.Small(1)(kill.X_SMALL), kill.X_SMALL)


def test_direct_write_over_the_file_size_limit(tmp_path, direct_small):
    """The kernel's own mid-write failure (RLIMIT_FSIZE: EFBIG) on the direct write's I/O thread."""
    _needs_direct(tmp_path)
    dest = tmp_path / "m.pt2b"
    old_limit, old_handler = resource.getrlimit(resource.RLIMIT_FSIZE), signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (128 << 10, old_limit[1]))
    try:
        with pytest.raises(ExportError, match="File too large"):
            export_model(kill.Small(2), (kill.X_SMALL,), dest)
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, old_limit)
        signal.signal(signal.SIGXFSZ, old_handler)
    assert os.listdir(tmp_path) == []


def test_a_graph_that_fails_stops_the_direct_write(tmp_path, direct_small, monkeypatch):
    def refuse(ep):
        raise ExportError("refused for the test")

    monkeypatch.setattr(writer, "serialize_graph", refuse)
    fds = _open_fds()
    with pytest.raises(ExportError, match="refused for the test"):
        export_model(Tied().eval(), (IDS,), tmp_path / "m.pt2b")
    assert os.listdir(tmp_path) == [] and _open_fds() == fds


def test_direct_write_killed_midway_leaves_the_previous_file(tmp_path):
    """A real child exporting ~100 MB directly, SIGKILLed with a third of the weights written."""
    _needs_direct(tmp_path)
    folder = tmp_path / "out"
    folder.mkdir()
    dest = folder / "model.pt2b"
    prev, prev_out = kill._previous(dest)
    before = set(os.listdir(folder))
    proc = kill._spawn("export", str(dest), "5", str(kill.BIG_LAYERS), direct=True)
    kill._kill_when(proc, lambda: any(s >= kill.BIG_BYTES // 3 for s in kill._new_files(folder, before).values()))
    kill._assert_intact(dest, prev, prev_out)
    partial = kill._new_files(folder, before)
    assert partial and all(kill.BIG_BYTES // 3 <= s < kill.BIG_BYTES for s in partial.values()), partial
    kill._check_leftovers(folder, {"model.pt2b"})
