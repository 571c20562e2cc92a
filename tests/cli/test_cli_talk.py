"""Tools that talk: progress bars on a terminal and none when piped or under --quiet, `pt2b --version`,
`python -m exporter`, and no torch warnings about torch's own internals in pt2b's output.

Each test runs the real command in a subprocess (the console script and `python -m exporter`), its
stderr a pseudo-terminal (pty) or a pipe."""

from __future__ import annotations

import fcntl
import io
import os
import pathlib
import pty
import select
import shutil
import struct
import subprocess
import sys
import termios
import time

import pytest
import torch

import exporter
from exporter.versioning.formats import FORMAT_VERSION, version_str

GOLDEN = pathlib.Path(__file__).parents[1] / "golden"
BIN = pathlib.Path(sys.executable).parent
PT2B = [str(BIN / "pt2b")] if (BIN / "pt2b").exists() else [sys.executable, "-m", "exporter"]
TIMEOUT = 240
BAR = "%|"  # tqdm's bar: "checking:  33%|███▎      | 1/3 [...]"


def _env(**extra) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("PT2B_QUIET", "PYTHONWARNINGS", "TQDM_DISABLE")}
    env.update(PT2B_CACHE="0", COLUMNS="120", LINES="24", **extra)
    return env


def run(argv, *, tty: bool, tmp_path, **env) -> tuple[int, str, str]:
    """(exit code, stdout, stderr) of ``argv``; stderr a pty (120 columns) when ``tty``, else a pipe."""
    out_path = tmp_path / f"stdout-{os.getpid()}-{len(list(tmp_path.iterdir()))}.txt"
    with open(out_path, "wb") as out:
        if not tty:
            p = subprocess.run(argv, stdout=out, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
                               env=_env(**env), cwd=tmp_path, timeout=TIMEOUT)
            return p.returncode, out_path.read_text(), p.stderr.decode()
        master, slave = pty.openpty()
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 120, 0, 0))
        try:
            proc = subprocess.Popen(argv, stdout=out, stderr=slave, stdin=subprocess.DEVNULL,
                                    env=_env(**env), cwd=tmp_path)
        finally:
            os.close(slave)
        chunks = []
        try:
            while True:
                ready, _, _ = select.select([master], [], [], TIMEOUT)
                if not ready:
                    proc.kill()
                    raise AssertionError(f"{argv} wrote nothing for {TIMEOUT} s")
                try:
                    data = os.read(master, 65536)
                except OSError:  # EIO: the child closed its end
                    break
                if not data:
                    break
                chunks.append(data)
        finally:
            os.close(master)
        code = proc.wait(timeout=TIMEOUT)
    return code, out_path.read_text(), b"".join(chunks).decode(errors="replace")


@pytest.fixture
def folder(tmp_path):
    """Three artifacts of format 1.0: `pt2b upgrade --check` reads each (under a second in all)."""
    d = tmp_path / "models"
    d.mkdir()
    for name in ("mlp", "cnn_bn", "kwargs_only"):
        shutil.copy(GOLDEN / "1.0" / f"{name}.pt2b", d / f"{name}.pt2b")
    return d


def _checked_all_three(code, out):
    assert code == 0, out
    assert "3 artifact(s): 0 written, 3 to change, 0 failed" in out


def test_progress_on_a_terminal(folder, tmp_path):
    code, out, err = run([*PT2B, "upgrade", "--check", str(folder)], tty=True, tmp_path=tmp_path)
    _checked_all_three(code, out)
    assert "checking:" in err and BAR in err and "3/3" in err and "file/s" in err, err
    assert "mlp.pt2b" in err  # the file being worked on is named beside the bar
    assert BAR not in out and "\r" not in out  # stdout stays machine-readable


def test_no_progress_when_piped(folder, tmp_path):
    code, out, err = run([*PT2B, "upgrade", "--check", str(folder)], tty=False, tmp_path=tmp_path)
    _checked_all_three(code, out)
    assert err == "", err
    assert BAR not in out and "\r" not in out


def test_quiet_on_a_terminal(folder, tmp_path):
    code, out, err = run([*PT2B, "--quiet", "upgrade", "--check", str(folder)], tty=True, tmp_path=tmp_path)
    _checked_all_three(code, out)
    assert BAR not in err and "checking" not in err and err.strip() == "", err


class FakeTerminal(io.StringIO):
    def isatty(self):
        return True


def test_when_bars_are_drawn(monkeypatch):
    from exporter.cli import progress

    monkeypatch.delenv("PT2B_QUIET", raising=False)
    monkeypatch.setattr(sys, "stderr", FakeTerminal())
    progress.set_quiet(None)
    assert progress.enabled()
    monkeypatch.setenv("PT2B_QUIET", "1")
    assert not progress.enabled()
    monkeypatch.setenv("PT2B_QUIET", "0")
    assert progress.enabled()
    try:
        progress.set_quiet(True)  # what `pt2b --quiet` does
        assert not progress.enabled()
    finally:
        progress.set_quiet(None)
    monkeypatch.setattr(sys, "stderr", io.StringIO())  # not a terminal
    assert not progress.enabled()


def test_one_long_step_shows_a_clock(monkeypatch):
    """Commands made of one long step (verify, lower, run, export, convert) show what runs and for
    how long, the clock ticking; the line is erased when the step ends."""
    from exporter.cli import progress

    monkeypatch.delenv("PT2B_QUIET", raising=False)
    monkeypatch.setenv("COLUMNS", "120")
    err = FakeTerminal()
    monkeypatch.setattr(sys, "stderr", err)
    with progress.status("verifying m.pt2b"):
        time.sleep(1.2)
    shown = err.getvalue()
    assert shown.count("verifying m.pt2b [00:0") >= 2, shown  # drawn, then redrawn by the clock
    assert shown.endswith("\r"), shown  # erased
    assert list(progress.track([1, 2], "x", label=str)) == [1, 2]


def test_version(capsys):
    from exporter import cli

    assert cli.main(["--version"]) == 0
    from importlib import metadata

    torch_req = next(r for r in metadata.requires("pt2b") if r.startswith("torch") and not r[5:6].isalnum())
    range_ = torch_req[len("torch"):].split(";")[0].strip()
    assert range_ and "2.11" in range_, torch_req  # pyproject.toml's dependency, as installed
    assert capsys.readouterr().out.split("\n") == [
        f"pt2b {exporter.__version__}", f"format {version_str(FORMAT_VERSION)}",
        f"torch {torch.__version__} (pt2b supports torch {range_})", ""]


def test_python_m_exporter_is_pt2b(tmp_path, monkeypatch, capsys):
    from exporter import cli

    code, out_m, _ = run([sys.executable, "-m", "exporter", "--help"], tty=False, tmp_path=tmp_path)
    assert code == 0
    monkeypatch.setenv("COLUMNS", "120")  # as run() gives the subprocess: argparse wraps to it
    with pytest.raises(SystemExit) as e:
        cli.main(["--help"])
    assert e.value.code == 0
    out_p = capsys.readouterr().out
    assert out_m == out_p and out_m.startswith("usage: pt2b") and "--version" in out_m and "--quiet" in out_m


def test_demo_shows_no_torch_warnings(tmp_path):
    """The demo lowers with the core preset (cache off: the lowering runs), where torch.export's own
    module-call-graph update used to print a FutureWarning about LeafSpec."""
    code, out, err = run([*PT2B, "demo", "-o", str(tmp_path / "demo.pt2b")], tty=False, tmp_path=tmp_path)
    assert code == 0, err
    assert "load_for_backend(preset='core')" in out
    assert "FutureWarning" not in out + err and "Warning:" not in err, err


def test_filters_are_scoped_to_pt2b_entry_points():
    """The Python API shows the warnings as usual: only the CLI and the demo filter them."""
    import warnings

    from exporter.cli import progress

    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        with progress.torch_internals_quiet():
            warnings.warn("`isinstance(treespec, LeafSpec)` is deprecated, use ...", FutureWarning)
            warnings.warn("your model does something odd", FutureWarning)
        warnings.warn("`isinstance(treespec, LeafSpec)` is deprecated, use ...", FutureWarning)
    assert [str(w.message)[:14] for w in seen] == ["your model doe", "`isinstance(tr"]


def test_the_console_ends_the_process_at_once_once_the_command_returns(tmp_path):
    """`pt2b` (exporter.cli.console) flushes what the command printed and exits with its status without
    Python's shutdown (atexit handlers, module teardown: 0.4-0.7 s of `pt2b verify` after torch); a
    command's error status is kept; a thread the command left running is waited for as Python would."""
    path = tmp_path / "m.pt2b"
    exporter.export_model(torch.nn.Linear(3, 2), (torch.randn(1, 3),), path)
    code = ("import atexit, sys, threading, time\nimport exporter.cli as cli\n"
            "atexit.register(lambda: print('python shut down', flush=True))\n"
            "command = cli.main\n"
            "def main(argv):  # the command, then (with 'thread') a thread of its own still running\n"
            "    rc = command(argv)\n"
            "    if sys.argv[1] == 'thread':\n"
            "        threading.Thread(target=lambda: (time.sleep(0.3), print('thread done', flush=True))).start()\n"
            "    return rc\n"
            "cli.main = main\n"
            "cli.console(sys.argv[2:])\n")
    argv = [sys.executable, "-c", code]
    rc, out, err = run(argv + ["none", "--quiet", "verify", str(path)], tty=False, tmp_path=tmp_path)
    assert rc == 0 and out.startswith(f"{path}: OK") and "python shut down" not in out, (rc, out, err)
    rc, out, err = run(argv + ["none", "verify", str(tmp_path / "absent.pt2b")], tty=False, tmp_path=tmp_path)
    assert rc == 2 and "no such file" in err and "python shut down" not in out, (rc, out, err)
    rc, out, err = run(argv + ["thread", "--quiet", "verify", str(path)], tty=False, tmp_path=tmp_path)
    assert rc == 0 and out.splitlines()[1:] == ["thread done", "python shut down"], (rc, out, err)


# ---- commands as users expect them ----

def test_a_reader_gone_ends_the_command_quietly(tmp_path):
    """`pt2b inspect m.pt2b | head`: the reader closes the pipe; the command ends as SIGPIPE would end
    it (status 141), without a traceback."""
    path = tmp_path / "m.pt2b"
    exporter.export_model(torch.nn.Linear(3, 2), (torch.randn(2, 3),), path)
    proc = subprocess.Popen([*PT2B, "inspect", str(path)], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.stdout.close()  # before it writes anything: every write meets a closed pipe
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 141 and b"Traceback" not in err and b"BrokenPipe" not in err, err


def test_a_misspelt_preset_or_backend_is_answered_before_torch_is_imported(tmp_path):
    script = ("import sys; from exporter.cli import main\n"
              "print(main(['lower', 'm.pt2b', '--preset', 'corr']), main(['run', 'm.pt2b', '--backend', 'onxx']), "
              "'torch' in sys.modules)")
    res = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert res.stdout.split() == ["2", "2", "False"], res
    assert "pt2b: error (LoweringError): unknown preset 'corr'; Did you mean 'core'?" in res.stderr
    assert "pt2b: error (BackendUnavailableError): unknown backend 'onxx'; Did you mean 'onnx'?" in res.stderr


def test_the_python_api_suggests_the_closest_preset(tmp_path):
    from exporter.errors import LoweringError

    path = tmp_path / "m.pt2b"
    exporter.export_model(torch.nn.Linear(3, 2), (torch.randn(2, 3),), path)
    with pytest.raises(LoweringError, match="unknown preset 'max-tag'; Did you mean 'max'"):
        exporter.load_for_backend(path, "max-tag", cache=False)


def test_export_finds_a_factory_in_the_current_folder_after_installed_packages(tmp_path):
    """`pt2b export mymodels:make` as `python -m` would find it, while a file of the current folder named
    like a module the factory imports from Python itself (sched.py) shadows nothing."""
    (tmp_path / "mymodels.py").write_text(
        "import sched, torch\ndef make():\n    return torch.nn.Linear(3, 2), (torch.randn(2, 3),)\n")
    (tmp_path / "sched.py").write_text("raise SystemExit('the current folder shadowed an installed module')\n")
    res = subprocess.run([*PT2B, "export", "mymodels:make", "m.pt2b"], capture_output=True, text=True,
                         timeout=300, cwd=tmp_path)
    assert res.returncode == 0 and (tmp_path / "m.pt2b").exists(), res.stderr
    res = subprocess.run([*PT2B, "export", "nomodels:make", "n.pt2b"], capture_output=True, text=True,
                         timeout=300, cwd=tmp_path)
    assert res.returncode == 2 and "cannot import 'nomodels' (searched the installed packages and the current " \
                                   "folder)" in res.stderr, res.stderr


@pytest.mark.parametrize("argv, offered", [
    (["inpsect", "m.pt2b"], "invalid choice: 'inpsect' (choose from 'export', 'inspect', "),
    (["opset", "clousre"], "invalid choice: 'clousre' (choose from 'show', 'diff', "),
])
def test_a_misspelt_command_offers_the_closest(capsys, argv, offered):
    from exporter.cli import main

    with pytest.raises(SystemExit) as info:
        main(argv)
    err = capsys.readouterr().err
    want = {"inpsect": "inspect", "clousre": "closure"}[argv[-1] if argv[0] == "opset" else argv[0]]
    assert info.value.code == 2 and offered in err and err.rstrip().endswith(f"Did you mean {want!r}?"), err
