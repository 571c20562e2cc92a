"""The command line against hostile files: `pt2b convert` unpickles nothing unless trusted, `pt2b
upgrade` never rewrites a file of a newer format, and nothing from a file reaches the terminal as a
control sequence."""

import io
import json
import os
import pathlib
import pickle
import re
import subprocess
import sys
import zipfile
import zlib

import flatbuffers
import pytest
import torch

from exporter import cli, export_model, load
from exporter.cli import pt2_program, terminal
from exporter.cli.convert import convert
from exporter.cli.pt2_pickles import _globals
from tools.corpus.zoo import make_case
from exporter.errors import CorruptArtifactError, PickledContentError, SchemaDriftError, UnsupportedVersionError
from exporter.serialize import reader
from exporter.layout.generated import pt2b_generated as G
from exporter.layout.container import FILE_IDENTIFIER, Header, align
from exporter.util import nesting
from exporter.versioning.formats import FORMAT_MAJOR, FORMAT_VERSION
from tests.support.artifact_surgery import rewrite_artifact, set_op_record
from tests.support.cli_run import run_cli




class Mlp(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(3, 2)
        self.register_buffer("shift", torch.ones(2))

    def forward(self, x):
        return self.fc(x) + self.shift


def _model():
    torch.manual_seed(0)
    return Mlp().eval(), (torch.randn(4, 3),)


# ---------------------------------------------------------------- convert: no unpickling unless trusted


class Touch:
    """Unpickled, it creates ``path``: the canary of a payload that ran."""

    def __init__(self, path):
        self.path = str(path)

    def __reduce__(self):
        return pathlib.Path.touch, (pathlib.Path(self.path),)


def _rewrite_pt2(src, dst, replace: dict) -> pathlib.Path:
    """A copy of torch.export.save's archive ``src`` with the entries of ``replace`` (path under the
    root folder -> bytes, or None to leave it out) replaced, added or removed, as a crafted file would
    hold them."""
    replace = dict(replace)
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w", zipfile.ZIP_STORED) as zout:
        root = zin.namelist()[0].split("/")[0]
        for info in zin.infolist():
            rel = info.filename.split("/", 1)[1]
            data = replace.pop(rel) if rel in replace else zin.read(info)
            if data is not None:
                zout.writestr(info.filename, data)
        for rel, data in replace.items():
            zout.writestr(f"{root}/{rel}", data)
    return pathlib.Path(dst)


@pytest.fixture
def pt2(tmp_path):
    model, args = _model()
    path = tmp_path / "m.pt2"
    torch.export.save(torch.export.export(model, args), path)
    return path


def _config(pt2, name):
    with zipfile.ZipFile(pt2) as z:
        return json.loads(z.read(next(n for n in z.namelist() if n.endswith(name))))


def _weight_marked_pickled(pt2, tmp_path, canary):
    """The issue's file: a weight marked as pickled whose payload touches ``canary`` when unpickled."""
    config = _config(pt2, "model_weights_config.json")
    config["config"]["fc.weight"].update(use_pickle=True, path_name="weight_9")
    return _rewrite_pt2(pt2, tmp_path / "evil.pt2", {
        "data/weights/model_weights_config.json": json.dumps(config).encode(),
        "data/weights/weight_9": pickle.dumps(Touch(canary), protocol=2)})


def _example_inputs_with_a_payload(pt2, tmp_path, canary):
    """Example inputs (always a torch.save pickle) naming a global torch's weights-only unpickler
    refuses: torch.export.load then unpickles them without restriction."""
    buf = io.BytesIO()
    torch.save((Touch(canary),), buf)
    return _rewrite_pt2(pt2, tmp_path / "evil_inputs.pt2", {"data/sample_inputs/model.pt": buf.getvalue()})


def _example_inputs_named_in_other_case(pt2, tmp_path, canary):
    """The same, under a name torch's archive reader finds although it differs in case."""
    buf = io.BytesIO()
    torch.save((Touch(canary),), buf)
    return _rewrite_pt2(pt2, tmp_path / "evil_case.pt2", {"data/sample_inputs/model.pt": None,
                                                          "data/SAMPLE_inputs/model.pt": buf.getvalue()})


def _opaque_constant(pt2, tmp_path, canary):
    """A constant stored as an opaque object: pickle.loads, here with protocol 4 (STACK_GLOBAL)."""
    config = {"config": {"c": {"path_name": "opaque_obj_0", "is_param": False, "use_pickle": True,
                               "tensor_meta": None}}}
    return _rewrite_pt2(pt2, tmp_path / "evil_const.pt2", {
        "data/constants/model_constants_config.json": json.dumps(config).encode(),
        "data/constants/opaque_obj_0": pickle.dumps(Touch(canary), protocol=4)})


@pytest.mark.parametrize("craft, entry, holds", [
    (_weight_marked_pickled, "data/weights/weight_9", "weight 'fc.weight'"),
    (_example_inputs_with_a_payload, "data/sample_inputs/model.pt", "the example inputs of model 'model'"),
    (_example_inputs_named_in_other_case, "data/sample_inputs/model.pt", "the example inputs of model 'model'"),
    (_opaque_constant, "data/constants/opaque_obj_0", "constant 'c'"),
])
def test_convert_refuses_pickled_content_without_running_it(pt2, tmp_path, craft, entry, holds):
    canary = tmp_path / "canary"
    evil = craft(pt2, tmp_path, canary)
    dest = tmp_path / "out.pt2b"
    code, out, err = run_cli("convert", evil, dest)
    assert code == 2 and "PickledContentError" in err and f"{entry} ({holds}; imports " in err
    assert "pathlib.Path" in err and "--trust-pickle" in err
    assert not canary.exists() and not dest.exists() and out == ""
    with pytest.raises(PickledContentError, match=re.escape(entry)):
        convert(evil, dest)
    assert not canary.exists() and not dest.exists()
    # trusted, torch reads it as before: the payload runs, and the conversion then fails (typed)
    code, _, err = run_cli("convert", "--trust-pickle", evil, dest)
    assert canary.exists() and code == 2 and "pt2b: artifact error (ArtifactError)" in err and not dest.exists()
    assert "--trust-pickle: unpickling" in err


def _program_json(pt2) -> tuple[str, str]:
    """(the entry's path under the root folder, the text) of the archive's one program."""
    with zipfile.ZipFile(pt2) as z:
        name = next(n for n in z.namelist() if "/models/" in n and n.endswith(".json"))
        return name.split("/", 1)[1], z.read(name).decode()


@pytest.fixture
def dynamic_pt2(tmp_path):
    """A .pt2 of a program with symbolic sizes (its tensors' metadata holds expressions)."""
    case = make_case("dynamic_shapes")
    path = tmp_path / "dyn.pt2"
    torch.export.save(torch.export.export(case.model, case.args, kwargs=case.kwargs,
                                          dynamic_shapes=case.dynamic_shapes), path)
    return path


def _expression_payload(pt2, tmp_path, canary):
    """No pickle at all: a symbolic size's expression that calls Path.touch when sympify evaluates it."""
    rel, text = _program_json(pt2)
    first = re.search(r'"expr_str": ("Symbol\(\'s\d+\'[^"]*\)")', text)
    payload = json.dumps(f"__import__('pathlib').Path({str(canary)!r}).touch() or {json.loads(first.group(1))}")
    return _rewrite_pt2(pt2, tmp_path / "evil.pt2", {rel: text.replace(first.group(1), payload).encode()})


def _python_target(pt2, tmp_path, canary):
    """A node whose target names a Python function by path: torch's deserializer resolves it by getattr."""
    rel, text = _program_json(pt2)
    text = text.replace('"target": "torch.ops.aten.add.Tensor"', '"target": "torch.os.system"', 1)
    assert "torch.os.system" in text
    return _rewrite_pt2(pt2, tmp_path / "evil.pt2", {rel: text.encode()})


def _state_path_breaking_out(pt2, tmp_path, canary):
    """A buffer named with a quote: torch's generated code writes getattr(self, "<name>")."""
    rel, text = _program_json(pt2)
    text = text.replace('"shift"', json.dumps('shift") or __import__("os").getcwd() or ("'))
    return _rewrite_pt2(pt2, tmp_path / "evil.pt2", {rel: text.encode()})


@pytest.mark.parametrize("craft, why", [
    (_expression_payload, "symbolic expression"),
    (_python_target, "torch.os.system"),
    (_state_path_breaking_out, "breaks out of the string torch's code generation writes it into"),
])
def test_convert_checks_a_pt2s_program_before_torch_reads_it(pt2, dynamic_pt2, tmp_path, craft, why):
    """A .pt2 holding no pickle can still run code: torch's deserializer evaluates its expressions and
    resolves its names. convert refuses such a program before torch reads any of it."""
    canary = tmp_path / "canary"
    evil = craft(dynamic_pt2 if craft is _expression_payload else pt2, tmp_path, canary)
    dest = tmp_path / "out.pt2b"
    code, out, err = run_cli("convert", evil, dest)
    assert code == 2 and "pt2b: artifact error (CorruptArtifactError)" in err and why in err, err
    assert not canary.exists() and not dest.exists() and out == ""
    if craft is _expression_payload:  # the hole is real: torch alone runs the payload
        run_cli("convert", "--trust-pickle", evil, dest)
        assert canary.exists()


def test_every_entry_torch_reads_as_a_program_is_checked(dynamic_pt2, tmp_path):
    """torch.export.load reads every entry under models/ as a program, whatever its name ends with: a
    payload stored as models/evil.txt beside the real program is checked like the real one."""
    canary = tmp_path / "canary"
    evil = _expression_payload(dynamic_pt2, tmp_path, canary)
    _, payload = _program_json(evil)
    hidden = _rewrite_pt2(dynamic_pt2, tmp_path / "hidden.pt2", {"models/evil.txt": payload.encode()})
    code, out, err = run_cli("convert", hidden, tmp_path / "out.pt2b")
    assert code == 2 and "models/evil.txt" in err and "symbolic expression" in err, err
    assert not canary.exists()


@pytest.mark.parametrize("case", ["mlp", "cond", "map", "while_loop", "dynamic_shapes", "transformer_encoder"])
def test_torchs_own_pt2_programs_pass_the_checks(tmp_path, case):
    """What torch.export.save writes passes pt2b's program checks, its JSON nested far within the cap."""
    c = make_case(case)
    path = tmp_path / "m.pt2"
    torch.export.save(torch.export.export(c.model, c.args, kwargs=c.kwargs, dynamic_shapes=c.dynamic_shapes), path)
    with open(path, "rb") as f:
        pt2_program.check_programs(f, path)
    assert nesting.bracket_depth(_program_json(path)[1], '"') * 4 < pt2_program.MAX_PROGRAM_DEPTH
    assert convert(path, tmp_path / "m.pt2b") == "pt2->pt2b"


def test_convert_of_an_ordinary_pt2_needs_no_trust(pt2, tmp_path):
    """torch.export.save's own archive (raw weights, example inputs of tensors) converts by default."""
    code, out, err = run_cli("convert", pt2, tmp_path / "m.pt2b")
    assert code == 0 and "pt2->pt2b" in out, err
    x = torch.randn(4, 3)
    assert torch.equal(load(tmp_path / "m.pt2b")(x), torch.export.load(pt2).module()(x))


def test_the_trust_flag_is_in_help_and_in_inspects_hint(pt2, capsys):
    with pytest.raises(SystemExit):
        cli.main(["convert", "--help"])
    assert "--trust-pickle" in capsys.readouterr().out
    code, _, err = run_cli("inspect", pt2)
    assert code == 2 and "pt2b convert" in err and "--trust-pickle" in err and "pickled" in err


@pytest.mark.parametrize("protocol", range(pickle.HIGHEST_PROTOCOL + 1))
def test_the_opcode_scan_names_every_global_without_unpickling(protocol, tmp_path):
    canary = tmp_path / "canary"
    data = pickle.dumps([Touch(canary), os.system, Touch(canary)], protocol=protocol)
    found = _globals(data)
    assert any(g.startswith("pathlib.Path") for g in found) and f"{os.system.__module__}.system" in found, found
    assert not canary.exists()


def test_a_global_the_scan_cannot_follow_is_named_as_such():
    # STACK_GLOBAL fed by a list's item, not by two strings
    data = b"\x80\x04(\x8c\x02osX\x06\x00\x00\x00systemt\x93."
    assert _globals(data) == ["(a global named at load time)"]


# ---------------------------------------------------------------- upgrade: never a newer file


def _newer_minor(src, dst):
    """``src`` as a later pt2b would write it: one more minor in the preamble and header, and one
    Program field this pt2b does not know (after the last it knows), checksums repaired."""
    art = reader.open_artifact(src)
    prog = art.program
    h = art.header
    data = bytes(art.mm[: h.data_offset + h.data_size])
    art.mm.close()
    start, end = G.ProgramStart, G.ProgramEnd
    known = len([n for n in dir(G) if n.startswith("ProgramAdd")])

    def start_with_more(builder):
        note = builder.CreateString("a field of a later minor")
        builder.StartObject(known + 1)
        builder.PrependUOffsetTRelativeSlot(known, note, 0)

    G.ProgramStart = start_with_more
    try:
        builder = flatbuffers.Builder(1 << 16)
        builder.Finish(prog.Pack(builder), file_identifier=FILE_IDENTIFIER)
    finally:
        G.ProgramStart, G.ProgramEnd = start, end
    program = bytes(builder.Output())
    offset = align(len(data), 8)
    header = Header(h.major, h.minor + 1, h.data_offset, h.data_size, offset, len(program), zlib.crc32(program))
    blob = bytearray(data + b"\0" * (offset - len(data)) + program)
    blob[:64] = header.pack()
    pathlib.Path(dst).write_bytes(bytes(blob))
    return pathlib.Path(dst)


@pytest.fixture
def newer(tmp_path):
    model, args = _model()
    export_model(model, args, tmp_path / "m.pt2b")
    path = _newer_minor(tmp_path / "m.pt2b", tmp_path / "newer.pt2b")
    assert load(path).format_version == (FORMAT_MAJOR, FORMAT_VERSION[1] + 1)  # readable: it is the same major
    return path


def test_upgrade_leaves_a_newer_minor_untouched(newer, tmp_path):
    before = newer.read_bytes()
    have = f"{FORMAT_MAJOR}.{FORMAT_VERSION[1] + 1}"
    for dest in ((), (tmp_path / "new.pt2b",)):
        code, out, err = run_cli("upgrade", newer, *dest)
        assert code == 2 and "UnsupportedVersionError" in err and f"format {have} is newer than this pt2b's" in err
        assert "Left untouched" in err and "upgraded" not in out
        assert newer.read_bytes() == before and not (tmp_path / "new.pt2b").exists()
    code, out, err = run_cli("upgrade", "--check", newer)
    assert code == 2 and "newer than this pt2b's" in err
    from exporter.cli.upgrade import upgrade_file

    with pytest.raises(UnsupportedVersionError, match=f"format {re.escape(have)} is newer"):
        upgrade_file(newer, to=(1, 0))
    assert newer.read_bytes() == before


def test_upgrade_of_a_folder_reports_the_newer_file_and_fails(newer, tmp_path):
    before = newer.read_bytes()
    (tmp_path / "m.pt2b").unlink()
    code, out, _ = run_cli("upgrade", tmp_path)
    assert code == 1 and "FAILED: UnsupportedVersionError" in out and "1 failed" in out
    assert newer.read_bytes() == before


def test_upgrade_leaves_a_newer_major_untouched(tmp_path):
    model, args = _model()
    path = tmp_path / "m.pt2b"
    export_model(model, args, path)
    data = bytearray(path.read_bytes())
    data[4:6] = (FORMAT_MAJOR + 1).to_bytes(2, "little")  # the preamble's major, then the header's checksum
    data[52:56] = zlib.crc32(bytes(data[:52])).to_bytes(4, "little")
    path.write_bytes(bytes(data))
    before = path.read_bytes()
    code, out, err = run_cli("upgrade", path)
    assert code == 2 and "UnsupportedVersionError" in err and path.read_bytes() == before


# ---------------------------------------------------------------- nothing reaches the terminal raw

# OSC 52 (writes the clipboard), OSC 0 (retitles the window), CSI 2K (erases the line), an 8-bit CSI,
# a carriage return, and a right-to-left override
PAYLOAD = "\x1b]52;c;cHduZWQ=\x07\x1b]0;owned\x07\r\x1b[2K\x9b2K\u202e"
# what the op table's schema checks let through to a schema drift message: bidirectional controls
SCHEMA_PAYLOAD = "\u202e\u2066\u200f"
_ACTIVE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")


def _hostile(tmp_path):
    """An artifact whose producer, Dim names and metadata hold PAYLOAD, and its recorded op schema
    SCHEMA_PAYLOAD."""
    torch.manual_seed(0)
    model, args = _model()
    path = tmp_path / "m.pt2b"
    export_model(model, (torch.randn(4, 3),), path, metadata={"note": PAYLOAD, PAYLOAD: 1},
                 dynamic_shapes={"x": {0: torch.export.Dim("batch", max=64)}})
    dims = {k: v for k, v in load(path).provenance.items() if k.startswith("dim:")}
    assert dims

    def edit(_, prog):
        prog.producer = "pt2b " + PAYLOAD
        rec = next(r for r in prog.operators if reader.text(r.qualifiedName) == "aten::linear")
        schema = reader.text(rec.schema)
        set_op_record(prog, "aten::linear", reader.text(rec.overload),
                      schema.replace("Tensor input", "Tensor input" + SCHEMA_PAYLOAD, 1))

    return rewrite_artifact(path, tmp_path / "hostile.pt2b", edit=edit,
                            provenance={k: v + PAYLOAD for k, v in dims.items()})


def _shown(text):
    """No character a terminal acts on, and the payload visible as escapes."""
    assert not _ACTIVE.search(text), repr(text)
    return text


def test_escape_shows_every_control_character():
    assert terminal.escape(PAYLOAD) == r"\x1b]52;c;cHduZWQ=\x07\x1b]0;owned\x07\x0d\x1b[2K\x9b2K\u202e"
    assert terminal.escape("a\tb\nc", layout=True) == "a\tb\nc" and terminal.escape("a\tb\nc") == r"a\x09b\x0ac"
    assert terminal.escape("façade ünïcode 名前") == "façade ünïcode 名前"
    assert all(not _ACTIVE.search(terminal.escape(chr(c))) for c in range(0x3000))


def test_inspect_shows_the_files_strings_escaped(tmp_path):
    path = _hostile(tmp_path)
    code, out, err = run_cli("inspect", path)
    assert code == 0, err
    _shown(out)
    assert r"producer:        pt2b \x1b]52;c;cHduZWQ=\x07" in out
    assert r"(batch\x1b]52;c;cHduZWQ=\x07\x1b]0;owned\x07\x0d\x1b[2K\x9b2K\u202e): [" in out  # the Dim name
    assert r"Tensor input\u202e\u2066\u200f, Tensor weight" in out  # the recorded schema


def test_error_lines_show_the_files_strings_escaped(tmp_path):
    path = _hostile(tmp_path)
    code, out, err = run_cli("verify", path)
    assert code == 2 and "pt2b: artifact error (SchemaDriftError)" in err
    assert r"recorded: aten::linear(Tensor input\u202e\u2066\u200f, Tensor weight" in err
    _shown(out + err)


def test_error_messages_raised_to_python_show_the_files_strings_escaped(tmp_path):
    """A traceback prints an error's message to a terminal without the command line's streams: pt2b's
    errors escape their messages themselves (newlines and tabs kept)."""
    path = _hostile(tmp_path)
    with pytest.raises(SchemaDriftError) as info:
        load(path)
    assert r"recorded: aten::linear(Tensor input\u202e\u2066\u200f, Tensor weight" in str(info.value)
    e = CorruptArtifactError("m.pt2b: producer " + PAYLOAD + "\n\tnext line")
    assert str(e) == "m.pt2b: producer " + terminal.escape(PAYLOAD) + "\n\tnext line" and "\x1b" not in str(e)
    _shown(str(info.value) + str(e))


def test_run_input_errors_show_the_dim_names_escaped(tmp_path):
    import numpy as np

    model, args = _model()
    path = tmp_path / "m.pt2b"
    export_model(model, args, path, dynamic_shapes={"x": {0: torch.export.Dim("batch", max=64)}})
    dims = {k: v + PAYLOAD for k, v in load(path).provenance.items() if k.startswith("dim:")}
    hostile = rewrite_artifact(path, tmp_path / "hostile.pt2b", provenance=dims)
    np.save(tmp_path / "big.npy", np.ones((100, 3), dtype=np.float32))  # beyond the Dim's maximum
    code, out, err = run_cli("run", hostile, "--no-cache", "--no-validate", "--inputs", tmp_path / "big.npy")
    assert code == 2 and "batch" in err and r"\x1b]52" in err, err
    _shown(out + err)


def test_the_console_writes_no_control_byte(tmp_path):
    """The bytes the `pt2b` process writes, not only the text the streams were handed."""
    path = _hostile(tmp_path)
    res = subprocess.run([sys.executable, "-m", "exporter", "inspect", str(path)], capture_output=True, timeout=300)
    assert res.returncode == 0, res.stderr
    assert not re.search(rb"[\x00-\x08\x0b-\x1f\x7f]", res.stdout + res.stderr)
    text = (res.stdout + res.stderr).decode()
    _shown(text)
    assert r"\x1b]52;c;cHduZWQ=" in text
