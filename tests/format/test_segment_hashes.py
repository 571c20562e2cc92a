"""Issue 40: verify hashes the weight segments in parallel (sha256 where the file records digests,
else CRC32, a large segment's CRC32 in chained pieces), and `pt2b verify` starts hashing before it imports torch, using
what it hashed only for the extents the verified program table names."""

from __future__ import annotations

import hashlib
import subprocess
import sys
import zlib

import pytest
import torch

from exporter import export_model
from exporter.errors import CorruptArtifactError
from exporter.serialize import reader
from exporter.serialize.read import segment_hashes


def test_compute_matches_zlib_and_hashlib_including_chained_pieces(monkeypatch):
    monkeypatch.setattr(segment_hashes, "CRC_PIECE", 1000)  # a segment of many pieces
    data = bytes(range(256)) * 40 + b"tail"
    extents = [(0, 0), (3, 5000), (100, 10), (5000, len(data) - 5000)]
    shas = segment_hashes.compute(data, extents, sha256=True, workers=3)
    crcs = segment_hashes.compute(data, extents, sha256=False, workers=3)
    for (start, n), s, c in zip(extents, shas, crcs):
        assert s == segment_hashes.Hashes(None, hashlib.sha256(data[start:start + n]).digest())
        assert c == segment_hashes.Hashes(zlib.crc32(data[start:start + n]), None)


def _artifact(tmp_path, format_version=None):
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8))
    path = tmp_path / "m.pt2b"
    export_model(m, (torch.randn(2, 64),), path, format_version=format_version)
    return path


def _damage_largest_segment(path) -> int:
    art = reader.open_artifact(path)
    seg = max(art.program.segments, key=lambda s: int(s.nbytes))
    index = list(art.program.segments).index(seg)
    at = art.header.data_offset + int(seg.offset) + 7
    art.mm.close()
    raw = bytearray(path.read_bytes())
    raw[at] ^= 0x10
    path.write_bytes(bytes(raw))
    return index


def test_early_hashes_are_used_only_for_the_extents_the_table_names(tmp_path):
    path = _artifact(tmp_path)
    art = reader.open_artifact(path)
    extents = [(art.header.data_offset + int(s.offset), int(s.nbytes)) for s in art.program.segments]
    early = segment_hashes.Early(path)
    got = early.result(extents, sha256=True)
    assert got == segment_hashes.compute(art.mm, extents, sha256=True)
    assert early.result(extents[1:], sha256=True) is None  # another table: recomputed by the reader
    assert reader.verify_weights(art, early) == sum(n for _, n in extents)
    not_ours = tmp_path / "x.pt2b"
    not_ours.write_bytes(b"garbage" * 100)
    assert segment_hashes.Early(not_ours).result(extents, sha256=True) is None  # the reader refuses it, not this


def test_the_caller_hashes_what_is_left_beside_the_early_thread(tmp_path, monkeypatch):
    """`pt2b verify`'s early hashing is one thread (the main thread imports torch meanwhile); once the
    caller asks for the result it hashes the segments left beside that thread, and the hashes are the
    same whichever thread made them."""
    import threading
    import time

    path = _artifact(tmp_path)
    art = reader.open_artifact(path)
    extents = [(art.header.data_offset + int(s.offset), int(s.nbytes)) for s in art.program.segments]
    expected = segment_hashes.compute(art.mm, extents, sha256=True)
    by, sha256 = [], hashlib.sha256

    def slow_sha256(data=b""):
        by.append(threading.current_thread().name)
        time.sleep(0.2)
        return sha256(data)

    monkeypatch.setattr(segment_hashes.hashlib, "sha256", slow_sha256)
    got = segment_hashes.Early(path, process=False).result(extents, sha256=True)
    monkeypatch.undo()
    assert got == expected
    assert len(extents) >= 3 and set(by) == {"pt2b-early-hash", threading.current_thread().name}, by


def test_a_damaged_segment_is_named_whichever_thread_hashed_it(tmp_path):
    """A file that records digests (format 1.3+) is checked by sha256 alone, from the early thread or
    the reader's own hashing; `pt2b verify` names the segment."""
    path = _artifact(tmp_path)
    index = _damage_largest_segment(path)
    for early in (None, segment_hashes.Early(path)):
        with pytest.raises(CorruptArtifactError, match=rf"checksum mismatch in weight segment {index} \(sha256\)"):
            reader.verify_weights(reader.open_artifact(path), early)
    done = subprocess.run([sys.executable, "-m", "exporter", "verify", str(path)], capture_output=True, text=True)
    assert done.returncode != 0 and f"checksum mismatch in weight segment {index} (sha256)" in done.stderr


def test_a_file_without_digests_is_checked_by_crc32(tmp_path):
    """Format 1.2 records no digests: its CRC32s are what verify checks, early thread or not."""
    path = _artifact(tmp_path, format_version="1.2")
    assert reader.weight_digests(reader.open_artifact(path)) is None
    art = reader.open_artifact(path)
    assert reader.verify_weights(art, segment_hashes.Early(path)) == sum(int(s.nbytes) for s in art.program.segments)
    index = _damage_largest_segment(path)
    for early in (None, segment_hashes.Early(path)):
        with pytest.raises(CorruptArtifactError, match=rf"checksum mismatch in weight segment {index} \(CRC32\)"):
            reader.verify_weights(reader.open_artifact(path), early)


def test_a_digest_checked_file_does_not_hash_crc32(tmp_path, monkeypatch):
    """Where the file records digests, the CRC32 (which the digest subsumes) is not computed: verify
    costs one hash of the bytes, as the bench's limit does."""
    path = _artifact(tmp_path)
    monkeypatch.setattr(segment_hashes, "_crc_chain", lambda *a: pytest.fail("CRC32 computed"))
    art = reader.open_artifact(path)
    assert reader.verify_weights(art) == sum(int(s.nbytes) for s in art.program.segments)


def _extents_and_hashes(path):
    art = reader.open_artifact(path)
    extents = [(art.header.data_offset + int(s.offset), int(s.nbytes)) for s in art.program.segments]
    return extents, segment_hashes.compute(art.mm, extents, sha256=True)


def _run(code: str, *, torch_free: bool = True) -> None:
    """Run ``code`` in a new interpreter (where torch is not imported first); with ``torch_free``, it
    must not import torch either."""
    check = "\nimport sys\nassert 'torch' not in sys.modules" if torch_free else ""
    done = subprocess.run([sys.executable, "-c", code + check + "\nprint('ok')"],
                          capture_output=True, text=True, timeout=120)
    assert done.stdout.strip().endswith("ok"), done.stderr[-2000:]


def test_early_hashing_forks_a_child_and_imports_no_torch(tmp_path):
    """Before torch is imported (as `pt2b verify` starts) a child process hashes, so that the GIL an
    import of torch holds does not stall it; its results are the segments' sha256 digests, and the
    child is reaped once they are read."""
    path = _artifact(tmp_path)
    extents, expected = _extents_and_hashes(path)
    _run(
        "import os, sys\nfrom exporter.serialize.read import segment_hashes as sh\n"
        f"e = sh.Early({str(path)!r})\npid = e._pid\nassert pid is not None and e._thread is None\n"
        f"got = e.result({extents!r}, sha256=True)\n"
        f"assert [h.sha256.hex() for h in got] == {[h.sha256.hex() for h in expected]!r}, got\n"
        "try:\n    os.waitpid(pid, os.WNOHANG)\n    raise AssertionError('the child was not reaped')\n"
        "except ChildProcessError:\n    pass\n"
        f"assert sh.Early({str(path)!r}).result({extents[1:]!r}, sha256=True) is None")


def test_closing_early_stops_a_child_still_hashing(tmp_path):
    """A caller that fails before it asks for the result (a damaged program table) leaves no child
    hashing the file behind it."""
    path = _artifact(tmp_path)
    _run(
        "import os, sys, time\nfrom exporter.serialize.read import segment_hashes as sh\n"
        "sh._hash_read = lambda *a: time.sleep(600)\n"
        f"with sh.Early({str(path)!r}) as e:\n    pid = e._pid\n    time.sleep(0.2)\n"
        "try:\n    os.kill(pid, 0)\n    raise AssertionError('the child still runs')\n"
        "except ProcessLookupError:\n    pass")


def test_closing_early_while_its_thread_hashes_stops_it_and_closes_its_file(tmp_path, monkeypatch):
    """In-process (a caller with torch imported): a close before the result stops the thread after the
    segment it holds, and the thread closes the file it read once it returns."""
    import os
    import threading

    path = _artifact(tmp_path)
    started, release, hashed = threading.Event(), threading.Event(), []
    real = segment_hashes._hash_read

    def held(*args):
        hashed.append(args[1])
        started.set()
        release.wait(10)
        return real(*args)

    monkeypatch.setattr(segment_hashes, "_hash_read", held)
    early = segment_hashes.Early(path, process=False)
    assert started.wait(10)
    fd = early._fd
    os.fstat(fd)  # open while the thread reads it
    early.close()
    os.fstat(fd)  # still the thread's: closing it under the thread would fail its read
    release.set()
    early._thread.join(10)
    assert not early._thread.is_alive() and early._fd is None
    with pytest.raises(OSError):
        os.fstat(fd)
    assert len(hashed) == 1  # no segment taken after the close
    assert len(reader.open_artifact(path).program.segments) > 1


def test_once_the_result_is_asked_for_the_child_hashes_on_the_callers_core_too(tmp_path):
    """The child hashes on every core but one while the caller imports torch and checks the program,
    with two threads at least (one reads while the other hashes); once the caller asks for the result,
    its core is free, and the child's own main thread hashes too (on 2 cores: three threads)."""
    path = _artifact(tmp_path)
    extents, expected = _extents_and_hashes(path)
    log = tmp_path / "threads.txt"
    _run(
        "import os, sys, threading, time\nfrom exporter.serialize.read import segment_hashes as sh\n"
        "os.cpu_count = lambda: 2\nhash_read = sh._hash_read\n"
        "def slow(*a):\n"
        f"    with open({str(log)!r}, 'a') as f:\n        f.write(threading.current_thread().name + '\\n')\n"
        "    time.sleep(0.3)\n    return hash_read(*a)\n"
        "sh._hash_read = slow\n"
        f"e = sh.Early({str(path)!r})\ntime.sleep(0.1)\n"
        f"got = e.result({extents!r}, sha256=True)\n"
        f"assert [h.sha256.hex() for h in got] == {[h.sha256.hex() for h in expected]!r}, got")
    names = log.read_text().split()
    assert len(names) == len(extents) >= 3 and "MainThread" in names and len(set(names)) == 3, names


def test_the_command_hashes_in_a_child(tmp_path):
    path = _artifact(tmp_path)
    _run(
        "from exporter.serialize.read import segment_hashes as sh\nforked = []\n"
        "fork = sh.Early._fork\nsh.Early._fork = lambda self, p: (forked.append(p), fork(self, p))\n"
        "from exporter.cli import main\n"
        f"assert main(['--quiet', 'verify', {str(path)!r}]) == 0\nassert forked == [{str(path)!r}], forked",
        torch_free=False)


def test_verifying_a_program_of_operators_imports_neither_torch_export_serializer_nor_dynamo(tmp_path):
    """`pt2b verify`'s start-up: checking a program whose calls are all operators needs neither torch's
    export serializer nor torch._dynamo, which it brings along (0.9 s of the command)."""
    path = _artifact(tmp_path)
    code = ("import sys\nfrom exporter.cli import main\n"
            f"rc = main(['--quiet', 'verify', {str(path)!r}])\n"
            "assert rc == 0, rc\n"
            "assert 'torch._dynamo' not in sys.modules and 'torch._export.serde.serialize' not in sys.modules, "
            "[m for m in sys.modules if m.startswith(('torch._dynamo', 'torch._export.serde.serialize'))][:3]\n"
            "print('ok')")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.stdout.strip().endswith("ok"), done.stderr[-2000:]
