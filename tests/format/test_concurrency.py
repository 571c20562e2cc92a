"""Concurrency: many threads and many processes loading one artifact at once (torch.export's
deserializer keeps its state in a module global, so unguarded concurrent loads corrupt each
other), and one process replacing the artifact while others read it: every reader gets a
consistent program, bitwise equal to one complete version, and programs loaded from the old
file (mmap'd) keep giving the old outputs after it was replaced.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import threading
import time
import traceback
from pathlib import Path

import pytest
import torch

from exporter import export_model, load, load_for_backend
from exporter.cli import upgrade as upgrade_tool
from runtime_ref import Runtime

TESTS = Path(__file__).parent
REPO = TESTS.parents[1]
X = torch.linspace(-2, 2, 4 * 64).reshape(4, 64)
KINDS = ("load", "verify", "backend", "cached")


def net(seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8))


def eager(seed: int) -> torch.Tensor:
    with torch.no_grad():
        return net(seed)(X)


def digest(t: torch.Tensor) -> str:
    return hashlib.sha256(f"{t.dtype}{list(t.shape)}".encode() + t.detach().contiguous().numpy().tobytes()).hexdigest()


def open_program(kind: str, path):
    """A callable for ``path``: the undecomposed program (``load``, ``verify``: every weight
    checksum checked) or the reference runtime over its lowering (``backend``: lowered afresh,
    ``cached``: through the lowering cache)."""
    if kind == "load":
        return load(path)
    if kind == "verify":
        return load(path, verify=True)
    if kind == "backend":
        return Runtime(load_for_backend(path, preset="none", cache=False), device="cpu")
    if kind == "cached":
        return Runtime(load_for_backend(path, preset="none"), device="cpu")
    raise AssertionError(kind)


@pytest.fixture(autouse=True)
def cache_dir(tmp_path, monkeypatch):
    """A lowering cache of this test's own (inherited by the child processes)."""
    monkeypatch.setenv("PT2B_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("PT2B_CACHE", raising=False)
    return tmp_path / "cache"


@pytest.fixture
def artifact(tmp_path):
    (tmp_path / "a").mkdir()
    path = tmp_path / "a" / "m.pt2b"
    export_model(net(1), (X,), path)
    return path


# ---------------------------------------------------------------------------------------------
# child processes


def _spawn(*argv) -> subprocess.Popen:
    code = "import sys; import tests.format.test_concurrency as t; t._child(sys.argv[1:])"
    return subprocess.Popen([sys.executable, "-c", code, *map(str, argv)], cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def _wait_for(path: Path, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{path} did not appear")
        time.sleep(0.002)


def _child(argv: list[str]) -> None:
    what = argv[0]
    if what == "once":  # once PATH KIND READY GO: load and run once, when told to
        path, kind, ready, go = argv[1:]
        Path(ready).touch()
        _wait_for(Path(go))
        print(json.dumps({"sha": digest(open_program(kind, path)(X))}), flush=True)
    elif what == "reader":  # reader PATH SECONDS READY GO SHA_A SHA_B
        path, seconds, ready, go, sha_a, sha_b = argv[1:]
        Path(ready).touch()
        _wait_for(Path(go))
        refs = {sha_a: "A", sha_b: "B"}
        print(json.dumps(read_loop(path, float(seconds), lambda t: refs.get(digest(t)))), flush=True)
    elif what == "writer":  # writer PATH STARTED STOP: alternate A and B at PATH until STOP exists
        path, started, stop = argv[1:]
        eps = [export_model(net(1), (X,), path), export_model(net(2), (X,), path)]
        Path(started).touch()
        n, deadline = 2, time.monotonic() + 120
        while not Path(stop).exists() and time.monotonic() < deadline:
            export_model(eps[n % 2], path=path)
            n += 1
        print(json.dumps({"writes": n}), flush=True)
    else:
        raise SystemExit(f"unknown child command {what!r}")


def read_loop(path, seconds: float, classify, held=None) -> dict:
    """Load ``path`` over and over for ``seconds``, every kind in turn, and run it; ``classify``
    names the version an output is (None: no complete version). Every 5th program is kept and
    run again at the end, after the file was replaced many times. ``held`` (a list) receives
    them, with their version, for the caller to run later."""
    counts = {"A": 0, "B": 0, "bad": [], "held": 0, "held_bad": []}
    keep = [] if held is None else held
    deadline, i = time.monotonic() + seconds, 0
    while time.monotonic() < deadline:
        kind = KINDS[i % len(KINDS)]
        try:
            prog = open_program(kind, path)
            version = classify(prog(X))
        except Exception:
            counts["bad"].append(f"{kind}: {traceback.format_exc(limit=4)}")
            continue
        finally:
            i += 1
        if version is None:
            counts["bad"].append(f"{kind}: outputs of no complete version")
            continue
        counts[version] += 1
        if i % 5 == 0:
            keep.append((kind, prog, version))
    for kind, prog, version in keep:
        counts["held"] += 1
        if classify(prog(X)) != version:
            counts["held_bad"].append(f"{kind}: a program loaded from version {version} changed after the replace")
    return counts


# ---------------------------------------------------------------------------------------------
# one artifact, many readers at once


def test_many_threads_load_one_artifact_at_once(artifact):
    ref = eager(1)
    assert torch.equal(load(artifact)(X), ref)
    assert torch.equal(open_program("backend", artifact)(X), ref)
    kinds = ["load", "load", "load", "verify", "verify", "backend", "backend", "cached"]
    barrier = threading.Barrier(len(kinds))
    errors, outputs = [], []

    def reader(kind, shared):
        try:
            barrier.wait(timeout=60)
            out = open_program(kind, artifact)(X)
            outputs.append((kind, out, shared(X)))  # ``shared``: one program, first called by all at once
        except Exception:
            errors.append(f"{kind}: {traceback.format_exc()}")

    for _ in range(3):
        shared = load(artifact)
        threads = [threading.Thread(target=reader, args=(k, shared)) for k in kinds]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=120)
        assert not any(t.is_alive() for t in threads), "a reader thread hangs"
    assert errors == []
    assert len(outputs) == 3 * len(kinds)
    for kind, out, shared_out in outputs:
        assert torch.equal(out, ref), kind
        assert torch.equal(shared_out, ref), kind


def test_many_processes_load_one_artifact_at_once(artifact, tmp_path):
    ref = digest(eager(1))
    kinds = ["load", "verify", "backend", "cached"]
    go = tmp_path / "go"
    ready = [tmp_path / f"ready{i}" for i in range(len(kinds))]
    procs = [_spawn("once", artifact, k, r, go) for k, r in zip(kinds, ready)]
    try:
        deadline = time.monotonic() + 120
        while not all(r.exists() for r in ready):  # every child imported torch: start them together
            assert all(p.poll() is None for p in procs), "a child died before loading"
            assert time.monotonic() < deadline, "the children did not start"
            time.sleep(0.005)
        go.touch()
        results = [p.communicate(timeout=120) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    for kind, p, (out, err) in zip(kinds, procs, results):
        assert p.returncode == 0, f"{kind}: {err.decode()[-4000:]}"
        assert json.loads(out.decode().strip().splitlines()[-1]) == {"sha": ref}, kind


# ---------------------------------------------------------------------------------------------
# one writer replacing the artifact, many readers


def test_readers_see_whole_versions_while_a_writer_replaces_the_file(artifact, tmp_path):
    refs = {digest(eager(1)): "A", digest(eager(2)): "B"}
    assert len(refs) == 2
    classify = lambda t: refs.get(digest(t))
    started, stop, go = tmp_path / "started", tmp_path / "stop", tmp_path / "go"
    seconds = 4.0
    writer = _spawn("writer", artifact, started, stop)
    ready = [tmp_path / "ready"]  # one reader process (besides two reader threads here)
    readers = [_spawn("reader", artifact, seconds, r, go, *refs) for r in ready]
    procs = [writer, *readers]
    held, results, errors = [], [], []

    def thread_reader():
        try:
            results.append(read_loop(artifact, seconds, classify, held))
        except Exception:
            errors.append(traceback.format_exc())

    try:
        deadline = time.monotonic() + 120
        while not (started.exists() and all(r.exists() for r in ready)):
            assert all(p.poll() is None for p in procs), "a child died before the readers started"
            assert time.monotonic() < deadline, "the children did not start"
            time.sleep(0.005)
        go.touch()  # the writer is writing: all readers start now
        threads = [threading.Thread(target=thread_reader) for _ in range(2)]
        for t in threads:
            t.start()
        child_out = [p.communicate(timeout=120) for p in readers]
        for t in threads:
            t.join(timeout=120)
        stop.touch()
        w_out, w_err = writer.communicate(timeout=60)
    finally:
        stop.touch()
        for p in procs:
            if p.poll() is None:
                p.kill()
    assert writer.returncode == 0, w_err.decode()[-4000:]
    writes = json.loads(w_out.decode().strip().splitlines()[-1])["writes"]
    for p, (out, err) in zip(readers, child_out):
        assert p.returncode == 0, err.decode()[-4000:]
        results.append(json.loads(out.decode().strip().splitlines()[-1]))
    assert errors == []

    # programs held from files replaced since (the writer then one more export) still give their outputs
    export_model(net(3), (X,), artifact)
    assert torch.equal(load(artifact)(X), eager(3))
    for kind, prog, version in held:
        assert classify(prog(X)) == version, f"{kind}: a program loaded from version {version} changed"

    totals = {k: sum(r[k] for r in results) for k in ("A", "B", "held")}
    print(f"{writes} writes; loads per reader: {[(r['A'], r['B']) for r in results]}; {totals['held']} held")
    assert [r["bad"] for r in results] == [[]] * 3  # never an error, never a mixed or torn program
    assert [r["held_bad"] for r in results] == [[]] * 3
    assert writes >= 10 and all(r["A"] + r["B"] >= 5 for r in results)
    assert totals["A"] >= 1 and totals["B"] >= 1 and totals["held"] >= 4


def test_lowering_cache_is_not_poisoned_by_a_replace_during_load_for_backend(artifact, monkeypatch):
    """A writer replaces the file (A -> B) while load_for_backend runs; later, with A back at the
    path, load_for_backend must give A's outputs, not B's from the cache."""
    from exporter.lowering import cache

    real = cache.content_digest
    b = torch.export.export(net(2), (X,))

    def digest_then_replaced(art):
        d = real(art)
        export_model(b, path=artifact)  # the concurrent writer's replace, at the worst moment
        return d

    monkeypatch.setattr(cache, "content_digest", digest_then_replaced)
    first = open_program("cached", artifact)(X)
    monkeypatch.setattr(cache, "content_digest", real)
    assert torch.equal(first, eager(2)) or torch.equal(first, eager(1))  # either version, whole
    export_model(net(1), (X,), artifact)  # A again
    again = open_program("cached", artifact)(X)
    assert not torch.equal(again, eager(2)), "the lowering cache gave B's program for A's file"
    assert torch.equal(again, eager(1))


# ---------------------------------------------------------------------------------------------
# upgrades at once


def _older(path: Path) -> None:
    from tests.releases.test_upgrade import _pretend_older_torch

    _pretend_older_torch(path)
    assert load(path).torch_version != torch.__version__


def test_two_upgrades_of_one_file_at_once(artifact, monkeypatch):
    """A second in place upgrade runs while the first verifies its temp file (deterministically:
    from inside the first one's verification): both succeed, neither removes or replaces the
    other's temp file, the result is complete and nothing is left behind."""
    import exporter.api

    _older(artifact)
    real_load, nested = exporter.api.load, []

    def load_and_upgrade_meanwhile(path, **kw):
        if ".upgrade." in os.path.basename(path) and not nested:
            nested.append(None)
            nested[0] = upgrade_tool.upgrade_file(artifact)
        return real_load(path, **kw)

    monkeypatch.setattr(exporter.api, "load", load_and_upgrade_meanwhile)
    outer = upgrade_tool.upgrade_file(artifact)
    monkeypatch.setattr(exporter.api, "load", real_load)
    assert nested and nested[0].written and outer.written
    prog = load(artifact, verify=True)
    assert prog.torch_version == torch.__version__ and torch.equal(prog(X), eager(1))
    assert os.listdir(artifact.parent) == [artifact.name]


def test_threads_upgrading_and_loading_one_file_at_once(artifact):
    _older(artifact)
    ref = eager(1)
    barrier = threading.Barrier(6)
    errors, results, outs = [], [], []

    def upgrader():
        try:
            barrier.wait(timeout=60)
            results.append(upgrade_tool.upgrade_file(artifact))
        except Exception:
            errors.append(traceback.format_exc())

    def reader():
        try:
            barrier.wait(timeout=60)
            for _ in range(5):
                outs.append(load(artifact, verify=True)(X))
        except Exception:
            errors.append(traceback.format_exc())

    threads = [threading.Thread(target=f) for f in [upgrader] * 3 + [reader] * 3]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert errors == []
    assert len(results) == 3 and any(r.written for r in results) and not any(r.failed for r in results)
    assert len(outs) == 15 and all(torch.equal(o, ref) for o in outs)
    prog = load(artifact, verify=True)
    assert prog.torch_version == torch.__version__ and torch.equal(prog(X), ref)
    assert os.listdir(artifact.parent) == [artifact.name]
