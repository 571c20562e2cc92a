"""The sweep runner on a real two-node Ray cluster on this machine (each node its own raylet): the
same records as the local pool, and a node killed mid-sweep loses no case."""

from __future__ import annotations

import threading
import time

import pytest

from exporter import sweep

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
