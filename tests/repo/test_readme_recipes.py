"""README.md's recipes run as written: its Python blocks in order in one fresh folder (the first writes
the file the next read), then the commands of "Keep old files working" on the file they made."""

import pathlib
import re
import shlex

import torch

from exporter.cli import main as cli

ROOT = pathlib.Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()


def _blocks(lang: str) -> list[str]:
    return re.findall(r"^```" + lang + r"\n(.*?)^```", README, re.M | re.S)


def test_the_python_recipes_run(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    scope: dict = {}
    for block in _blocks("python"):
        exec(compile(block, "README.md", "exec"), scope)  # the README's own code, as a user pastes it
    out = capsys.readouterr().out
    assert "validation passed" in out
    assert "'aten::addmm.default': 2" in out, out  # the backend list reaches every op: no OpsetError
    assert set(scope["lowered"].ops()) <= {op + ".default" for op in scope["mine"]} | {
        op + ".Tensor" for op in scope["mine"]}
    y = torch.randn(5, 16)
    torch.testing.assert_close(scope["lowered"](y), scope["model"](y), rtol=1e-5, atol=1e-5)


def test_the_commands_that_keep_old_files_working_run(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    block = next(b for b in _blocks("bash") if "pt2b upgrade old.pt2b" in b)
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU())
    from exporter import export_model, load

    export_model(model, (torch.randn(2, 4),), "old.pt2b")
    for line in block.splitlines():
        argv = shlex.split(line.split(" #")[0])
        assert argv[0] == "pt2b"
        assert cli(["--quiet", *argv[1:]]) == 0, line
    x = torch.randn(2, 4)
    assert torch.equal(load("new.pt2b")(x), model(x))
    assert "aten::linear" in capsys.readouterr().out  # inspect listed the ops
