"""The sweep runner on a real two-node Ray cluster on this machine (each node its own raylet): the
same records as the local pool (plain cases, `pt2b opset coverage`, the fuzz campaign, the real-model
sweep and the backend matrix), a node killed mid-sweep loses no case, and a task whose worker hangs is
cancelled and its case run again."""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest

from exporter import sweep

# a cluster of two raylets started per module: about two minutes of the 2-core machine, run by CI's slow line
pytestmark = pytest.mark.slow

ray = pytest.importorskip("ray")
from ray.cluster_utils import Cluster  # noqa: E402

C = "tests.sweep.cases:"
NODE = {"num_cpus": 1, "object_store_memory": 80 << 20}


@pytest.fixture(scope="module")
def cluster():
    c = Cluster(initialize_head=True, head_node_args=NODE)
    c.add_node(**NODE)
    c.wait_for_nodes()
    ray.init(address=c.address, log_to_driver=False)
    yield c
    ray.shutdown()
    c.shutdown()


def test_ray_records_are_the_local_pool_s(cluster, tmp_path):
    assert len([n for n in ray.nodes() if n["Alive"]]) == 2
    cases = [sweep.Case("ok", C + "square", (4,)), sweep.Case("error", C + "fail", ("bad",)),
             sweep.Case("crash", C + "segfault"), sweep.Case("hang", C + "hang")]
    limits = sweep.Limits(timeout=3.0)
    local = sweep.run(cases, str(tmp_path / "local.jsonl"), workers=2, limits=limits)
    on_ray = sweep.run(cases, str(tmp_path / "ray.jsonl"), ray="auto", limits=limits)
    assert [r["executor"] for r in on_ray.values()] == ["ray"] * 4
    assert [r["outcome"] for r in on_ray.values()] == ["ok", "error", "crash", "timeout"]
    assert {k: sweep.comparable(r) for k, r in on_ray.items()} == {k: sweep.comparable(r) for k, r in local.items()}


def test_a_runner_connected_to_ray_starts_its_local_cases_fresh(cluster, tmp_path):
    """gRPC's threads in a Ray driver are not fork-safe (a forked bert export died of SIGSEGV while
    writing): the local pool of a runner connected to Ray starts a fresh python per case instead."""
    case = [sweep.Case("ray-imported", C + "imported", ("ray",))]
    got = sweep.run(case, str(tmp_path / "connected.jsonl"), workers=1, limits=sweep.Limits(timeout=120.0))
    assert got["ray-imported"]["outcome"] == "ok" and got["ray-imported"]["result"] is False


def test_a_node_killed_mid_sweep_loses_no_case(cluster, tmp_path):
    marks = tmp_path / "marks"
    marks.mkdir()
    worker = cluster.add_node(**NODE)  # the node to kill, its own raylet
    cluster.wait_for_nodes()
    cases = [sweep.Case(f"c{i}", C + "marked", (i, str(marks), 4.0)) for i in range(4)]
    got = {}
    run = threading.Thread(target=lambda: got.update(sweep.run(cases, str(tmp_path / "r.jsonl"), ray="auto")))
    run.start()
    deadline = time.monotonic() + 60
    while len(list(marks.glob("start.*"))) < 3 and time.monotonic() < deadline:  # a case on every node
        time.sleep(0.1)
    cluster.remove_node(worker)
    run.join(120)
    assert not run.is_alive()
    assert [r["outcome"] for r in got.values()] == ["ok"] * 4
    assert max(r["attempts"] for r in got.values()) == 2  # the case on the killed node, run again
    assert sorted(int(x) for x in (marks / "done").read_text().split()) == [0, 1, 2, 3]
    assert len((tmp_path / "r.jsonl").read_text().splitlines()) == 4


def test_coverage_records_are_the_local_pool_s(cluster, tmp_path):
    from exporter import export_model
    from exporter.explorer import coverage
    from tools.corpus.zoo import make_case

    for name in ("mlp", "kwargs_only"):
        case = make_case(name)
        export_model(case.model, case.args, tmp_path / f"{name}.pt2b", kwargs=case.kwargs)
    (tmp_path / "broken.pt2b").write_bytes(b"not an artifact")
    paths = coverage.artifacts([tmp_path])
    ops = ["aten.addmm", "aten.mm", "aten.relu", "aten.permute", "aten.view", "aten.add", "aten.mul"]
    local = coverage.measure(paths, supported_ops=ops, workers=2, records=str(tmp_path / "local.jsonl"))
    on_ray = coverage.measure(paths, supported_ops=ops, ray="auto", records=str(tmp_path / "ray.jsonl"))
    assert on_ray == local and [r.covered for r in local] == [False, True, False]
    records = {name: sweep.read(str(tmp_path / f"{name}.jsonl")) for name in ("local", "ray")}
    assert {r["executor"] for r in records["ray"].values()} == {"ray"}
    assert {k: sweep.comparable(r) for k, r in records["ray"].items()} == \
        {k: sweep.comparable(r) for k, r in records["local"].items()}


def test_fuzz_campaign_results_are_the_local_pool_s(cluster, tmp_path):
    from tools.fuzz.campaign import run_campaign

    kw = dict(indices=[(0, i) for i in range(4)], models=("mlp",), seeds_dir=str(tmp_path / "seeds"), timeout=20.0,
              keep_results=True, batch=4)
    local = run_campaign(0, 0, workers=1, records=str(tmp_path / "local.jsonl"), **kw)
    on_ray = run_campaign(0, 0, ray="auto", records=str(tmp_path / "ray.jsonl"), **kw)
    keys = ("seed", "index", "kind", "desc", "model", "outcome", "phase", "changed", "allowed")
    assert [[r.get(k) for k in keys] for r in on_ray.results] == [[r.get(k) for k in keys] for r in local.results]
    assert len(local.results) == 4 and [r["executor"] for r in sweep.read(str(tmp_path / "ray.jsonl")).values()] == ["ray"]


def test_a_task_whose_worker_hangs_is_cancelled_and_run_again(cluster, tmp_path):
    path = str(tmp_path / "r.jsonl")
    try:
        # the limit leaves the second attempt's process room to start on a busy machine (a limit is counted
        # in wall time); the first attempt hangs until limit + grace
        got = sweep.run([sweep.Case("frozen", C + "freeze_worker", (str(tmp_path),))], path, ray="auto",
                        limits=sweep.Limits(timeout=10.0, grace=3.0))
        assert got["frozen"]["outcome"] == "ok" and got["frozen"]["result"] == {"again": True}
        assert got["frozen"]["attempts"] == 2  # the hung task cancelled after its limit and grace, run again
    finally:  # the Ray worker the case stopped
        os.kill(int((tmp_path / "frozen").read_text()), signal.SIGKILL)


@pytest.mark.parametrize("backends", [None, ["onnx"]], ids=["corpus", "backend-matrix"])
def test_the_real_model_sweep_records_are_the_local_pool_s(cluster, tmp_path, backends):
    """tools/real_models.py's sweep (the backend matrix's too, with ``backends``) on the local pool and on
    the cluster: the same records of each stage."""
    pytest.importorskip("transformers")
    if backends:
        pytest.importorskip("onnxruntime")
    from tools import real_models

    kw = dict(timeout=300.0, stop_after="capture" if backends is None else None, log_dir=str(tmp_path / "logs"),
              progress=False, backends=backends)
    names = ["bert"]
    local, _ = real_models.sweep(names, workers=1, out_path=str(tmp_path / "local.json"), **kw)
    on_ray, _ = real_models.sweep(names, workers=1, ray="auto", out_path=str(tmp_path / "ray.json"), **kw)
    journals = {name: sweep.read(str(tmp_path / f"{name}.json.jsonl")) for name in ("local", "ray")}
    assert [r["executor"] for r in journals["ray"].values()] == ["ray"]


    def same(records):  # (the result holds each stage's seconds: its statuses are compared below)
        return {k: {x: v for x, v in sweep.comparable(r).items() if x != "result"} for k, r in records.items()}

    assert same(journals["ray"]) == same(journals["local"])

    def outcomes(records):
        return {n: {s: st.get("status") for s, st in r["stages"].items()} for n, r in records.items()}

    assert outcomes(on_ray) == outcomes(local) and outcomes(local)["bert"]["capture"] == "ok"


def _python_that_marks(tmp_path):
    """A python (this one) that leaves a mark each time it starts: a backend's venv stand-in."""
    import sys

    marks = tmp_path / "started"
    wrapper = tmp_path / "venv-python"
    wrapper.write_text(f"#!/bin/sh\necho $$ >> '{marks}'\nexec '{sys.executable}' \"$@\"\n")
    wrapper.chmod(0o755)
    return str(wrapper), marks


def test_a_backends_cases_run_where_it_is_installed(cluster, tmp_path):
    """The backend matrix with a backend placed elsewhere (--python onnx=...): its cases run by that
    python, here and on the cluster; on the cluster only on the node that offers the backend's resource."""
    pytest.importorskip("transformers")
    pytest.importorskip("onnxruntime")
    from tools import real_models

    node = cluster.add_node(**NODE, resources={"backend_onnx": 1})
    cluster.wait_for_nodes()
    try:
        python, marks = _python_that_marks(tmp_path)
        kw = dict(timeout=300.0, stop_after=None, log_dir=str(tmp_path / "logs"), progress=False, backends=["onnx"],
                  places={"onnx": python})
        local, _ = real_models.sweep(["bert"], workers=1, out_path=str(tmp_path / "local.json"), **kw)
        on_ray, _ = real_models.sweep(["bert"], workers=1, ray="auto", out_path=str(tmp_path / "ray.json"), **kw)
        journal = sweep.read(str(tmp_path / "ray.json.jsonl"))
        assert list(journal) == ["bert@onnx"] and journal["bert@onnx"]["node"] == node.node_id
        assert len(marks.read_text().split()) == 2  # both cases started by the backend's python
        stages = {n: {s: st.get("status") for s, st in r["stages"].items()} for n, r in on_ray.items()}
        assert stages == {n: {s: st.get("status") for s, st in r["stages"].items()} for n, r in local.items()}
        assert stages["bert"]["capture"] == "ok" and "run:onnx" in stages["bert"]
    finally:
        cluster.remove_node(node)
