"""Memory set by the bytes a file holds on disk, not by what its header claims: sparse files whose
program section claims gigabytes get a typed error from every entry point with no more than one
bounded piece read into memory, and mapping failures are typed errors naming the file."""

import dataclasses
import os
import pathlib
import subprocess
import sys
import zlib

import pytest
import torch

from exporter import export_model, load
from exporter.cli import main as cli
from exporter.errors import ArtifactError, CorruptArtifactError
from exporter.layout.container import HEADER_SIZE, MAX_PROGRAM_SIZE, unpack_header
from exporter.serialize.read import integrity, section

ROOT = pathlib.Path(__file__).resolve().parents[2]
GIB = 1 << 30


def _sparse_supported(folder: pathlib.Path) -> bool:
    probe = folder / "probe"
    with open(probe, "wb") as f:
        f.truncate(64 << 20)
    ok = os.stat(probe).st_blocks * 512 < (1 << 20)
    probe.unlink()
    return ok


@pytest.fixture()
def sparse_dir(tmp_path):
    if not _sparse_supported(tmp_path):
        pytest.skip("the test folder's filesystem does not keep sparse files sparse")
    return tmp_path


def _artifact(folder: pathlib.Path) -> pathlib.Path:
    path = folder / "m.pt2b"
    export_model(torch.nn.Linear(4, 4), (torch.randn(2, 4),), path)
    return path


def _crc_with_zeros(prefix: bytes, zeros: int) -> int:
    crc, block = zlib.crc32(prefix), bytes(64 << 20)
    while zeros:
        n = min(zeros, len(block))
        crc, zeros = zlib.crc32(block[:n], crc), zeros - n
    return crc


def _claiming(src: pathlib.Path, dest: pathlib.Path, size: int, *, program_offset=None, right_crc=False):
    """``src`` made a sparse file of ``size`` bytes whose header says the program section runs from
    ``program_offset`` (default: its real start) to the end of the file; its CRC32 the real one, or
    (``right_crc``) the one the claimed bytes have: the file's data, then zeros never written."""
    data = src.read_bytes()
    header = unpack_header(data[:HEADER_SIZE], str(src), len(data))
    off = header.program_offset if program_offset is None else program_offset
    crc = _crc_with_zeros(data[off:], size - len(data)) if right_crc else header.program_crc32
    claimed = dataclasses.replace(header, program_offset=off, program_size=size - off, program_crc32=crc)
    with open(dest, "wb") as f:
        f.write(claimed.pack() + data[HEADER_SIZE:])
        f.truncate(size)
    assert os.stat(dest).st_blocks * 512 < (1 << 20)  # a few KB on disk
    return dest


def _count_reads(monkeypatch) -> section.Reads:
    """Counts of the section reads from here on (the file's own export reads it too)."""
    counted = section.Reads()
    monkeypatch.setattr(section, "READS", counted)
    return counted


def test_a_program_section_the_format_cannot_hold_is_refused_before_it_is_read(sparse_dir, monkeypatch):
    """The issue's file: 3 GiB, 4 KB on disk, the program section said to cover the whole file."""
    path = _claiming(_artifact(sparse_dir), sparse_dir / "claims.pt2b", 3 * GIB, program_offset=HEADER_SIZE)
    reads = _count_reads(monkeypatch)
    for step in (lambda: load(path), lambda: integrity.verify_checksums(path)):
        with pytest.raises(CorruptArtifactError, match="more than a FlatBuffer can hold"):
            step()
    assert (reads.pieces, reads.largest) == (0, 0)  # nothing of the section was read
    assert cli(["--quiet", "inspect", str(path)]) == 2
    assert cli(["--quiet", "verify", str(path)]) == 2
    assert (reads.pieces, reads.largest) == (0, 0)


def test_the_size_cap_is_the_largest_flatbuffer():
    assert MAX_PROGRAM_SIZE == 2**31 - 1


@pytest.mark.parametrize("right_crc", [False, True], ids=["wrong-crc", "right-crc"])
def test_a_sparse_program_section_costs_no_memory(sparse_dir, monkeypatch, right_crc):
    """A 1.5 GiB program section of which a few KB are on disk: with the header's CRC32 wrong, a
    checksum error; with it right (the attacker computed it), refused as mostly holes. Either way its
    checksum is computed in one piece of at most section.PIECE bytes, the holes not read."""
    import tracemalloc

    path = _claiming(_artifact(sparse_dir), sparse_dir / "sparse.pt2b", 3 * GIB // 2, right_crc=right_crc)
    match = "holes the file does not hold on disk" if right_crc else "program section checksum mismatch"
    reads = _count_reads(monkeypatch)
    tracemalloc.start()
    try:
        for step in (lambda: load(path), lambda: integrity.verify_checksums(path)):
            with pytest.raises(CorruptArtifactError, match=match):
                step()
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 64 << 20, peak  # against 1.5 GiB claimed
    assert reads.largest <= section.PIECE and reads.pieces <= 4, reads


def test_the_cli_refuses_sparse_claims_under_an_address_space_limit(sparse_dir):
    """`pt2b load`'s entry points in a child limited to 2 GiB of address space (the issue: a raw
    MemoryError from load and inspect, a raw OSError from verify's mapping): each prints one typed
    error line and exits 2; no traceback."""
    src = _artifact(sparse_dir)
    files = [_claiming(src, sparse_dir / "claims.pt2b", 3 * GIB, program_offset=HEADER_SIZE),
             _claiming(src, sparse_dir / "sparse.pt2b", 3 * GIB // 2, right_crc=True)]
    script = f"""
import resource, sys
resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))
from exporter import load
from exporter.cli import main
from exporter.errors import CorruptArtifactError
for p in sys.argv[1:]:
    try:
        load(p)
        sys.exit("loaded " + p)
    except CorruptArtifactError as e:
        print("load:", e)
    for cmd in ("inspect", "verify"):
        print(cmd, main([cmd, p]))
"""
    out = subprocess.run([sys.executable, "-c", script, *map(str, files)], capture_output=True, text=True,
                         timeout=120, cwd=ROOT)  # a hang guard only
    assert out.returncode == 0, out.stdout + out.stderr
    assert "Traceback" not in out.stderr and "MemoryError" not in out.stderr + out.stdout, out.stderr
    assert out.stdout.count("load:") == 2 and out.stdout.count("inspect 2") == 2 and out.stdout.count("verify 2") == 2
    assert out.stderr.count("error (CorruptArtifactError)") == 4, out.stderr


def test_a_mapping_the_system_refuses_is_a_typed_error(tmp_path):
    """A 5 GiB file (sparse) mapped under a 4 GiB address-space limit: ENOMEM from mmap becomes an
    ArtifactError naming the file, from load and from verify's mapping of the weights."""
    if not _sparse_supported(tmp_path):
        pytest.skip("the test folder's filesystem does not keep sparse files sparse")
    src = _artifact(tmp_path)
    big = tmp_path / "big.pt2b"
    data = src.read_bytes()
    big.write_bytes(data)
    with open(big, "r+b") as f:
        f.truncate(5 * GIB)  # zeros after the program section: the header's sections lie within the file
    script = """
import resource, sys
resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))
from exporter import load
from exporter.cli import main
from exporter.errors import ArtifactError
from exporter.serialize.read import integrity
for step in (lambda: load(sys.argv[1]), lambda: integrity.verify_checksums(sys.argv[1])):
    try:
        step()
        print("ok")
    except ArtifactError as e:
        print(type(e).__name__, e)
print("verify", main(["verify", sys.argv[1]]))
"""
    out = subprocess.run([sys.executable, "-c", script, str(big)], capture_output=True, text=True, timeout=120,
                         cwd=ROOT)
    assert out.returncode == 0, out.stdout + out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].startswith("ArtifactError") and "cannot map the file" in lines[0] and str(big) in lines[0], lines
    assert lines[1].startswith("ArtifactError") and "cannot map the file" in lines[1], lines
    assert lines[2] == "verify 2" and "Traceback" not in out.stderr, out.stderr


def test_a_section_is_checksummed_in_bounded_pieces(tmp_path, monkeypatch):
    """A whole program section of several pieces: read PIECE bytes at a time for its checksum, then
    once whole; the file loads."""
    monkeypatch.setattr(section, "PIECE", 512)
    path = _artifact(tmp_path)
    size = unpack_header(path.read_bytes()[:HEADER_SIZE], str(path), path.stat().st_size).program_size
    assert size > 4 * 512
    reads = _count_reads(monkeypatch)
    load(path)
    assert reads.pieces == -(-size // 512) and reads.largest == size


def test_crc_of_zeros_matches_zlib():
    for crc in (0, 1, 0xDEADBEEF):
        for n in (0, 1, 7, 4096, 12345, 1 << 20):
            assert section.crc32_zeros(crc, n) == zlib.crc32(bytes(n), crc)


def test_a_section_with_a_few_holes_still_loads(tmp_path):
    """A sparse copy of a real file (a hole where the file holds a block of zeros) loads: only a
    section mostly holes is refused."""
    if not _sparse_supported(tmp_path):
        pytest.skip("the test folder's filesystem does not keep sparse files sparse")
    path = tmp_path / "m.pt2b"
    export_model(torch.nn.Linear(4, 4), (torch.randn(2, 4),), path, metadata={"pad": b"\0" * (256 << 10)})
    data = path.read_bytes()
    header = unpack_header(data[:HEADER_SIZE], str(path), len(data))
    zeros = data.find(b"\0" * (64 << 10), header.program_offset)
    assert zeros > 0
    hole = (zeros + 4095) // 4096 * 4096
    copy = tmp_path / "copy.pt2b"
    with open(copy, "wb") as f:  # written around a 32 KB hole, as cp --sparse=always would
        f.write(data[:hole])
        f.seek(hole + (32 << 10))
        f.write(data[hole + (32 << 10):])
    with open(copy, "rb") as f:
        assert list(section._runs(f.fileno(), hole, hole + (32 << 10))) == [(hole, 32 << 10, False)]
    assert load(copy).metadata["pad"] == b"\0" * (256 << 10)
