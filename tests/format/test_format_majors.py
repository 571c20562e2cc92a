"""Older format majors are upgraded in memory on load, written back by `pt2b upgrade`, and written
down to when a program fits (exporter/versioning/majors.py).

Only major 1 has been released, so these tests prove the mechanism with a simulated earlier major,
"0.9", that differs from 1.x everywhere a major may: the fixed header orders its section fields
differently (program before data), the program section carries another FlatBuffers file
identifier, and weight-segment checksums are stored bit-inverted. The real golden corpus is
converted to 0.9 by this file's own converter (not pt2b's writer), then read by pt2b through the
registered step: every golden must load with verified weights, lower and run to its stored outputs.
"""

import copy
import dataclasses
import pathlib
import struct
import zlib

import pytest
import torch

import tools.corpus.zoo  # noqa: F401  registers the custom op some goldens call
from exporter import export_model, load, load_for_backend
from exporter.errors import ExportError, UnsupportedVersionError
from exporter.layout import container
from exporter.layout.generated import pt2b_generated as G
from exporter.versioning import formats, majors
from tests.support.golden_io import load_io
from tests.support.helpers import assert_close_to_eager
from runtime_ref import Runtime
from tests.cli.test_cli_convert import run_cli

GOLDEN = pathlib.Path(__file__).parents[1] / "golden"
SOURCES = sorted(p for p in (GOLDEN / "1.0").glob("*.pt2b")) + sorted(
    p for p in (GOLDEN / "1.1").glob("*.pt2b") if ".lowered-" not in p.name)
LOWERED = sorted((GOLDEN / "1.1").glob("*.lowered-*.pt2b"))

OLD = (0, 9)
OLD_IDENTIFIER = b"P2B0"
# 0.9's header: as 1.x's, but the program section's offset and size come before the data section's.
HEADER_0 = struct.Struct("<4sHHIIQQQQIIQ")


@dataclasses.dataclass(frozen=True)
class Header0(container.Header):
    def pack(self) -> bytes:
        head = HEADER_0.pack(container.MAGIC, self.major, self.minor, self.header_size, self.flags,
                             self.program_offset, self.program_size, self.data_offset, self.data_size,
                             self.program_crc32, 0, self.alignment)
        return head[:52] + struct.pack("<I", zlib.crc32(head[:52])) + head[56:]


def read_header_0(buf, where, file_size):
    (_, major, minor, hsize, flags, p_off, p_size, d_off, d_size, p_crc, h_crc, alignment) = HEADER_0.unpack_from(buf)
    if zlib.crc32(bytes(buf[:52])) != h_crc:
        raise AssertionError("0.9 header checksum")
    return container.Header(major, minor, d_off, d_size, p_off, p_size, p_crc, alignment, hsize, flags)


def _repack(prog, identifier: bytes) -> bytes:
    import flatbuffers

    b = flatbuffers.Builder(1 << 16)
    b.Finish(prog.Pack(b), file_identifier=identifier)
    return bytes(b.Output())


def _invert_checksums(prog):
    for s in prog.segments or []:
        s.checksum = ~int(s.checksum) & 0xFFFFFFFF


def up_0(raw, where):
    assert raw.program[4:8] == OLD_IDENTIFIER, "a 0.9 program section"
    prog = G.ProgramT.InitFromPackedBuf(raw.program, 0)
    _invert_checksums(prog)
    return majors.RawProgram((1, 0), raw.header, _repack(prog, container.FILE_IDENTIFIER))


def down_0(raw, target, where):
    prog = G.ProgramT.InitFromPackedBuf(raw.program, 0)
    if prog.lowering is not None:
        raise ExportError(f"format {formats.version_str(target)} cannot hold this program: Program.lowering")
    _invert_checksums(prog)
    program = _repack(prog, OLD_IDENTIFIER)
    h = raw.header
    header = Header0(*target, h.data_offset, h.data_size, h.program_offset, len(program), zlib.crc32(program),
                     h.alignment, h.header_size, h.flags)
    return majors.RawProgram(target, header, program)


STEP_0 = majors.MajorStep(0, (1, 0), "0.9 -> 1.0: header fields reordered, program identifier P2BF, "
                          "segment checksums stored plainly", up_0, down_0, read_header_0)


@pytest.fixture
def step(monkeypatch):
    monkeypatch.setitem(majors.STEPS, 0, STEP_0)
    monkeypatch.setitem(formats.KNOWN_VERSIONS, OLD, "simulated earlier major (tests/format/test_format_majors.py)")
    return STEP_0


def to_0_9(src: pathlib.Path, dst: pathlib.Path) -> None:
    """This test's own converter from a 1.x file to 0.9 (the layout the step reads)."""
    data = src.read_bytes()
    h = container.unpack_header(data[:64], str(src), len(data))
    raw = majors.RawProgram((h.major, h.minor), h, data[h.program_offset:h.program_offset + h.program_size])
    low = down_0(raw, OLD, str(src))
    weights = data[h.data_offset:h.data_offset + h.data_size]
    p_off = container.align(h.data_offset + h.data_size, 8)
    header = dataclasses.replace(low.header, program_offset=p_off)
    out = bytearray(p_off + len(low.program))
    out[h.data_offset:h.data_offset + h.data_size] = weights
    out[p_off:] = low.program
    out[:64] = header.pack()
    dst.write_bytes(bytes(out))


@pytest.fixture(scope="module")
def old_corpus(tmp_path_factory):
    folder = tmp_path_factory.mktemp("format_0_9")
    for src in SOURCES:
        to_0_9(src, folder / f"{src.parent.name}-{src.name}")
    return folder


def _expected(name: str):
    version, _, stem = name.partition("-")
    return load_io(GOLDEN / version / stem.replace(".pt2b", ".io.npz"))


def test_the_simulated_major_really_differs_from_1x(old_corpus):
    path = next(old_corpus.glob("*.pt2b"))
    data = path.read_bytes()
    assert data[:8] == b"PT2B" + struct.pack("<HH", *OLD)
    h = read_header_0(data[:64], "", len(data))
    assert data[h.program_offset + 4:h.program_offset + 8] == OLD_IDENTIFIER
    prog = G.ProgramT.InitFromPackedBuf(data[h.program_offset:h.program_offset + h.program_size], 0)
    seg = prog.segments[0]
    start = h.data_offset + seg.offset
    assert seg.checksum == ~zlib.crc32(data[start:start + seg.nbytes]) & 0xFFFFFFFF


def test_older_major_without_an_upgrader_is_refused(old_corpus):
    path = next(old_corpus.glob("*.pt2b"))
    cur = formats.version_str(formats.FORMAT_VERSION)
    with pytest.raises(UnsupportedVersionError, match=rf"format 0\.9 is older than this pt2b reads \({cur}\) "
                       r"and no upgrader exists from major 0; read it with an older pt2b and re-export it"):
        load(path)


@pytest.mark.parametrize("src", SOURCES, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_golden_corpus_in_the_older_major_loads_and_runs(src, old_corpus, step):
    path = old_corpus / f"{src.parent.name}-{src.name}"
    (args, kwargs), expected = _expected(path.name)
    prog = load(path, verify=True)  # verify: the inverted checksums were upgraded, or this fails
    assert prog.format_version == OLD
    assert prog.provenance["upgraded_format"] == f"format 0.9 -> 1.0 in memory: {STEP_0.what}"
    assert prog.metadata["golden"] == src.stem and prog.ops() == load(src).ops()
    assert_close_to_eager(prog(*copy.deepcopy(args), **copy.deepcopy(kwargs)), expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", ["mlp", "cond", "dynamic_shapes"])
def test_older_major_lowers_with_every_preset(name, old_corpus, step):
    path = old_corpus / f"1.1-{name}.pt2b"
    (args, kwargs), expected = _expected(path.name)
    for preset in ("none", "core", "max"):
        lowered = load_for_backend(path, preset, cache=False)
        out = Runtime(lowered)(*copy.deepcopy(args), **copy.deepcopy(kwargs))
        assert_close_to_eager(out, expected, rtol=1e-4, atol=1e-4)


def test_pt2b_upgrade_rewrites_a_folder_of_the_older_major(old_corpus, step, tmp_path, monkeypatch):
    import shutil

    folder = tmp_path / "old"
    shutil.copytree(old_corpus, folder)
    code, out, err = run_cli("upgrade", str(folder))
    cur = formats.version_str(formats.FORMAT_VERSION)
    assert code == 0, err
    assert out.count(f"upgraded (0.9 -> {cur})") == len(SOURCES) and "format 0.9 -> 1.0 in memory" in out
    monkeypatch.delitem(majors.STEPS, 0)  # the written files are plain current-major artifacts
    for path in sorted(folder.glob("*.pt2b")):
        (args, kwargs), expected = _expected(path.name)
        new = load(path, verify=True)
        assert new.format_version == formats.FORMAT_VERSION and "upgraded_format" not in new.provenance
        assert "format 0.9 -> 1.0 in memory" in new.provenance[f"upgrade@{cur}"]
        assert_close_to_eager(new(*copy.deepcopy(args), **copy.deepcopy(kwargs)), expected, rtol=1e-5, atol=1e-5)


def test_writing_the_older_major_and_reading_it_back(step, tmp_path):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU())
    x = torch.randn(2, 4)
    export_model(model, (x,), tmp_path / "m.pt2b", format_version="0.9")
    data = (tmp_path / "m.pt2b").read_bytes()
    assert data[:8] == b"PT2B" + struct.pack("<HH", *OLD)
    prog = load(tmp_path / "m.pt2b", verify=True)
    assert prog.format_version == OLD and torch.equal(prog(x), model(x))
    # and `pt2b upgrade --to 0.9` writes a current file down to it
    export_model(model, (x,), tmp_path / "cur.pt2b")
    code, out, err = run_cli("upgrade", str(tmp_path / "cur.pt2b"), str(tmp_path / "down.pt2b"), "--to", "0.9")
    assert code == 0, err
    assert load(tmp_path / "down.pt2b", verify=True).format_version == OLD


def test_a_program_that_does_not_fit_the_older_major_is_refused(step, tmp_path):
    lowered = load_for_backend(GOLDEN / "1.1" / "mlp.pt2b", "core", cache=False)  # it records its lowering
    with pytest.raises(ExportError, match=r"format 0\.9 cannot hold this program: Program\.lowering"):
        export_model(lowered, None, tmp_path / "x.pt2b", format_version="0.9")
    assert not (tmp_path / "x.pt2b").exists()
    with pytest.raises(ExportError, match=r"Program\.lowering"):  # and by the step itself, for its major
        down_0(majors.RawProgram((1, 1), None, _program_of(LOWERED[0])), OLD, "")


def _program_of(path: pathlib.Path) -> bytes:
    data = path.read_bytes()
    h = container.unpack_header(data[:64], str(path), len(data))
    return data[h.program_offset:h.program_offset + h.program_size]


def test_no_writer_for_an_older_major_is_refused(step, monkeypatch, tmp_path):
    monkeypatch.setitem(majors.STEPS, 0, dataclasses.replace(STEP_0, down=None))
    with pytest.raises(ExportError, match=r"writing format 0\.9 is not supported by this pt2b"):
        export_model(torch.nn.ReLU(), (torch.ones(2),), tmp_path / "x.pt2b", format_version="0.9")
    assert not (tmp_path / "x.pt2b").exists()


def test_steps_must_lead_to_the_next_major(monkeypatch):
    monkeypatch.setattr(majors, "STEPS", {})
    with pytest.raises(ValueError, match="a step from major 0 must lead to major 1, not 2.0"):
        majors.register(dataclasses.replace(STEP_0, to_version=(2, 0)))
    majors.register(STEP_0)
    with pytest.raises(ValueError, match="a step from format major 0 is already registered"):
        majors.register(STEP_0)
