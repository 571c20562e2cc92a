"""Writes are atomic: a failure or a kill at any point of export or upgrade leaves either no
file or the previous file intact (docs/format.md "Files and concurrency", exporter/util/atomic.py).

Kills are real: a child process exports (or upgrades) a ~170 MB artifact and is SIGKILLed at
points found by polling the folder (the temp file appears, it has grown) or at a stall the child
installs just before one step (the fsync, the final rename). Failures are injected in process
at each step of a write: creating the temp file, writing (disk full mid-way, the file size
limit, Ctrl-C), fsync, rename; in place upgrades too. Stale temp files may stay behind after a
kill, but never at the destination name nor under a name that looks like an artifact.
"""

from __future__ import annotations

import errno
import hashlib
import os
import random
import resource
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from exporter import export_model, load
from exporter.errors import ExportError
from exporter.serialize.write import weights
from exporter.cli import upgrade as upgrade_tool

TESTS = Path(__file__).parent
REPO = TESTS.parents[1]
WIDTH = 1024
BIG_LAYERS = 24  # 24 x Linear(1024, 1024): 100 MB of float32 weights, a write that takes a while
BIG_BYTES = BIG_LAYERS * (WIDTH * WIDTH + WIDTH) * 4
LOOP_LAYERS = 8  # 34 MB per version in the repeated-exports loop


def build(seed: int, layers: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(*[torch.nn.Linear(WIDTH, WIDTH) for _ in range(layers)])


def example() -> torch.Tensor:
    return torch.linspace(-1, 1, 2 * WIDTH).reshape(2, WIDTH)


def expected(seed: int, layers: int) -> torch.Tensor:
    with torch.no_grad():
        return build(seed, layers)(example())


# ---------------------------------------------------------------------------------------------
# the child process


def _child(argv: list[str]) -> None:
    """In the child: ``export PATH SEED LAYERS``, ``loop PATH LAYERS SEED...`` or ``upgrade PATH``
    (through the CLI). With $PT2B_TEST_STALL=fsync|replace it stops forever just before the
    first fsync / the rename onto PATH, after writing $PT2B_TEST_MARKER, so the parent can kill it
    exactly there. With $PT2B_TEST_DIRECT=1 every data section is written with O_DIRECT
    (serialize/write/direct.py), which the folder must take."""
    what, path = argv[0], os.path.abspath(argv[1])
    if os.environ.get("PT2B_TEST_DIRECT"):
        from exporter.serialize.write import direct

        assert direct.folder_takes_direct_writes(os.path.dirname(path)), "the folder refuses O_DIRECT"
        direct.DIRECT_FROM = 0
        direct.faster_here = lambda folder: True
    stall = os.environ.get("PT2B_TEST_STALL")
    if stall:
        real = getattr(os, stall)
        marker = Path(os.environ["PT2B_TEST_MARKER"])

        def stalled(*a, **k):
            if stall == "fsync" or os.path.abspath(a[1]) == path:
                marker.write_text(stall)
                time.sleep(600)
            return real(*a, **k)

        setattr(os, stall, stalled)
    if what == "export":
        export_model(build(int(argv[2]), int(argv[3])), (example(),), path)
    elif what == "loop":
        layers, seeds = int(argv[2]), [int(s) for s in argv[3:]]
        for seed in seeds:
            export_model(build(seed, layers), (example(),), path)
            print(f"wrote {seed}", flush=True)
    elif what == "upgrade":
        from exporter.cli import main

        sys.exit(main(["upgrade", path]))
    else:
        raise SystemExit(f"unknown child command {what!r}")


def _spawn(*argv, stall: str | None = None, marker: Path | None = None, cli: bool = False,
           direct: bool = False) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PT2B_TEST_")}
    if direct:
        env["PT2B_TEST_DIRECT"] = "1"
    if stall:
        env.update(PT2B_TEST_STALL=stall, PT2B_TEST_MARKER=str(marker))
    if cli:  # the real command line, nothing patched
        cmd = [sys.executable, "-m", "exporter.cli", *argv]
    else:
        code = "import sys; import tests.format.test_atomic_kill as t; t._child(sys.argv[1:])"
        cmd = [sys.executable, "-c", code, *argv]
    return subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def _new_files(folder: Path, before: set[str]) -> dict[str, int]:
    """name -> size of the files in ``folder`` not in ``before`` (a file renamed away meanwhile is skipped)."""
    out = {}
    for name in os.listdir(folder):
        if name not in before:
            try:
                out[name] = os.stat(folder / name).st_size
            except FileNotFoundError:
                pass
    return out


def _kill_when(proc: subprocess.Popen, reached, *, timeout: float = 90.0) -> None:
    """Poll (every millisecond) until ``reached()``, then SIGKILL ``proc``, which must still be running."""
    deadline = time.monotonic() + timeout
    while not reached():
        if proc.poll() is not None:
            _, err = proc.communicate()
            pytest.fail(f"the child exited ({proc.returncode}) before the kill point:\n{err.decode()[-4000:]}")
        if time.monotonic() > deadline:
            proc.kill()
            proc.communicate()
            pytest.fail("the kill point was not reached in time")
        time.sleep(0.001)
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=60)
    assert proc.returncode == -signal.SIGKILL, "the child finished before it was killed"


def _sha(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            h.update(block)
    return h.hexdigest()


def _check_leftovers(folder: Path, artifacts: set[str]) -> list[str]:
    """Everything in ``folder`` besides ``artifacts`` is a stale hidden temp file that no
    ``*.pt2b`` glob (nor `pt2b upgrade folder/`) takes for an artifact."""
    stale = sorted(set(os.listdir(folder)) - artifacts)
    for name in stale:
        assert name.startswith(".") and name.endswith(".tmp") and not name.endswith(".pt2b"), stale
    assert sorted(p.name for p in folder.glob("*.pt2b")) == sorted(a for a in artifacts if (folder / a).exists())
    return stale


def _assert_intact(path: Path, before: bytes | None, out: torch.Tensor | None, x=None) -> None:
    """``path`` is absent (``before`` None) or byte for byte ``before``, loads with every
    checksum verified and gives exactly ``out``."""
    if before is None:
        assert not path.exists(), f"{path.name} appeared although the write did not complete"
        return
    assert path.read_bytes() == before
    assert torch.equal(load(path, verify=True)(example() if x is None else x), out)


# ---------------------------------------------------------------------------------------------
# killed exports


@pytest.fixture
def folder(tmp_path):
    f = tmp_path / "out"
    f.mkdir()
    return f


def _previous(path: Path) -> tuple[bytes, torch.Tensor]:
    """A small valid artifact at ``path``: the file an interrupted export must leave alone."""
    export_model(build(1, 1), (example(),), path)
    return path.read_bytes(), load(path)(example())


def test_export_killed_while_writing_leaves_previous_file_or_nothing(folder):
    dest, fresh = folder / "model.pt2b", folder / "fresh.pt2b"
    prev, prev_out = _previous(dest)

    # killed at once (before it even imported torch)
    proc = _spawn("export", str(dest), "5", str(BIG_LAYERS))
    proc.kill()
    proc.communicate()
    _assert_intact(dest, prev, prev_out)

    # killed as soon as the temp file exists (no previous file: nothing may appear)
    before = set(os.listdir(folder))
    proc = _spawn("export", str(fresh), "5", str(BIG_LAYERS))
    _kill_when(proc, lambda: _new_files(folder, before))
    _assert_intact(fresh, None, None)

    # killed with a third of the weights written
    before = set(os.listdir(folder))
    proc = _spawn("export", str(dest), "5", str(BIG_LAYERS))
    _kill_when(proc, lambda: any(s >= BIG_BYTES // 3 for s in _new_files(folder, before).values()))
    _assert_intact(dest, prev, prev_out)
    partial = _new_files(folder, before)
    assert partial and all(BIG_BYTES // 3 <= s < BIG_BYTES for s in partial.values()), partial  # mid-write
    stale = _check_leftovers(folder, {"model.pt2b"})
    assert all(n.startswith(".model.pt2b.") or n.startswith(".fresh.pt2b.") for n in stale), stale

    # the next export to the same path succeeds, whatever was left behind
    export_model(build(5, BIG_LAYERS), (example(),), dest)
    assert torch.equal(load(dest, verify=True)(example()), expected(5, BIG_LAYERS))
    export_model(build(2, 1), (example(),), fresh)
    assert torch.equal(load(fresh, verify=True)(example()), expected(2, 1))
    _check_leftovers(folder, {"model.pt2b", "fresh.pt2b"})


def test_export_killed_before_fsync_or_rename_leaves_previous_file_or_nothing(folder, tmp_path):
    """Killed with every byte written but not synced, or synced but not renamed: still the
    previous file (or none)."""
    dest, fresh = folder / "model.pt2b", folder / "fresh.pt2b"
    prev, prev_out = _previous(dest)
    for path, had, step in ((dest, prev, "fsync"), (fresh, None, "replace")):
        marker = tmp_path / f"stalled-{path.name}"
        before = set(os.listdir(folder))
        proc = _spawn("export", str(path), "6", str(BIG_LAYERS), stall=step, marker=marker)
        _kill_when(proc, marker.exists)
        _assert_intact(path, had, prev_out)
        (temp, size), = _new_files(folder, before).items()  # the complete temp file, never renamed
        assert temp.startswith(f".{path.name}.") and temp.endswith(".tmp") and size > BIG_BYTES
    _check_leftovers(folder, {"model.pt2b"})
    export_model(build(2, 1), (example(),), fresh)
    assert torch.equal(load(fresh, verify=True)(example()), expected(2, 1))


def test_kill_at_random_points_of_repeated_exports(folder):
    """A loop of exports to one path killed at random moments: the destination always holds one
    complete version (checked with every weight checksum) and gives exactly its outputs."""
    dest = folder / "model.pt2b"
    export_model(build(9, LOOP_LAYERS), (example(),), dest)
    seeds = [10, 11, 12, 13, 14]
    refs = {s: expected(s, LOOP_LAYERS) for s in [9, *seeds]}
    rng = random.Random(1234)
    seen = []
    for _ in range(3):
        before = set(os.listdir(folder))
        proc = _spawn("loop", str(dest), str(LOOP_LAYERS), *map(str, seeds))
        start = [None]

        def reached():
            if start[0] is None and _new_files(folder, before):
                start[0] = time.monotonic() + rng.uniform(0.0, 1.2)  # the loop is writing: pick a moment
            return start[0] is not None and time.monotonic() >= start[0]

        deadline = time.monotonic() + 90
        while proc.poll() is None and not reached() and time.monotonic() < deadline:
            time.sleep(0.001)
        proc.kill()  # (a loop that completed before the chosen moment is fine too)
        _, err = proc.communicate()
        assert proc.returncode in (0, -signal.SIGKILL), err.decode()[-4000:]
        assert start[0] is not None or proc.returncode == 0, "the loop never started writing"
        out = load(dest, verify=True)(example())
        matches = [s for s, ref in refs.items() if torch.equal(out, ref)]
        assert len(matches) == 1, "the destination holds no complete version"
        seen.append(matches[0])
        _check_leftovers(folder, {"model.pt2b"})
    export_model(build(15, LOOP_LAYERS), (example(),), dest)
    assert torch.equal(load(dest, verify=True)(example()), expected(15, LOOP_LAYERS))
    print("versions found after each kill:", seen)


# ---------------------------------------------------------------------------------------------
# killed in place upgrades


def test_in_place_upgrade_killed_keeps_the_original(folder, tmp_path):
    from tests.releases.test_upgrade import _pretend_older_torch

    src = folder / "big.pt2b"
    export_model(build(3, BIG_LAYERS), (example(),), src)
    _pretend_older_torch(src)  # recorded by an older torch: `pt2b upgrade` rewrites it
    sha, ref = _sha(src), load(src)(example())
    old_torch = load(src).torch_version
    assert old_torch != torch.__version__

    # the real CLI, killed while the upgraded copy is being written
    before = set(os.listdir(folder))
    proc = _spawn("upgrade", str(src), cli=True)
    _kill_when(proc, lambda: any(s >= BIG_BYTES // 3 for s in _new_files(folder, before).values()))
    assert _sha(src) == sha
    # killed after the upgraded copy was written and verified, just before it replaces the original
    marker = tmp_path / "stalled"
    proc = _spawn("upgrade", str(src), stall="replace", marker=marker)
    _kill_when(proc, marker.exists)
    assert _sha(src) == sha
    prog = load(src, verify=True)
    assert prog.torch_version == old_torch and torch.equal(prog(example()), ref)
    assert _check_leftovers(folder, {"big.pt2b"})  # the killed upgrades left temp files ...

    results = upgrade_tool.upgrade_path(folder)  # ... which a folder upgrade must not take for artifacts
    assert [(Path(r.source).name, r.written, r.failed) for r in results] == [("big.pt2b", True, False)]
    prog = load(src, verify=True)
    assert prog.torch_version == torch.__version__ and torch.equal(prog(example()), ref)


# ---------------------------------------------------------------------------------------------
# injected failures at each step of the write (in process)


class Small(torch.nn.Module):
    def __init__(self, seed=0):
        super().__init__()
        torch.manual_seed(seed)
        self.lin = torch.nn.Linear(256, 256)  # 257 KiB of weights

    def forward(self, x):
        return torch.relu(self.lin(x))


X_SMALL = torch.linspace(-1, 1, 512).reshape(2, 256)


class _DiskFills:
    """A file whose writes fail with ENOSPC once ``room`` bytes went through (partly written)."""

    def __init__(self, f, room: int):
        self._f, self._room = f, room

    def write(self, b):
        n = memoryview(b).nbytes
        if n > self._room:
            self._f.write(memoryview(b).cast("B")[: self._room])
            self._room = 0
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        self._room -= n
        return self._f.write(b)

    def __getattr__(self, name):
        return getattr(self._f, name)


def _fail(step: str, code: int, dest: Path, monkeypatch) -> None:
    """Make one step of writing ``dest`` fail with OSError(code)."""
    err = OSError(code, os.strerror(code))
    if step == "create":  # the temp file cannot be created (os.open is how tempfile creates too)
        real_open = os.open

        def failing_open(p, flags, *a, **k):
            if flags & os.O_CREAT and os.path.dirname(os.path.abspath(p)) == str(dest.parent):
                raise err
            return real_open(p, flags, *a, **k)

        monkeypatch.setattr(os, "open", failing_open)
    elif step == "write":  # the disk fills up half way through the weights
        real = weights.write_segments
        monkeypatch.setattr(weights, "write_segments", lambda f, *a, **k: real(_DiskFills(f, 100_000), *a, **k))
    elif step == "fsync":
        def failing_fsync(fd):
            raise err

        monkeypatch.setattr(os, "fsync", failing_fsync)
    elif step == "replace":  # the rename onto the destination
        real_replace = os.replace

        def failing_replace(a, b, **k):
            if os.path.abspath(b) == str(dest):
                raise err
            return real_replace(a, b, **k)

        monkeypatch.setattr(os, "replace", failing_replace)
    else:
        raise AssertionError(step)


FAILURES = [
    ("create", errno.EACCES, "permission denied"),
    ("create", errno.ENOSPC, "disk is full"),
    ("write", errno.ENOSPC, "disk is full"),
    ("fsync", errno.ENOSPC, "disk is full"),
    ("fsync", errno.EIO, "Input/output error"),
    ("replace", errno.EACCES, "permission denied"),
    ("replace", errno.EROFS, "permission denied"),
]


@pytest.mark.parametrize("previous", [True, False], ids=["over-previous", "new-file"])
@pytest.mark.parametrize("step,code,message", FAILURES, ids=[f"{s}-{errno.errorcode[c]}" for s, c, _ in FAILURES])
def test_export_failure_at_each_step(folder, monkeypatch, step, code, message, previous):
    dest = folder / "m.pt2b"
    if previous:
        export_model(Small(1), (X_SMALL,), dest)
    before, listing = (dest.read_bytes() if previous else None), sorted(os.listdir(folder))
    with monkeypatch.context() as m:
        _fail(step, code, dest, m)
        with pytest.raises(ExportError, match=message) as info:
            export_model(Small(2), (X_SMALL,), dest)
    assert str(dest) in str(info.value) and isinstance(info.value.__cause__, OSError)
    assert sorted(os.listdir(folder)) == listing  # no temp file left behind
    _assert_intact(dest, before, Small(1)(X_SMALL) if previous else None, X_SMALL)
    export_model(Small(2), (X_SMALL,), dest)  # and the next try works
    assert torch.equal(load(dest, verify=True)(X_SMALL), Small(2)(X_SMALL))


def test_export_over_the_file_size_limit(folder):
    """A real mid-write failure from the kernel (RLIMIT_FSIZE: EFBIG), nothing mocked."""
    dest = folder / "m.pt2b"
    export_model(Small(1), (X_SMALL,), dest)
    before = dest.read_bytes()
    old_limit, old_handler = resource.getrlimit(resource.RLIMIT_FSIZE), signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (128 << 10, old_limit[1]))
    try:
        with pytest.raises(ExportError, match="File too large"):
            export_model(Small(2), (X_SMALL,), dest)
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, old_limit)
        signal.signal(signal.SIGXFSZ, old_handler)
    assert os.listdir(folder) == ["m.pt2b"]
    _assert_intact(dest, before, Small(1)(X_SMALL), X_SMALL)


def test_export_interrupted_by_ctrl_c(folder, monkeypatch):
    dest = folder / "m.pt2b"
    export_model(Small(1), (X_SMALL,), dest)
    before = dest.read_bytes()
    real = weights.write_segments

    def interrupted(f, *a, **k):
        f.write(b"\1" * 5000)
        raise KeyboardInterrupt

    monkeypatch.setattr(weights, "write_segments", interrupted)
    with pytest.raises(KeyboardInterrupt):
        export_model(Small(2), (X_SMALL,), dest)
    monkeypatch.setattr(weights, "write_segments", real)
    assert os.listdir(folder) == ["m.pt2b"]
    _assert_intact(dest, before, Small(1)(X_SMALL), X_SMALL)


@pytest.mark.parametrize("step,code,message", [("fsync", errno.ENOSPC, "disk is full"),
                                               ("write", errno.ENOSPC, "disk is full"),
                                               ("replace", errno.EACCES, "permission denied")])
def test_in_place_upgrade_failure_at_each_step(folder, monkeypatch, step, code, message):
    from tests.releases.test_upgrade import _pretend_older_torch

    src = folder / "m.pt2b"
    export_model(Small(1), (X_SMALL,), src)
    _pretend_older_torch(src)
    before = src.read_bytes()
    with monkeypatch.context() as m:
        _fail(step, code, src, m)
        with pytest.raises(ExportError, match=message):
            upgrade_tool.upgrade_file(src)
    assert os.listdir(folder) == ["m.pt2b"]  # no temp file left behind
    _assert_intact(src, before, Small(1)(X_SMALL), X_SMALL)
    assert upgrade_tool.upgrade_file(src).written
    assert load(src, verify=True).torch_version == torch.__version__


def test_upgrade_to_a_directory_is_an_export_error(folder):
    from tests.releases.test_upgrade import _pretend_older_torch

    src = folder / "m.pt2b"
    export_model(Small(1), (X_SMALL,), src)
    _pretend_older_torch(src)
    (folder / "d").mkdir()
    with pytest.raises(ExportError, match="is a directory"):
        upgrade_tool.upgrade_file(src, folder / "d")
    assert sorted(os.listdir(folder)) == ["d", "m.pt2b"] and os.listdir(folder / "d") == []


# ---------------------------------------------------------------------------------------------
# what the replaced file looks like


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def test_written_files_get_ordinary_permissions(folder):
    """A new artifact is created like open(path, "wb") would create it (0o666 less the umask,
    not the temp file's private 0o600); replacing a file, by export or in place upgrade, keeps
    its permissions."""
    from tests.releases.test_upgrade import _pretend_older_torch

    new = folder / "new.pt2b"
    export_model(Small(1), (X_SMALL,), new)
    assert stat.S_IMODE(new.stat().st_mode) == 0o666 & ~_umask()
    os.chmod(new, 0o640)
    export_model(Small(2), (X_SMALL,), new)
    assert stat.S_IMODE(new.stat().st_mode) == 0o640
    _pretend_older_torch(new)
    os.chmod(new, 0o604)
    assert upgrade_tool.upgrade_file(new).written
    assert stat.S_IMODE(new.stat().st_mode) == 0o604


def test_longest_file_name(folder):
    """A destination name of the longest length the filesystem allows (255 bytes) can be
    exported to and upgraded in place: the temp file's name must fit too."""
    from tests.releases.test_upgrade import _pretend_older_torch

    dest = folder / ("m" * 250 + ".pt2b")
    export_model(Small(1), (X_SMALL,), dest)
    _pretend_older_torch(dest)
    assert upgrade_tool.upgrade_file(dest).written
    assert torch.equal(load(dest, verify=True)(X_SMALL), Small(1)(X_SMALL))
    assert os.listdir(folder) == [dest.name]
