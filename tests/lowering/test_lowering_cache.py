"""The lowering cache: a repeated load_for_backend is served from a stored lowered artifact with
results bitwise equal to a fresh lowering; any change of content, request or versions misses;
damaged or foreign entries are misses; cache=False / PT2B_CACHE=0 leave no trace."""

import collections
import os
import pathlib
import subprocess
import sys
import threading
import warnings

import pytest
import torch

from exporter import export_model, load_for_backend
from exporter.errors import ArtifactError, CorruptArtifactError, OpsetError
from exporter.lowering import cache
from exporter.serialize import reader
from tools.corpus.zoo import make_case
from runtime_ref import Runtime


@pytest.fixture(scope="module")
def case():
    return make_case("mlp")


@pytest.fixture
def artifact(tmp_path, case):
    path = tmp_path / "mlp.pt2b"
    export_model(case.model, case.args, path)
    return path


def _run(lowered, case):
    return Runtime(lowered)(*case.args)


def test_second_lowering_is_served_from_the_cache(cache_dir, artifact, case):
    fresh = load_for_backend(artifact, "core")
    assert not fresh.from_cache and len(cache.entries()) == 1
    hit = load_for_backend(artifact, "core")
    assert hit.from_cache
    assert hit.ops() == fresh.ops()
    assert torch.equal(_run(hit, case), _run(fresh, case))
    torch.testing.assert_close(hit(*case.args), case.model(*case.args))
    fresh_nodes = [(n.op, str(n.target)) for n in fresh.exported_program().graph.nodes]
    assert [(n.op, str(n.target)) for n in hit.exported_program().graph.nodes] == fresh_nodes
    assert hit.explain("aten::addmm.default") == fresh.explain("aten::addmm.default")
    assert hit.source.path == os.fspath(artifact)  # the undecomposed source, loaded on demand


def _count_lowering_work(monkeypatch) -> collections.Counter:
    """Counts every call of what a lowering runs: pt2b's functionalization and its retrace (where the
    tables' decompositions are applied), the node-local lowering, the decomposition entry points,
    reuse of repeated layers, torch's own retrace (patched where they are looked up, and where they
    are defined)."""
    import torch._functorch.aot_autograd as aot

    from exporter.lowering import decompose as D, engines as E, lower as L
    from exporter.lowering.engines import local as LOCAL, whole_program as F

    calls = collections.Counter()

    def spy(owner, name, label):
        real = getattr(owner, name)

        def counted(*args, **kwargs):
            calls[label] += 1
            return real(*args, **kwargs)

        monkeypatch.setattr(owner, name, counted)

    spy(F, "retrace", "functionalize")
    spy(F, "_retraced", "the retrace")
    spy(LOCAL, "lower_locally", "the node-local lowering")
    spy(E, "retrace", "functionalize")
    spy(E, "run_decompositions", "run_decompositions")
    spy(D, "trace_table", "trace_table")
    spy(E, "functionalized", "functionalized")
    spy(L, "lower_program", "lower_program")
    spy(L, "lower", "lower")
    spy(E, "lower_with_reuse", "lower_with_reuse")
    spy(aot, "aot_export_module", "aot_export_module")
    spy(LOCAL, "trace_plain", "trace_plain")  # (the node-local lowering's trace without functionalization)
    spy(torch.export.ExportedProgram, "run_decompositions", "torch's run_decompositions")
    return calls


@pytest.mark.parametrize("preset", ["core", "max"])
def test_a_cache_hit_runs_no_decomposition(cache_dir, artifact, case, monkeypatch, preset):
    """A hit costs one load: no retrace, no decomposition (not only the from_cache flag)."""
    calls = _count_lowering_work(monkeypatch)
    cold = load_for_backend(artifact, preset)
    assert not cold.from_cache
    assert calls["the node-local lowering"] + calls["the retrace"] >= 1, calls  # the counters see a lowering
    assert calls["run_decompositions"] >= 1 and calls["aot_export_module"] + calls["trace_plain"] >= 1, calls
    calls.clear()
    hit = load_for_backend(artifact, preset)
    hit.exported_program()
    assert hit.from_cache
    assert not +calls, f"a cache hit ran lowering work: {dict(calls)}"
    assert torch.equal(_run(hit, case), _run(cold, case))


def test_every_part_of_the_request_is_in_the_key(cache_dir, artifact, case, monkeypatch):
    load_for_backend(artifact, "core")
    assert not load_for_backend(artifact, "none").from_cache
    assert not load_for_backend(artifact, "core@2.13").from_cache
    assert not load_for_backend(artifact, "core", keep=["aten::linear.default"]).from_cache
    assert not load_for_backend(artifact, supported_ops=["aten::*"]).from_cache
    assert load_for_backend(artifact, "core", keep=["aten::linear.default"]).from_cache
    assert len(cache.entries()) == 5
    monkeypatch.setattr(torch, "__version__", torch.__version__ + "+other")
    assert not load_for_backend(artifact, "core").from_cache


def test_new_weights_in_the_same_file_miss(cache_dir, artifact, case):
    before = _run(load_for_backend(artifact, "core"), case)
    model = make_case("mlp").model
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)
    export_model(model, case.args, artifact)  # same graph, same path, other weights
    after = load_for_backend(artifact, "core")
    assert not after.from_cache
    assert not torch.equal(_run(after, case), before)
    torch.testing.assert_close(_run(after, case), model(*case.args))


def test_damaged_or_foreign_entries_are_misses(cache_dir, artifact, tmp_path, case):
    expected = _run(load_for_backend(artifact, "core"), case)
    (entry,) = cache.entries()
    data = bytearray(entry.read_bytes())
    data[-10] ^= 0xFF  # program section: its checksum no longer matches
    entry.write_bytes(bytes(data))
    again = load_for_backend(artifact, "core")
    assert not again.from_cache and torch.equal(_run(again, case), expected)
    assert load_for_backend(artifact, "core").from_cache  # rewritten
    # another artifact's entry under this key's name: the key stored inside does not match
    other = tmp_path / "other.pt2b"
    export_model(make_case("mlp").model, case.args, other)
    load_for_backend(other, "none")
    foreign = next(p for p in cache.entries() if p != entry)
    foreign.replace(entry)
    assert not load_for_backend(artifact, "core").from_cache


def test_cache_off(cache_dir, artifact, monkeypatch):
    load_for_backend(artifact, "core", cache=False)
    assert cache.entries() == []
    load_for_backend(artifact, "core")
    assert not load_for_backend(artifact, "core", cache=False).from_cache  # nor read
    cache.clear()
    monkeypatch.setenv("PT2B_CACHE", "0")
    load_for_backend(artifact, "core")
    assert cache.entries() == []
    assert load_for_backend(artifact, "core", cache=True).from_cache is False and len(cache.entries()) == 1


def test_custom_tables_and_failures_are_not_cached(cache_dir, artifact):
    relu_as_clamp = lambda x: torch.ops.aten.clamp_min.default(x, 0)
    load_for_backend(artifact, "core", decompositions={torch.ops.aten.relu.default: relu_as_clamp})
    assert cache.entries() == []
    for _ in range(2):
        with pytest.raises(OpsetError):
            load_for_backend(artifact, supported_ops=["aten::addmm.default"])
    assert cache.entries() == []


def test_cache_folder_resolution(monkeypatch, tmp_path):
    monkeypatch.setenv("PT2B_CACHE_DIR", str(tmp_path / "a"))
    assert cache.cache_dir() == tmp_path / "a"
    monkeypatch.delenv("PT2B_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache.cache_dir() == tmp_path / "xdg" / "pt2b"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert cache.cache_dir() == tmp_path / "home" / ".cache" / "pt2b"
    monkeypatch.setenv("XDG_CACHE_HOME", "relative/xdg")  # the XDG specification: ignored
    assert cache.cache_dir() == tmp_path / "home" / ".cache" / "pt2b"


def test_unwritable_cache_warns_and_lowers(tmp_path, monkeypatch, artifact, case):
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("x")
    monkeypatch.setenv("PT2B_CACHE_DIR", str(blocker))
    monkeypatch.delenv("PT2B_CACHE", raising=False)
    with pytest.warns(RuntimeWarning, match="lowering cache: not using .*not-a-folder: it is not a folder"):
        lowered = load_for_backend(artifact, "core")
    torch.testing.assert_close(_run(lowered, case), case.model(*case.args))


def test_verify_on_a_hit_checks_the_source_weights(cache_dir, artifact):
    load_for_backend(artifact, "core")
    art = reader.open_artifact(artifact)
    seg = art.program.segments[0]
    data = bytearray(pathlib.Path(artifact).read_bytes())
    data[art.header.data_offset + seg.offset] ^= 0x01
    pathlib.Path(artifact).write_bytes(bytes(data))
    assert load_for_backend(artifact, "core").from_cache  # the program section is unchanged
    with pytest.raises(CorruptArtifactError, match="checksum"):
        load_for_backend(artifact, "core", verify=True)


def test_source_of_a_hit_refuses_a_file_changed_since(cache_dir, artifact, case):
    load_for_backend(artifact, "core")
    hit = load_for_backend(artifact, "core")
    assert hit.from_cache
    other = make_case("mlp")
    with torch.no_grad():
        for p in other.model.parameters():
            p.add_(1.0)
    export_model(other.model, other.args, artifact)  # new content before the source was read
    with pytest.raises(ArtifactError, match="the file changed after load_for_backend served its lowering"):
        hit.source
    assert not torch.equal(load_for_backend(artifact, "core")(*case.args), hit(*case.args))


def test_concurrent_cold_lowerings_agree(cache_dir, artifact, case):
    results, errors = [], []
    barrier = threading.Barrier(4)

    def work():
        try:
            barrier.wait()
            results.append(load_for_backend(artifact, "core"))
        except Exception as e:  # noqa: BLE001 - collected and asserted below
            errors.append(e)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    # run after the join: matmuls running side by side in threads may block differently (last-bit noise)
    results = [_run(lp, case) for lp in results]
    assert all(torch.equal(r, results[0]) for r in results)
    script = ("import sys, torch; from exporter import load_for_backend; from tools.corpus.zoo import make_case; "
              "from runtime_ref import Runtime; c = make_case('mlp'); "
              f"lp = load_for_backend({os.fspath(artifact)!r}, 'core'); "
              "print(lp.from_cache, Runtime(lp)(*c.args).sum().item())")
    procs = [subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True,
                              env={**os.environ, "PT2B_CACHE_DIR": str(cache_dir)}) for _ in range(2)]
    outs = [p.communicate(timeout=120)[0].split() for p in procs]
    assert all(p.returncode == 0 for p in procs)
    assert [o[0] for o in outs] == ["True", "True"]
    assert all(float(o[1]) == results[0].sum().item() for o in outs)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert load_for_backend(artifact, "core").from_cache


def test_cli_cache_and_no_cache(cache_dir, artifact):
    from exporter.cli import main

    assert main(["lower", str(artifact), "--no-cache"]) == 0
    assert cache.entries() == []
    assert main(["lower", str(artifact)]) == 0
    assert len(cache.entries()) == 1
    out = subprocess.run([sys.executable, "-m", "exporter.cli", "cache"], capture_output=True, text=True,
                         env={**os.environ, "PT2B_CACHE_DIR": str(cache_dir)})
    assert out.returncode == 0 and f"lowering cache {cache_dir} (on): 1 entries" in out.stdout
    assert main(["cache", "--clear"]) == 0
    assert cache.entries() == []


def test_a_hit_answers_from_the_entry_and_builds_its_graph_on_first_use(cache_dir, tmp_path):
    """A hit opens the entry without its graph: ops() and outside_opset are what the lowering that
    stored it found (also for a collapsed lowering of repeated layers, whose stored graph holds one
    block); the program is checked, built and expanded on first use and equals a fresh lowering."""
    case = make_case("transformer_encoder")
    path = tmp_path / "enc.pt2b"
    export_model(case.model, case.args, path)
    for preset in ("core", "core-tag", "max"):
        fresh = load_for_backend(path, preset, cache=False)
        load_for_backend(path, preset)  # stores
        hit = load_for_backend(path, preset)
        assert hit.from_cache and not hit._built.done
        assert hit.ops() == fresh.ops() and hit.outside_opset == fresh.outside_opset
        assert not hit._built.done  # answered from the entry
        report = lambda lp: lp.report().replace(lp.validation.describe() + "\n", "")  # (its time differs)
        assert report(hit) == report(fresh)
        assert torch.equal(_run(hit, case), _run(fresh, case))
        assert hit._built.done and hit.ops() == fresh.ops()


def test_an_entry_whose_graph_does_not_load_is_lowered_again(cache_dir, artifact, case, tmp_path):
    """The entry's header, checksums, tables and op table are checked when it is opened; a graph that
    still fails its checks on first use (checksums made to match) is lowered again, as a miss is."""
    from tests.support.artifact_surgery import damage_graph_table

    fresh = load_for_backend(artifact, "core")
    (entry,) = cache.entries()
    damaged = damage_graph_table(tmp_path, entry)
    os.replace(damaged, entry)
    hit = load_for_backend(artifact, "core")
    assert hit.from_cache and hit.ops() == fresh.ops()
    assert torch.equal(_run(hit, case), _run(fresh, case))


# ---------------------------------------------------------------------------------------------
# the user code in the key (exporter/lowering/user_code.py)


def _user_function(source: str, namespace: dict | None = None, name: str = "f"):
    """``name`` as a user's library defines it (code from outside torch and pt2b), and its globals."""
    import textwrap

    namespace = {"torch": torch} if namespace is None else namespace
    exec(compile(textwrap.dedent(source), "<a user's library>", "exec"), namespace)
    return namespace[name], namespace


def test_user_code_is_keyed_by_what_it_computes():
    from exporter.lowering.user_code import callable_digest

    f2, _ = _user_function("def f(x):\n    return torch.ops.aten.mul.Tensor(x, 2)\n")
    again, _ = _user_function("\n\n# reformatted\ndef f(x):\n    return torch.ops.aten.mul.Tensor(x, 2)\n")
    f3, _ = _user_function("def f(x):\n    return torch.ops.aten.mul.Tensor(x, 3)\n")
    assert callable_digest(f2) is not None
    assert callable_digest(f2) == callable_digest(again)  # the bytecode, not the lines it sits on
    assert callable_digest(f2) != callable_digest(f3)
    # what it reaches through its globals: a plain constant, a helper function, a helper module's function
    g, ns = _user_function("FACTOR = 2\ndef helper(x):\n    return x * FACTOR\ndef f(x):\n    return helper(x)\n")
    before = callable_digest(g)
    ns["FACTOR"] = 3
    assert callable_digest(g) != before
    ns["FACTOR"] = 2
    assert callable_digest(g) == before
    ns["helper"] = _user_function("def helper(x):\n    return x * 2 + 0\n", name="helper")[0]
    assert callable_digest(g) != before
    import types

    module = types.ModuleType("users_helpers")
    module.scale, _ = _user_function("def scale(x):\n    return x * 2\n", name="scale")
    m, _ = _user_function("def f(x):\n    return users_helpers.scale(x)\n", {"users_helpers": module})
    before = callable_digest(m)
    module.scale, _ = _user_function("def scale(x):\n    return x * 3\n", name="scale")
    assert callable_digest(m) != before
    # defaults and closures
    d2, _ = _user_function("def f(x, k=2):\n    return x * k\n")
    d3, _ = _user_function("def f(x, k=3):\n    return x * k\n")
    assert callable_digest(d2) != callable_digest(d3)
    make, _ = _user_function("def make(k):\n    def f(x):\n        return x * k\n    return f\n", name="make")
    assert callable_digest(make(2)) == callable_digest(make(2)) != callable_digest(make(3))
    assert callable_digest(make(torch.ones(2))) != callable_digest(make(torch.zeros(2)))
    # a callable object and a bound method: their class's code and their settings
    cls, _ = _user_function("class Scale:\n    def __init__(self, k):\n        self.k = k\n"
                            "    def __call__(self, x):\n        return x * self.k\n"
                            "    def apply(self, x):\n        return x * self.k\n", name="Scale")
    assert callable_digest(cls(2)) == callable_digest(cls(2)) != callable_digest(cls(3))
    assert callable_digest(cls(2).apply) != callable_digest(cls(3).apply)
    helper_user, ns = _user_function("class Helper:\n    @staticmethod\n    def go(x):\n        return x * 2\n"
                                     "def f(x):\n    return Helper.go(x)\n")
    before = callable_digest(helper_user)
    ns["Helper"], _ = _user_function("class Helper:\n    @staticmethod\n    def go(x):\n        return x * 3\n",
                                     name="Helper")
    assert callable_digest(helper_user) != before
    # a recursive function ends
    r, _ = _user_function("def f(x, n):\n    return f(x, n - 1) if n else x\n")
    assert callable_digest(r) == callable_digest(r)


def test_torchs_own_code_is_keyed_by_its_version_and_what_it_wraps_by_content():
    import functools

    from torch._decomp import register_decomposition

    from exporter.lowering import tables
    from exporter.lowering.user_code import callable_digest, lowering_code_digest

    table = tables.available_decompositions()
    assert callable_digest(table[torch.ops.aten.gelu.default]) is None
    assert lowering_code_digest(table, ["aten::addmm", "prims::add"]) == ""
    f2, _ = _user_function("def f(x):\n    return torch.ops.aten.mul.Tensor(x, 2)\n")
    f3, _ = _user_function("def f(x):\n    return torch.ops.aten.mul.Tensor(x, 3)\n")
    registry = {}
    register_decomposition(torch.ops.aten.relu.default, registry=registry)(f2)
    wrapped = registry[torch.ops.aten.relu.default]
    assert callable_digest(wrapped) is not None
    assert callable_digest(functools.partial(f2)) != callable_digest(functools.partial(f3))
    a = lowering_code_digest({**table, torch.ops.aten.relu.default: f2}, [])
    b = lowering_code_digest({**table, torch.ops.aten.relu.default: f3}, [])
    assert a and b and a != b


def test_a_custom_ops_registered_functions_are_in_the_key():
    from exporter.lowering.user_code import lowering_code_digest

    @torch.library.custom_op("pt2b_test_user_code::scale", mutates_args=())
    def scale(x: torch.Tensor) -> torch.Tensor:
        return x * 2

    assert lowering_code_digest({}, ["pt2b_test_user_code::scale"])
    before = lowering_code_digest({}, ["pt2b_test_user_code::scale"])
    scale.register_fake(lambda x: torch.empty_like(x))
    with_fake = lowering_code_digest({}, ["pt2b_test_user_code::scale"])
    assert with_fake != before
    scale.register_kernel("cpu")(lambda x: x * 3)
    assert lowering_code_digest({}, ["pt2b_test_user_code::scale"]) not in (before, with_fake)


def test_code_that_reaches_too_far_is_not_keyed(cache_dir, artifact):
    import dataclasses

    from exporter.lowering import user_code
    from exporter.lowering.plan import plan_lowering

    namespace = {}
    for i in range(200):  # a chain of helpers deeper than the walk follows
        _user_function(f"def h{i}(x):\n    return h{i + 1}(x) + 1\n", namespace, name=f"h{i}")
    table = {torch.ops.aten.relu.default: namespace["h0"]}
    assert user_code.lowering_code_digest(table, []) is None
    plan = dataclasses.replace(plan_lowering("core"), table=table)
    with pytest.warns(RuntimeWarning, match="reaches more code than the cache key can hold"):
        assert cache.Entry.of(reader.open_artifact(artifact), plan, method=None, device="cpu") is None
