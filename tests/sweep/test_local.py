"""The sweep runner's local pool: each case's end (a result, an exception, a crash, a hang, memory
past its limit) is that case's record, never the sweep's; lost workers are run again; a sweep
interrupted and started again runs each case exactly once."""

from __future__ import annotations

import json
import sys

import pytest

from exporter import sweep
from exporter.errors import SweepError
from exporter.sweep import local

C = "tests.sweep.cases:"


def _vm_bytes() -> int:
    with open("/proc/self/status") as f:
        return next(int(ln.split()[1]) * 1024 for ln in f if ln.startswith("VmSize:"))


def test_each_way_a_case_ends_is_its_own_record(tmp_path):
    cases = [sweep.Case("ok", C + "square", (7,)), sweep.Case("error", C + "fail", ("bad input",)),
             # (the abort in a fresh interpreter: one forked from a test worker that had run thousands of tests
             # died of SIGSEGV in CI while it aborted, a state of the worker's, not the runner's recording)
             sweep.Case("abort", C + "abort", interpreter=sys.executable), sweep.Case("segfault", C + "segfault"),
             sweep.Case("hang", C + "hang"), sweep.Case("exit", C + "exit_quietly"),
             sweep.Case("after", C + "square", (3,))]
    got = sweep.run(cases, str(tmp_path / "r.jsonl"), workers=2, limits=sweep.Limits(timeout=3.0))
    assert list(got) == [c.id for c in cases]
    assert got["ok"]["outcome"] == "ok" and got["ok"]["result"] == {"x": 7, "square": 49}
    assert got["after"]["result"] == {"x": 3, "square": 9}
    assert (got["error"]["outcome"], got["error"]["error_type"], got["error"]["error"]) == ("error", "ValueError",
                                                                                             "bad input")
    assert got["abort"]["outcome"] == "crash" and "SIGABRT" in got["abort"]["error"]
    log = (tmp_path / "r.jsonl.logs" / "abort.log").read_text()  # the case's output, and where it crashed
    assert "about to abort" in log and "Fatal Python error: Aborted" in log and "in abort" in log
    assert log.strip().endswith(got["abort"]["log_tail"])
    assert got["segfault"]["outcome"] == "crash" and "SIGSEGV" in got["segfault"]["error"]
    assert got["exit"]["outcome"] == "crash" and "exit code 3" in got["exit"]["error"]
    assert got["hang"]["outcome"] == "timeout" and got["hang"]["seconds"] >= 3.0
    assert got["hang"]["partial"] == {"stage": "before the hang"}  # what it reported before it was killed
    for rec in got.values():
        assert rec["attempts"] == 1 and rec["executor"] == "local" and rec["git"] and rec["pt2b"]
    lines = (tmp_path / "r.jsonl").read_text().splitlines()
    assert sorted(json.loads(ln)["id"] for ln in lines) == sorted(c.id for c in cases)


def test_memory_past_the_limit_is_the_case_s_outcome(tmp_path):
    limit_gb = (_vm_bytes() + (1 << 30)) / (1 << 30)  # a forked case starts at the runner's address space
    cases = [sweep.Case("big", C + "allocate", (2.0,)), sweep.Case("small", C + "allocate", (0.01,))]
    got = sweep.run(cases, str(tmp_path / "r.jsonl"), workers=1, limits=sweep.Limits(timeout=30, memory_gb=limit_gb))
    assert got["big"]["outcome"] == "memory" and got["big"]["error_type"] == "MemoryError"
    assert got["small"]["outcome"] == "ok" and got["small"]["result"] == int(0.01 * (1 << 30))


def test_a_lost_worker_is_run_again_a_failed_case_is_not(tmp_path, monkeypatch):
    real, starts = local.launch, []

    def flaky(spec, *a, **k):  # the machine refuses the first process of "x" (as fork does out of processes)
        starts.append(spec["id"])
        if spec["id"] == "x" and starts.count("x") == 1:
            return {"outcome": "lost", "error": "the case's process could not start: [Errno 11]", "seconds": 0.0}
        return real(spec, *a, **k)

    monkeypatch.setattr(local, "launch", flaky)
    cases = [sweep.Case("x", C + "square", (2,)), sweep.Case("y", C + "fail", ("no",))]
    got = sweep.run(cases, str(tmp_path / "r.jsonl"), workers=1, limits=sweep.Limits(retries=2))
    assert got["x"]["outcome"] == "ok" and got["x"]["attempts"] == 2
    assert got["y"]["outcome"] == "error" and got["y"]["attempts"] == 1
    assert sorted(starts) == ["x", "x", "y"]


def test_a_worker_lost_every_time_is_recorded_lost_and_run_on_resume(tmp_path, monkeypatch):
    monkeypatch.setattr(local, "launch", lambda spec, *a, **k: {"outcome": "lost", "error": "gone", "seconds": 0.0})
    path = str(tmp_path / "r.jsonl")
    got = sweep.run([sweep.Case("x", C + "square", (2,))], path, workers=1, limits=sweep.Limits(retries=1))
    assert got["x"]["outcome"] == "lost" and got["x"]["attempts"] == 2
    monkeypatch.undo()
    again = sweep.run([sweep.Case("x", C + "square", (2,))], path, workers=1)
    assert again["x"]["outcome"] == "ok"


def test_an_interrupted_sweep_resumes_and_runs_each_case_once(tmp_path):
    marks = tmp_path / "marks"
    marks.mkdir()
    path = str(tmp_path / "r.jsonl")
    cases = [sweep.Case(f"c{i}", C + "marked", (i, str(marks), 0.3)) for i in range(6)]

    def stop_after_two(rec):
        if len(sweep.read(path)) == 2:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        sweep.run(cases, path, workers=2, on_record=stop_after_two)
    first = set(sweep.read(path))
    assert len(first) == 2
    with open(path, "a") as f:
        f.write('{"id": "c5", "outcome": "o')  # a line half-written when the sweep was killed
    ran = []
    got = sweep.run(cases, path, workers=2, on_record=ran.append)
    assert len(ran) == 4 and first.isdisjoint(r["id"] for r in ran)
    assert [r["outcome"] for r in got.values()] == ["ok"] * 6
    finished = [f"c{x}" for x in (marks / "done").read_text().split()]
    # the cases recorded before the interrupt ran to their end once; every case ran to its end
    assert all(finished.count(c) == 1 for c in first) and set(finished) == set(got)
    assert len((tmp_path / "r.jsonl").read_text().splitlines()) == 6


def test_a_case_named_by_interpreter_runs_there(tmp_path):
    cases = [sweep.Case("spawned", C + "square", (5,), interpreter=sys.executable),
             sweep.Case("crash", C + "segfault", interpreter=sys.executable)]
    got = sweep.run(cases, str(tmp_path / "r.jsonl"), workers=2)
    assert got["spawned"]["result"] == {"x": 5, "square": 25}
    assert got["crash"]["outcome"] == "crash" and "SIGSEGV" in got["crash"]["error"]


def test_a_forked_case_has_the_runner_s_modules(tmp_path):
    """The probe the Ray module's fresh-python test reads: a forked case sees what the runner imported."""
    got = sweep.run([sweep.Case("p", C + "imported", ("_pytest",))], str(tmp_path / "j.jsonl"), workers=1)
    assert got["p"]["outcome"] == "ok" and got["p"]["result"] is True


def test_bad_cases_are_refused_before_the_sweep(tmp_path):
    with pytest.raises(SweepError, match="cannot be imported by name"):
        sweep.Case("a", lambda: 1)
    with pytest.raises(SweepError, match="not named as 'package.module:function'"):
        sweep.Case("a", "tests.sweep.cases.square")
    with pytest.raises(SweepError, match="arguments are not JSON data"):
        sweep.Case("a", C + "square", (object(),))
    with pytest.raises(SweepError, match="ids must be unique"):
        sweep.run([sweep.Case("a", C + "square", (1,))] * 2, str(tmp_path / "r.jsonl"))
    with pytest.raises(SweepError, match="interpreter 'no-such-python' is not there"):
        sweep.run([sweep.Case("a", C + "square", (1,), interpreter="no-such-python")], str(tmp_path / "r.jsonl"))
    (tmp_path / "other.jsonl").write_text("[1, 2]\n{}\n")
    with pytest.raises(SweepError, match="line 1, is not a sweep record"):
        sweep.run([sweep.Case("a", C + "square", (1,))], str(tmp_path / "other.jsonl"))


def test_a_case_started_after_the_checkout_changed_runs_the_new_code_and_says_so(tmp_path, monkeypatch):
    """A forked case runs the modules the sweep imported: once the checkout changed, a case starts a fresh
    python instead (a fork would run old and new modules mixed), and its record names the new commit."""
    versions = iter(["a", "b"])  # the checkout as each case starts
    forked = {}
    real_launch = local.launch

    def launch(spec, timeout, log_path, fork):
        forked[log_path.rsplit("/", 1)[-1]] = fork
        return real_launch(spec, timeout, log_path, fork)

    monkeypatch.setattr(local, "code_version", lambda now=False: {"pt2b": "v", "git": next(versions) if now else "a"})
    monkeypatch.setattr(local, "launch", launch)
    cases = [sweep.Case("before", C + "square", (2,)), sweep.Case("after", C + "square", (3,))]
    got = sweep.run(cases, str(tmp_path / "r.jsonl"), workers=1)
    assert forked == {"before.log": True, "after.log": False}
    assert (got["before"]["git"], got["after"]["git"]) == ("a", "b")
    assert got["after"]["result"] == {"x": 3, "square": 9}
