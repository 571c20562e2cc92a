"""The lowering cache against someone who can write its folder, and against an unlucky user: a planted
entry is never served, a folder another user can write or owns is refused, a changed decomposition
misses, housekeeping counts and clears everything and never fails, and no home directory is no error."""

import os
import pathlib
import shutil
import stat
import subprocess
import sys
import tempfile
import textwrap
import warnings

import pytest
import torch

from exporter import export_model, load, load_for_backend
from exporter.cli import main as cli
from exporter.lowering import cache
from exporter.lowering.lower import lower
from exporter.lowering.plan import plan_lowering
from exporter.serialize import reader
from tests.support.helpers import Mlp

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


X = torch.randn(3, 4, generator=torch.Generator().manual_seed(0))


def _exported(tmp_path, name: str, shift: float = 0.0):
    torch.manual_seed(0)
    model = Mlp()
    with torch.no_grad():
        model.l2.bias.add_(shift)
    path = tmp_path / f"{name}.pt2b"
    export_model(model, (X,), path)
    return model, path


def _cache_warnings(record) -> list[str]:
    return [str(w.message) for w in record if "pt2b lowering cache" in str(w.message)]


# ---------------------------------------------------------------------------------------------
# a planted entry


@pytest.mark.parametrize("verify", [True, False])
@pytest.mark.parametrize("planted", ["another model", "another request"])
def test_a_planted_entry_is_removed_and_lowered_again(tmp_path, cache_dir, planted, verify):
    """Another model's lowering (the same graph, values off by 42), or the victim's own lowered with
    another request, stored with pt2b's own entry writer under the victim's key, which anyone can
    compute: the entry records the source it was made from, so it is found out, removed and lowered
    again."""
    victim_model, victim = _exported(tmp_path, "victim")
    other_model, other = _exported(tmp_path, "other", shift=42.0)
    assert not torch.allclose(other_model(X), victim_model(X))
    slot = cache.Entry.of(reader.open_artifact(victim), plan_lowering("core"), method=None, device="cpu")
    if planted == "another model":
        lowered, source = lower(load(other).exported_program(), plan_lowering("core")), reader.open_artifact(other)
    else:
        lowered, source = lower(load(victim).exported_program(), plan_lowering("none")), reader.open_artifact(victim)
    assert slot.store({"forward": lowered}, source=source)
    assert cache.entries() == [slot.path]
    served = load_for_backend(victim, "core", verify=verify)
    assert not served.from_cache
    torch.testing.assert_close(served(X), victim_model(X))
    assert cache.entries() == [slot.path]  # the planted entry removed, the victim's own stored
    hit = load_for_backend(victim, "core", verify=verify)
    assert hit.from_cache
    torch.testing.assert_close(hit(X), victim_model(X))


def test_an_entry_copied_to_another_slot_is_not_served(tmp_path, cache_dir):
    """An entry renamed to another artifact's slot name holds another key: a miss, lowered again."""
    victim_model, victim = _exported(tmp_path, "victim")
    _, other = _exported(tmp_path, "other", shift=42.0)
    load_for_backend(other, "core")
    (foreign,) = cache.entries()
    slot = cache.Entry.of(reader.open_artifact(victim), plan_lowering("core"), method=None, device="cpu")
    os.replace(foreign, slot.path)
    served = load_for_backend(victim, "core", verify=True)
    assert not served.from_cache
    torch.testing.assert_close(served(X), victim_model(X))


# ---------------------------------------------------------------------------------------------
# a folder others can write, or another user's


def test_the_cache_folder_is_created_private(tmp_path, cache_dir):
    model, path = _exported(tmp_path, "m")
    old = os.umask(0o022)
    try:
        load_for_backend(path, "core")
    finally:
        os.umask(old)
    assert stat.S_IMODE(cache_dir.stat().st_mode) == 0o700
    assert load_for_backend(path, "core").from_cache


@pytest.mark.parametrize("mode", [0o777, 0o770, 0o702, 0o1777])
def test_a_folder_others_can_write_is_refused(tmp_path, cache_dir, mode):
    """An entry stored while the folder was private, then the folder opened to others: neither read
    nor written, one warning, the lowering right."""
    model, path = _exported(tmp_path, "m")
    load_for_backend(path, "core")
    (entry,) = cache.entries()
    before = entry.stat().st_mtime_ns
    cache_dir.chmod(mode)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        lowered = load_for_backend(path, "core", verify=True)
    (message,) = _cache_warnings(record)
    assert f"not using {cache_dir}: other users can write it (mode {mode:o})" in message
    assert "chmod 700" in message
    assert not lowered.from_cache
    torch.testing.assert_close(lowered(X), model(X))
    assert cache.entries() == [entry] and entry.stat().st_mtime_ns == before  # not rewritten either
    cache_dir.chmod(0o700)
    assert load_for_backend(path, "core").from_cache


def test_a_folder_another_user_owns_is_refused(tmp_path, cache_dir, monkeypatch):
    """The folder's owner read as another user id (the tests may run as root, which owns everything
    it makes): refused with one warning, the lowering right, nothing written there."""
    model, path = _exported(tmp_path, "m")
    cache_dir.mkdir(mode=0o700)
    real = cache._stat

    def owned_by_another(p):
        st = real(p)
        fields = list(st)
        fields[stat.ST_UID] = st.st_uid + 1
        return os.stat_result(fields)

    monkeypatch.setattr(cache, "_stat", owned_by_another)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        lowered = load_for_backend(path, "core")
    (message,) = _cache_warnings(record)
    assert f"it is owned by user id {os.stat(cache_dir).st_uid + 1}, not by you" in message
    torch.testing.assert_close(lowered(X), model(X))
    assert cache.entries() == []


def test_a_read_only_folder_is_read_and_not_written(tmp_path, cache_dir):
    if os.geteuid() == 0:
        pytest.skip("root writes a read-only folder")
    model, path = _exported(tmp_path, "m")
    load_for_backend(path, "core")
    cache_dir.chmod(0o500)
    try:
        assert load_for_backend(path, "core").from_cache
        with pytest.warns(RuntimeWarning, match="lowering cache: cannot write"):
            assert not load_for_backend(path, "none").from_cache
    finally:
        cache_dir.chmod(0o700)


def test_pt2b_cache_says_a_folder_is_refused(tmp_path, cache_dir, capsys):
    cache_dir.mkdir(mode=0o700)
    cache_dir.chmod(0o777)
    assert cli(["cache"]) == 0
    assert f"lowering cache {cache_dir} (refused: other users can write it (mode 777)" in capsys.readouterr().out


# ---------------------------------------------------------------------------------------------
# a stale entry: the user's library changed a decomposition

_USERLIB = '''
import torch
from torch._decomp import register_decomposition


@torch.library.custom_op("pt2b_test_userlib::scale", mutates_args=())
def scale(x: torch.Tensor) -> torch.Tensor:
    return x * FACTOR


@scale.register_fake
def _(x):
    return torch.empty_like(x)


@register_decomposition(torch.ops.pt2b_test_userlib.scale.default)
def scale_decomposition(x):
    return torch.ops.aten.mul.Tensor(x, FACTOR)


class Model(torch.nn.Module):
    def forward(self, x):
        return torch.ops.pt2b_test_userlib.scale(x) + 1
'''

_LOWER_TWICE = '''
import sys, torch
sys.path.insert(0, sys.argv[1])
import userlib
from exporter import export_model, load_for_backend
x = torch.arange(4.0)
if sys.argv[3] == "export":
    export_model(userlib.Model(), (x,), sys.argv[2])
for _ in range(2):
    lp = load_for_backend(sys.argv[2], "core", decompose=["pt2b_test_userlib::scale"], verify=True)
    print(lp.from_cache, lp(x).tolist(), sorted(lp.ops()))
'''


def _userlib(folder, text: str) -> None:
    (folder / "userlib.py").write_text(text)
    shutil.rmtree(folder / "__pycache__", ignore_errors=True)


def test_a_changed_custom_op_decomposition_is_lowered_again(tmp_path, cache_dir):
    """A user's library registers a custom op and its decomposition (x2); a model using the op is
    exported and lowered with the op decomposed, cached. The library changes both to x3 (a new
    release): the next lowering of the same file misses and computes x3, then is cached again."""
    lib = tmp_path / "lib"
    lib.mkdir()
    artifact = tmp_path / "scaled.pt2b"

    def lower_twice(factor: int, step: str = "again") -> list[str]:
        _userlib(lib, _USERLIB.replace("FACTOR", str(factor)))
        out = subprocess.run([sys.executable, "-c", _LOWER_TWICE, str(lib), str(artifact), step],
                             capture_output=True, text=True, timeout=300, cwd=ROOT,
                             env={**os.environ, "PT2B_CACHE_DIR": str(cache_dir), "PYTHONPATH": ROOT})
        assert out.returncode == 0, out.stderr[-3000:]
        return out.stdout.splitlines()

    ops = "['aten::add.Tensor', 'aten::mul.Tensor']"
    assert lower_twice(2, "export") == [f"False [1.0, 3.0, 5.0, 7.0] {ops}", f"True [1.0, 3.0, 5.0, 7.0] {ops}"]
    assert lower_twice(3) == [f"False [1.0, 4.0, 7.0, 10.0] {ops}", f"True [1.0, 4.0, 7.0, 10.0] {ops}"]
    assert len(cache.entries()) == 2


# ---------------------------------------------------------------------------------------------
# housekeeping


def test_a_folder_named_like_an_entry_is_left_and_named(tmp_path, cache_dir, capsys):
    model, path = _exported(tmp_path, "m")
    load_for_backend(path, "core")
    (entry,) = cache.entries()
    stray = cache_dir / ("lowered-" + "0" * 40 + ".pt2b")
    stray.mkdir()
    (stray / "inside").write_text("not pt2b's")
    assert cli(["cache"]) == 0
    out = capsys.readouterr().out
    assert "1 entries, 0 leftover temporary files" in out and f"not pt2b's (left as is): {stray}" in out
    assert cli(["cache", "--clear"]) == 0
    out = capsys.readouterr().out
    assert f"removed 1 entries and 0 leftover temporary files from {cache_dir}" in out
    assert f"kept {stray} (not a file pt2b writes)" in out
    assert not entry.exists() and (stray / "inside").read_text() == "not pt2b's"


def test_a_directory_in_an_entrys_slot_is_a_miss_with_a_warning(tmp_path, cache_dir):
    model, path = _exported(tmp_path, "m")
    slot = cache.Entry.of(reader.open_artifact(path), plan_lowering("core"), method=None, device="cpu")
    slot.path.mkdir()
    with pytest.warns(RuntimeWarning, match="lowering cache: cannot write"):
        lowered = load_for_backend(path, "core")
    assert not lowered.from_cache
    torch.testing.assert_close(lowered(X), model(X))


def test_a_store_killed_before_its_rename_leaves_a_counted_leftover(tmp_path, cache_dir):
    """A lowering killed while it writes its entry (SIGKILL in the writer, after the temporary file
    has all its bytes): the temporary file is counted by `pt2b cache`, removed by --clear, and the
    next lowering is a miss that stores the entry."""
    model, path = _exported(tmp_path, "m")
    script = textwrap.dedent('''
        import os, signal, sys
        from exporter.util import atomic
        real = os.replace
        def killed(src, dst, **kw):  # the entry's bytes are written and synced: its rename is next
            if os.path.basename(dst).startswith("lowered-"):
                os.kill(os.getpid(), signal.SIGKILL)
            return real(src, dst, **kw)
        atomic.os.replace = killed
        from exporter import load_for_backend
        load_for_backend(sys.argv[1], "core")
    ''')
    out = subprocess.run([sys.executable, "-c", script, str(path)], capture_output=True, text=True, timeout=300,
                         cwd=ROOT, env={**os.environ, "PT2B_CACHE_DIR": str(cache_dir), "PYTHONPATH": ROOT})
    assert out.returncode == -9, out.stderr[-3000:]
    found = cache.contents()
    assert found.entries == [] and len(found.leftovers) == 1 and found.strays == []
    (leftover,) = found.leftovers
    assert leftover.name.startswith(".lowered-") and found.size == leftover.stat().st_size > 0
    shown = subprocess.run([sys.executable, "-m", "exporter.cli", "cache"], capture_output=True, text=True,
                           cwd=ROOT, env={**os.environ, "PT2B_CACHE_DIR": str(cache_dir)})
    assert f"0 entries, 1 leftover temporary files, {found.size / 1e6:.1f} MB" in shown.stdout
    assert not load_for_backend(path, "core").from_cache
    done = cache.clear()
    assert (done.entries, done.leftovers, done.kept) == (1, 1, [])
    assert sorted(os.listdir(cache_dir)) == []


def test_clear_removes_links_not_what_they_point_to(tmp_path, cache_dir):
    cache_dir.mkdir(mode=0o700)
    precious = tmp_path / "precious.pt2b"
    precious.write_bytes(b"mine")
    (cache_dir / ("lowered-" + "1" * 40 + ".pt2b")).symlink_to(precious)
    assert cache.clear().entries == 1
    assert precious.read_bytes() == b"mine" and os.listdir(cache_dir) == []


# ---------------------------------------------------------------------------------------------
# no home directory


@pytest.fixture
def no_home(monkeypatch):
    """HOME unset and no passwd entry to fall back on (Path.home raises as it does then)."""
    def home():
        raise RuntimeError("Could not determine home directory.")

    for name in ("HOME", "PT2B_CACHE_DIR", "XDG_CACHE_HOME", "PT2B_CACHE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr("pathlib.Path.home", staticmethod(home))


def test_no_home_lowers_without_the_cache_with_one_warning(tmp_path, no_home, capsys):
    model, path = _exported(tmp_path, "m")
    assert cache.cache_dir() is None
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        lowered = load_for_backend(path, "core")
    (message,) = _cache_warnings(record)
    assert "no home directory" in message and "PT2B_CACHE_DIR" in message
    assert not lowered.from_cache
    torch.testing.assert_close(lowered(X), model(X))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert cli(["lower", str(path)]) == 0
    assert cli(["cache"]) == 0 and cli(["cache", "--clear"]) == 0
    assert capsys.readouterr().out.count("lowering cache: none, there is no home directory") == 2


def test_no_home_with_a_cache_folder_named_uses_it(tmp_path, no_home, monkeypatch):
    model, path = _exported(tmp_path, "m")
    monkeypatch.setenv("PT2B_CACHE_DIR", str(tmp_path / "cache"))
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        load_for_backend(path, "core")
        hit = load_for_backend(path, "core")
    assert _cache_warnings(record) == [] and hit.from_cache
    torch.testing.assert_close(hit(X), model(X))


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0 or shutil.which("setpriv") is None,
                    reason="runs a process as a user id without a passwd entry (needs root and setpriv)")
def test_a_user_without_a_passwd_entry_lowers(tmp_path):
    """As an unlucky user meets it: a process of a user id no passwd entry names, without HOME."""
    import pwd

    uid = 4_242_424
    with pytest.raises(KeyError):
        pwd.getpwuid(uid)
    public = tempfile.mkdtemp(prefix="pt2b-no-home-")
    try:
        os.chmod(public, 0o755)
        model, path = _exported(pathlib.Path(public), "m")
        os.chmod(path, 0o644)
        script = ("import sys; from exporter import load_for_backend; from exporter.cli import main; "
                  "print(load_for_backend(sys.argv[1], 'core').from_cache); print(main(['lower', sys.argv[1]]))")
        out = subprocess.run(["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", sys.executable,
                              "-c", script, str(path)], capture_output=True, text=True, timeout=300, cwd=ROOT,
                             env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONPATH": ROOT})
        assert out.returncode == 0, out.stderr[-3000:]
        assert out.stdout.splitlines()[0] == "False" and out.stdout.splitlines()[-1] == "0"
        assert "Traceback" not in out.stderr and "no home directory" in out.stderr
    finally:
        shutil.rmtree(public, ignore_errors=True)
