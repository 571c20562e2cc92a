"""Issue 40: `pt2b verify --checksums` runs the file's own checks (header, program checksum, every table's
bounds, each weight segment's bounds and checksum) without importing torch, so that a copy is checked at
the speed of reading it, on a machine with or without torch; `pt2b verify` alone adds every check against
the running torch."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
import zlib

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from exporter import cli, export_model, load_for_backend
from exporter.errors import CorruptArtifactError, Pt2bError
from exporter.serialize import reader
from exporter.layout.generated import pt2b_generated as G
from exporter.layout.container import HEADER_SIZE
from exporter.layout.segments import read_segments
from exporter.serialize.read import integrity
from tests.support.artifact_surgery import add_op_record, damage_graph_table, rewrite_artifact

# `pt2b ...` in a fresh interpreter where importing torch fails: what runs there needs no torch
NO_TORCH = ("import sys\nsys.modules['torch'] = None\nfrom exporter.cli import main\n"
            "rc = main(['--quiet', 'verify', '--checksums', sys.argv[1]])\n"
            "assert not [m for m in sys.modules if m.startswith('torch') and sys.modules[m] is not None]\n"
            "sys.exit(rc)")


def verify_without_torch(path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", NO_TORCH, str(path)], capture_output=True, text=True, timeout=120)


def _artifact(tmp_path, name="m.pt2b", format_version=None):
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8))
    path = tmp_path / name
    export_model(m, (torch.randn(2, 64),), path, format_version=format_version)
    return path


def _flip_byte_of_segment(path, which: int = -1) -> int:
    art = reader.open_artifact(path)
    order = sorted(range(len(art.program.segments)), key=lambda i: int(art.program.segments[i].nbytes))
    index = order[which]
    at = art.header.data_offset + int(art.program.segments[index].offset) + 5
    art.mm.close()
    raw = bytearray(path.read_bytes())
    raw[at] ^= 0x01
    path.write_bytes(bytes(raw))
    return index


@pytest.mark.parametrize("format_version", [None, "1.2"])
def test_a_sound_file_is_verified_without_torch(tmp_path, format_version):
    path = _artifact(tmp_path, format_version=format_version)
    art = reader.open_artifact(path)
    nbytes = sum(int(s.nbytes) for s in art.program.segments)
    art.mm.close()
    done = verify_without_torch(path)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == (f"{path}: file OK (program and {nbytes} bytes of weights; checksums only: "
                                   "`pt2b verify` without --checksums also checks the program against torch)")


@pytest.mark.parametrize("format_version, kind", [(None, "sha256"), ("1.2", "CRC32")])
@pytest.mark.parametrize("which", [0, -1])  # the smallest segment and the largest
def test_a_damaged_weight_is_named_without_torch(tmp_path, format_version, kind, which):
    path = _artifact(tmp_path, format_version=format_version)
    index = _flip_byte_of_segment(path, which)
    done = verify_without_torch(path)
    assert done.returncode == 2
    assert (f"pt2b: artifact error (CorruptArtifactError): {path}: checksum mismatch in weight segment {index} ({kind}); the weights are "
            "damaged or are not the ones the program section records (re-export or re-copy the file).") in done.stderr


def test_a_damaged_graph_table_is_walked_now_not_left_to_first_use(tmp_path):
    """load() leaves a graph's bounds walk to its first use; --checksums walks every table at once."""
    path = damage_graph_table(tmp_path, _artifact(tmp_path))
    done = verify_without_torch(path)
    assert done.returncode == 2
    assert "CorruptArtifactError" in done.stderr and "Program.exported_program (ExportedProgram) vtable" in done.stderr


@pytest.mark.parametrize("cut", ["program", "weights"])
def test_a_truncated_or_damaged_file_is_refused_without_torch(tmp_path, cut):
    path = _artifact(tmp_path)
    raw = bytearray(path.read_bytes())
    art = reader.open_artifact(path)
    program_offset, data_offset = art.header.program_offset, art.header.data_offset
    art.mm.close()
    if cut == "program":
        raw[program_offset + 40] ^= 0xFF
        path.write_bytes(bytes(raw))
        want = "program section checksum mismatch; the file is damaged (re-export or re-copy it)."
    else:
        path.write_bytes(bytes(raw[:data_offset + 100]))
        want = "lies outside the file"
    done = verify_without_torch(path)
    assert done.returncode == 2 and want in done.stderr, done.stderr[-2000:]


def test_what_only_the_full_verify_refuses(tmp_path, capsys):
    """An op the running torch lacks leaves the file sound: --checksums says OK, `pt2b verify` refuses it
    as load would."""
    path = rewrite_artifact(_artifact(tmp_path), tmp_path / "op.pt2b", keep_graph=True,
                            edit=lambda _, p: add_op_record(p, "aten::no_such_op_anywhere", "default",
                                                            "aten::no_such_op_anywhere(Tensor self) -> Tensor"))
    assert cli.main(["--quiet", "verify", "--checksums", str(path)]) == 0
    assert "file OK (program and " in capsys.readouterr().out
    assert cli.main(["--quiet", "verify", str(path)]) == 2
    err = capsys.readouterr().err
    assert "MissingOperatorError" in err and "aten::no_such_op_anywhere" in err, err


def test_every_method_is_walked(tmp_path):
    """A multi-method file: each method's graph table is walked; a damaged one is named."""
    from tools.corpus.methods import TinyKV
    from tests.format.test_methods import methods_of

    path = tmp_path / "two.pt2b"
    export_model(methods_of(TinyKV().eval()), path)
    done = verify_without_torch(path)
    assert done.returncode == 0 and "file OK (2 methods and " in done.stdout, done.stderr[-2000:]
    damaged = damage_graph_table(tmp_path, path, method="decode")
    done = verify_without_torch(damaged)
    assert done.returncode == 2
    assert "Program.methods[0].exported_program (ExportedProgram) vtable at byte" in done.stderr


@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    path = _artifact(tmp_path_factory.mktemp("pristine"))
    art = reader.open_artifact(path)
    header = art.header
    art.mm.close()
    return path.read_bytes(), header


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                   HealthCheck.too_slow])
@given(data=st.data())
def test_a_crafted_program_section_is_refused_by_type_or_passes(pristine, tmp_path_factory, data):
    """A program section changed and its checksums made to match again (what a crafted file does): the
    checks without torch refuse it with a typed error or pass it, never fail otherwise; a weight byte
    changed is always refused."""
    raw, header = pristine
    buf = bytearray(raw)
    lo, hi = header.program_offset, header.program_offset + header.program_size
    for _ in range(data.draw(st.integers(1, 8))):
        buf[data.draw(st.integers(lo, hi - 1))] = data.draw(st.integers(0, 255))
    weight_byte = data.draw(st.one_of(st.none(), st.integers(header.data_offset, header.data_offset + 200)))
    if weight_byte is not None:
        buf[weight_byte] ^= 0x80
    fixed = dataclasses.replace(header, program_crc32=zlib.crc32(bytes(buf[lo:hi])))
    buf[:HEADER_SIZE] = fixed.pack()
    path = tmp_path_factory.getbasetemp() / "crafted.pt2b"
    path.write_bytes(bytes(buf))
    try:
        integrity.verify_checksums(path)
    except Pt2bError:
        return
    assert weight_byte is None or not any(
        s.offset <= weight_byte - header.data_offset < s.offset + s.nbytes
        for s in read_segments(G.Program.GetRootAs(bytes(buf[lo:hi]), 0))), "a changed weight byte passed"


def test_segments_claiming_the_same_bytes_again_are_refused_before_hashing(tmp_path, monkeypatch):
    """A crafted table of many segments over the same bytes would make a small file cost hashing many
    times its size (2,000 segments over 0.26 MB: 0.5 GB); together they claim more than the data section
    holds, which no written file does, and both verify paths refuse it before hashing anything."""
    from exporter.layout.generated import pt2b_generated as G
    from exporter.serialize.read import segment_hashes

    torch.manual_seed(0)
    export_model(torch.nn.Linear(256, 256), (torch.randn(2, 256),), tmp_path / "m.pt2b")
    art = reader.open_artifact(tmp_path / "m.pt2b")
    size = art.header.data_size
    art.mm.close()

    def overlap(_, program):
        program.segments = [G.SegmentT() for _ in range(2000)]
        for s in program.segments:
            s.offset, s.nbytes, s.checksum = 0, size, 0
        program.weightDigests = None

    path = rewrite_artifact(tmp_path / "m.pt2b", tmp_path / "overlap.pt2b", edit=overlap, keep_graph=True)
    monkeypatch.setattr(segment_hashes, "_hash", lambda *a: pytest.fail("a segment was hashed"))
    want = rf"the weight segments claim {2000 * size} bytes in all, more than the data section's {size}"
    with pytest.raises(CorruptArtifactError, match=want):
        integrity.verify_checksums(path, segment_hashes.Early(path))
    with pytest.raises(CorruptArtifactError, match=want):
        reader.verify_weights(reader.open_artifact(path), segment_hashes.Early(path))
    monkeypatch.setenv("PT2B_CACHE_DIR", str(tmp_path / "cache"))
    with pytest.raises(CorruptArtifactError, match=want):  # the lowering cache reads every segment for its key
        load_for_backend(path, "core", cache=True)
