"""A program that writes its buffers (a KV cache, a counter, running statistics) handed to a backend that
holds no state of its own: the buffers lifted to inputs and outputs, the Compiled carrying them from call
to call as the program does, the methods of one artifact over one state, and the backend's file taking
and returning the state by name."""

from __future__ import annotations

import dataclasses
import subprocess
import sys

import numpy as np
import pytest
import torch
from torch import nn

from exporter import backends, export_model, load_for_backend
from exporter.backends.state import lift, written_buffers
from exporter.errors import BackendResultError, BackendStateError
from runtime_ref import runtimes
from tools.corpus.methods import MAX_LEN, TinyKV

pytest.importorskip("onnxruntime")
pytest.importorskip("onnxscript")

PROMPT = torch.tensor([3, 14, 15, 9])
DECODE_STEPS = 4


def _kv_methods(m):
    return {"prefill": (m, (PROMPT, torch.arange(4))), "decode": (m, (torch.tensor([7]), torch.tensor([4])))}


@pytest.fixture(scope="module")
def kv(tmp_path_factory):
    path = tmp_path_factory.mktemp("lifted") / "kv.pt2b"
    export_model(_kv_methods(TinyKV().eval()), path)
    return path


def _generate(call) -> tuple[list[int], list[torch.Tensor]]:
    """Greedy: prefill the prompt, then DECODE_STEPS decode calls; (tokens, every call's logits)."""
    logits = [call("prefill", PROMPT, torch.arange(4))]
    tokens = [int(logits[-1][-1].argmax())]
    for pos in range(4, 4 + DECODE_STEPS):
        logits.append(call("decode", torch.tensor([tokens[-1]]), torch.tensor([pos])))
        tokens.append(int(logits[-1][-1].argmax()))
    return tokens, logits


def _eager():
    m = TinyKV().eval()
    with torch.no_grad():
        return _generate(lambda name, *a: m(*a))


def test_lifting_keeps_the_ops_and_runs_bitwise_with_the_state_passed_in():
    m = TinyKV().eval()
    ep = torch.export.export(m, (PROMPT, torch.arange(4))).run_decompositions({})
    lifted = lift(ep, written_buffers(ep))
    lifted.validate()
    assert written_buffers(ep) == ["k_cache", "v_cache"] and not lifted.graph_signature.buffers_to_mutate
    assert "k_cache" not in lifted.state_dict and "k_cache" not in lifted.constants
    ops = lambda p: sorted(str(n.target) for n in p.graph.nodes if n.op == "call_function")  # noqa: E731
    assert ops(lifted) == ops(ep)
    # the state after the user's inputs, its new value after the user's outputs
    assert [s.arg.name for s in lifted.graph_signature.input_specs if s.kind.name == "USER_INPUT"][-2:] == \
        ["b_k_cache", "b_v_cache"]
    state = {"k_cache": torch.randn(MAX_LEN, 16), "v_cache": torch.randn(MAX_LEN, 16)}
    out, new = lifted.module()(PROMPT, torch.arange(4), state={k: v.clone() for k, v in state.items()})
    module = ep.module()
    want = torch.func.functional_call(module, {k: v.clone() for k, v in state.items()}, (PROMPT, torch.arange(4)))
    assert torch.equal(out, want)
    module.k_cache.copy_(state["k_cache"]), module.v_cache.copy_(state["v_cache"])
    module(PROMPT, torch.arange(4))
    assert torch.equal(new["k_cache"], module.k_cache) and torch.equal(new["v_cache"], module.v_cache)


@pytest.mark.parametrize("backend", ["onnx", "openvino", "inductor"])
def test_prefill_then_decode_equals_runtime_ref_and_eager(kv, backend):
    if backend == "openvino":
        pytest.importorskip("openvino")
    lowered = load_for_backend(kv, backend=backend, cache=False)
    compiled = backends.to_backend_methods(lowered)
    assert set(compiled) == {"prefill", "decode"}
    assert compiled["prefill"].state is compiled["decode"].state  # one state, as runtime_ref's methods share
    assert compiled["decode"].validation.state == 2 and "2 carried buffer(s)" in compiled["decode"].validation.describe()
    # the hand-off check ran from the program's own state and left it there: an empty cache
    assert not compiled["prefill"].state["k_cache"].any() and not compiled["prefill"].state["v_cache"].any()
    rt = runtimes(load_for_backend(kv, "core", cache=False))
    want_tokens, want_logits = _eager()
    for run in (lambda name, *a: rt[name](*a), lambda name, *a: compiled[name](*a)):
        tokens, logits = _generate(run)
        assert tokens == want_tokens and len(set(tokens)) > 1
        for g, w in zip(logits, want_logits):
            torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5)
    assert compiled["decode"].state["k_cache"][:4 + DECODE_STEPS].abs().sum(1).all()  # the cache filled
    compiled["decode"].reset_state()  # a new sequence for both methods
    assert not compiled["prefill"].state["k_cache"].any()
    assert _generate(lambda name, *a: compiled[name](*a))[0] == want_tokens
    # the artifact's own buffers were never written
    assert not lowered.exported_program().constants.get("k_cache", lowered.exported_program().state_dict.get(
        "k_cache")).any()


class Counter(nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("count", torch.zeros((), dtype=torch.int64))
        self.lin = nn.Linear(4, 4)

    def forward(self, x):
        self.count += 1
        return self.lin(x) * self.count

    def peek(self, x):  # reads the count, writes nothing
        return x + self.count


@pytest.fixture(scope="module")
def counter(tmp_path_factory):
    d = tmp_path_factory.mktemp("counter")
    torch.manual_seed(0)
    m = Counter().eval()
    x = torch.randn(2, 4)
    export_model(m, (x,), d / "counter.pt2b")
    export_model({"forward": (m, (x,)), "peek": (m.peek, (x,))}, d / "two.pt2b")
    return d, m, x


def test_a_counter_advances_once_per_call(counter):
    d, m, x = counter
    compiled = backends.to_backend(load_for_backend(d / "counter.pt2b", backend="onnx", cache=False))
    assert dict(compiled.state) == {"count": torch.tensor(0)}
    for n in (1, 2, 3):
        torch.testing.assert_close(compiled(x), m.lin(x).detach() * n)
    assert int(compiled.state["count"]) == 3
    with pytest.raises(TypeError):
        compiled.state["count"] = torch.tensor(7)  # a read-only view
    compiled.reset_state()
    torch.testing.assert_close(compiled(x), m.lin(x).detach())


def test_frozen_state_still_holds_constants(counter):
    d, m, x = counter
    compiled = backends.to_backend(load_for_backend(d / "counter.pt2b", backend="onnx", cache=False),
                                   frozen_state=True)
    assert compiled.state is None
    for _ in range(3):
        torch.testing.assert_close(compiled(x), m.lin(x).detach())  # every call from the exported count


def test_a_method_that_only_reads_sees_what_another_wrote(counter):
    d, m, x = counter
    compiled = backends.to_backend_methods("onnx", load_for_backend(d / "two.pt2b", backend="onnx", cache=False))
    compiled["forward"](x), compiled["forward"](x)
    torch.testing.assert_close(compiled["peek"](x), x + 2)
    # the same by hand: one method, then another on its state
    lowered = load_for_backend(d / "two.pt2b", backend="onnx", cache=False)
    first = backends.to_backend(lowered.methods["forward"])
    first(x)
    reader = backends.to_backend("onnx", lowered.methods["peek"], state=first.state)
    torch.testing.assert_close(reader(x), x + 1)
    alone = backends.to_backend("onnx", lowered.methods["peek"])  # no state shared: the count as exported
    assert alone.state is None
    torch.testing.assert_close(alone(x), x)
    with pytest.raises(BackendStateError, match=r"state= takes another Compiled's \.state"):
        backends.to_backend("onnx", lowered.methods["peek"], state={"count": torch.tensor(1)})
    with pytest.raises(BackendStateError, match="pass one of them"):
        backends.to_backend("onnx", lowered.methods["peek"], state=first.state, frozen_state=True)


def test_batch_norm_running_statistics_move_in_train_mode(tmp_path):
    """Train-mode batch norm writes its running statistics and its batch count. onnxruntime computes the
    batch norm itself wrong (caught by the check); split with the reference, which runs that one node,
    the state is carried through the split program as through a whole one."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 6), nn.BatchNorm1d(6)).train()
    x = torch.randn(8, 4)
    export_model(model, (x,), tmp_path / "bn.pt2b")
    lowered = load_for_backend(tmp_path / "bn.pt2b", backend="onnx", cache=False)
    with pytest.raises(BackendResultError, match=r"output \(torch.float32\) differs"):
        backends.to_backend(lowered)
    compiled = backends.to_backend(lowered, fallback="reference")
    assert compiled.share.on_reference == {"aten::_native_batch_norm_legit_functional.default": 1}
    assert set(compiled.state) == {"1.running_mean", "1.running_var", "1.num_batches_tracked"}
    eager = nn.Sequential(nn.Linear(4, 6), nn.BatchNorm1d(6)).train()
    eager.load_state_dict(model.state_dict())
    for i in range(3):
        with torch.no_grad():
            torch.testing.assert_close(compiled(x + i), eager(x + i), rtol=1e-5, atol=1e-5)
    for name in ("running_mean", "running_var", "num_batches_tracked"):
        torch.testing.assert_close(compiled.state[f"1.{name}"], getattr(eager[1], name), rtol=1e-5, atol=1e-6)
    assert int(compiled.state["1.num_batches_tracked"]) == 3


def test_a_wrong_state_from_the_backend_is_caught(kv, monkeypatch):
    """A backend whose new cache is off (here nudged by 1%) is a BackendResultError naming the buffer."""
    lowered = load_for_backend(kv, backend="onnx", cache=False, method="decode")
    onnx = backends.get("onnx")
    real_run = onnx.run

    def nudged(*a, **k):
        out, state = real_run(*a, **k)
        return out, {name: t * 1.01 for name, t in state.items()}

    monkeypatch.setitem(backends._CACHE, "onnx", dataclasses.replace(onnx, run=nudged))
    with pytest.raises(BackendResultError, match=r"onnx@.*: state\['k_cache'\] \(torch.float32\) differs from the "
                                                 r"lowered program's by [0-9.e-]+ \(relative\), beyond 0.001"):
        backends.to_backend(lowered, stateful=False)  # (run returns the state ORT holds none of)


def test_a_backend_that_cannot_take_lifted_state_refuses_before_any_work(counter, monkeypatch):
    d, _, _ = counter
    onnx = backends.get("onnx")

    def never(*a, **k):
        raise AssertionError("handed over")

    monkeypatch.setitem(backends._CACHE, "onnx", dataclasses.replace(onnx, takes_lifted_state=False, hand_off=never))
    with pytest.raises(BackendStateError, match=r"the program writes its buffers \(count\), and onnx@.* neither holds "
                                                r"state nor takes it as inputs and outputs.*frozen_state=True"):
        backends.to_backend(load_for_backend(d / "counter.pt2b", backend="onnx", cache=False))


RUNNER = """
import json, sys
import numpy as np, onnxruntime as ort
s = ort.InferenceSession(sys.argv[1], providers=["CPUExecutionProvider"])
state = {n: np.load(f"{sys.argv[2]}/{n}.npy") for n in ("k_cache", "v_cache")}
print(json.dumps({"inputs": [i.name for i in s.get_inputs()], "outputs": [o.name for o in s.get_outputs()]}))
token, logits = int(sys.argv[3]), []
for pos in range(4, 4 + int(sys.argv[4])):
    feed = {"ids": np.array([token]), "pos": np.array([pos]), **{f"state.{n}": v for n, v in state.items()}}
    out = dict(zip([o.name for o in s.get_outputs()], s.run(None, feed)))
    state = {n: out[f"state_out.{n}"] for n in state}
    logits.append(out["output"])
    token = int(out["output"][-1].argmax())
np.save(f"{sys.argv[2]}/logits.npy", np.stack(logits))
print("pt2b imported:", any(m == "exporter" or m.startswith(("exporter.", "runtime_ref")) for m in sys.modules))
"""


def test_the_saved_onnx_file_takes_and_returns_the_state_by_name(kv, tmp_path):
    """decode's .onnx run by onnxruntime alone in a fresh process, its cache fed back call after call,
    computes what the carried Compiled does after the same prefill."""
    import json

    compiled = backends.to_backend_methods(load_for_backend(kv, backend="onnx", cache=False))
    first = compiled["prefill"](PROMPT, torch.arange(4))
    for name, value in compiled["prefill"].state.items():
        np.save(tmp_path / f"{name}.npy", value.numpy())
    graph = compiled["decode"].native.model.graph
    before = [v.name for v in (*graph.inputs, *graph.outputs)]
    compiled["decode"].save(tmp_path / "decode.onnx")
    assert [v.name for v in (*graph.inputs, *graph.outputs)] == before  # what its run feeds and reads by
    token = int(first[-1].argmax())
    ran = subprocess.run([sys.executable, "-c", RUNNER, str(tmp_path / "decode.onnx"), str(tmp_path), str(token),
                          str(DECODE_STEPS)], capture_output=True, text=True, timeout=300)
    assert ran.returncode == 0, ran.stderr[-2000:]
    names = json.loads(ran.stdout.splitlines()[0])
    assert names == {"inputs": ["ids", "pos", "state.k_cache", "state.v_cache"],
                     "outputs": ["output", "state_out.k_cache", "state_out.v_cache"]}
    assert "pt2b imported: False" in ran.stdout
    want = []
    for pos in range(4, 4 + DECODE_STEPS):
        want.append(compiled["decode"](torch.tensor([token]), torch.tensor([pos])))
        token = int(want[-1][-1].argmax())
    torch.testing.assert_close(torch.from_numpy(np.load(tmp_path / "logits.npy")), torch.stack(want),
                               rtol=1e-5, atol=1e-5)


def test_pt2b_run_on_a_backend_carries_a_methods_state(kv):
    from tests.cli.test_cli_convert import run_cli

    code, out, err = run_cli("run", str(kv), "--backend", "onnx", "--method", "decode", "--no-cache", "--repeat", "2")
    assert code == 0, err
    assert "hand-off validation passed: 1 output(s) and 2 carried buffer(s) on the stored example inputs" in out
    assert "state held by onnx's runtime from call to call: k_cache, v_cache" in out


def test_a_tiny_llama_generates_token_for_token_what_transformers_generates(tmp_path):
    """transformers' static-cache export wrapper, prefill + decode, through onnx and openvino: greedy
    tokens equal transformers' own generate()."""
    pytest.importorskip("openvino")
    from tests.support.helpers import generates_what_transformers_generates

    generates_what_transformers_generates(("onnx", "openvino"), tmp_path)
