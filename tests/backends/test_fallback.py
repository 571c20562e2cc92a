"""to_backend(..., fallback="reference"): a program the backend cannot take whole runs split, the runs of
nodes the backend lists handed over as programs of their own and the rest run by their ATen kernels; the
share the backend runs is reported, and the whole is checked against the program's own run."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from torch import nn
from torch.export import Dim

from exporter import backends, export_model, load_for_backend
from exporter._torch.pytree import pytree
from exporter.errors import BackendHandOffError, BackendResultError, BackendStateError
from tests.support import segment_ops

pytest.importorskip("onnxscript")
pytest.importorskip("onnxruntime")

NS = segment_ops.NS  # (its branchy op: no backend gets it, its kernel cannot be traced)


class Segmented(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(4, 16), nn.Linear(16, 4)

    def forward(self, x, offs):
        h = torch.ops.pt2b_segment_test.branchy(self.a(x).relu(), offs)
        return self.b(h).softmax(-1), h.sum()


@pytest.fixture(scope="module")
def segmented(tmp_path_factory):
    torch.manual_seed(0)
    model = Segmented().eval()
    path = tmp_path_factory.mktemp("fallback") / "seg.pt2b"
    export_model(model, (torch.randn(6, 4), torch.tensor([2, 6])), path,
                 dynamic_shapes=({0: Dim("rows", min=2, max=64)}, None))
    return path, model


def _assert_runs_as_eager(compiled, model):
    for rows, offs in ((6, [2, 6]), (9, [0, 9]), (3, [1, 3])):
        x, offs = torch.randn(rows, 4), torch.tensor(offs)
        for got, want in zip(compiled(x, offs), model(x, offs)):
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_without_fallback_the_program_is_refused_with_fallback_the_backend_runs_the_rest(segmented):
    path, model = segmented
    lowered = load_for_backend(path, backend="onnx", cache=False)
    assert lowered.ops()[f"{NS}::branchy.default"] == 1
    with pytest.raises(BackendHandOffError, match=f"No ONNX function found for .*{NS}.branchy"):
        backends.to_backend(lowered)
    compiled = backends.to_backend(lowered, fallback="reference")
    share = compiled.share
    ops = sum(lowered.ops().values())
    assert (share.nodes, share.backend_nodes) == (ops, ops - 1)
    assert share.on_reference == {f"{NS}::branchy.default": 1} and share.refused == ()
    assert share.flops > 0 and share.backend_flops == share.flops  # (the linears; the custom op counts none)
    assert compiled.validation.status == "passed"
    assert f"the reference runs {NS}::branchy.default x1" in share.describe()
    _assert_runs_as_eager(compiled, model)  # (the rows are a dynamic dim: the parts take them too)
    with pytest.raises(BackendHandOffError, match="runs split between onnx@.* and the reference"):
        compiled.save("split.onnx")


def test_a_part_the_backend_refuses_runs_on_the_reference(segmented, monkeypatch):
    path, model = segmented
    real = backends.get("onnx")

    def no_softmax(ep, **options):
        if any(n.target is torch.ops.aten.softmax.int for n in ep.graph.nodes):
            raise RuntimeError("softmax is not taken here")
        return real.hand_off(ep, **options)

    monkeypatch.setitem(backends._CACHE, "onnx", dataclasses.replace(real, hand_off=no_softmax))
    compiled = backends.to_backend(load_for_backend(path, backend="onnx", cache=False), fallback="reference")
    share = compiled.share
    # the refused part is cut down to the node refused; the rest of it goes back to the backend
    assert share.refused == () and [(op, why) for _, op, why in share.wrong] == [
        ("aten::softmax.int", "refused: onnx@" + real.version + " could not take the program: "
                              "RuntimeError: softmax is not taken here")]
    assert share.on_reference == {f"{NS}::branchy.default": 1, "aten::softmax.int": 1}
    assert share.backend_nodes == share.nodes - 2
    _assert_runs_as_eager(compiled, model)


def _wrong_at_softmax(real):
    """The backend ``real`` with a fault: a program that holds a softmax comes out one too high."""
    def run(native, program, args, kwargs, **extra):  # (extra: the adapter's plan, where it has one)
        out = real.run(native, program, args, kwargs, **extra)
        if any(n.target is torch.ops.aten.softmax.int for n in program.graph.nodes):
            out = pytree.tree_map(lambda o: o + 1 if isinstance(o, torch.Tensor) and o.is_floating_point() else o, out)
        return out

    return dataclasses.replace(real, run=run)


def test_a_node_the_backend_computes_wrong_is_found_and_left_to_the_reference(tmp_path, monkeypatch):
    """The backend takes the whole program but computes one node wrong: without fallback that is the
    hand-off check's BackendResultError; with it, the program is split, each part checked, and the
    wrong part cut down until the softmax runs on the reference and the rest on the backend."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.GELU(), nn.Linear(8, 8), nn.Softmax(-1), nn.Linear(8, 2)).eval()
    export_model(model, (torch.randn(3, 4),), tmp_path / "mlp.pt2b")
    lowered = load_for_backend(tmp_path / "mlp.pt2b", backend="onnx", cache=False)
    monkeypatch.setitem(backends._CACHE, "onnx", _wrong_at_softmax(backends.get("onnx")))
    with pytest.raises(BackendResultError, match=r": output \(torch.float32\) differs from the lowered program's by 1 "):
        backends.to_backend(lowered)
    compiled = backends.to_backend(lowered, fallback="reference")
    share = compiled.share
    # (the nodes cut out on the way, found right, went back to the backend)
    assert share.on_reference == {"aten::softmax.int": 1} and share.backend_nodes == share.nodes - 1
    assert share.refused == () and [op for _, op, _ in share.wrong] == ["aten::softmax.int"]
    assert "differs from the lowered program's by 1 " in share.wrong[0][2]
    assert f"the reference runs node {share.wrong[0][0]} (aten::softmax.int), which the backend computes wrong: " \
           in share.describe()
    assert compiled.validation.status == "passed"
    x = torch.randn(3, 4)
    torch.testing.assert_close(compiled(x), model(x), rtol=1e-5, atol=1e-5)


class CountingSegmented(Segmented):
    def __init__(self):
        super().__init__()
        self.register_buffer("calls", torch.zeros(()))

    def forward(self, x, offs):
        self.calls.add_(1)
        y, s = super().forward(x, offs)
        return y * self.calls, s


def test_fallback_names_what_it_takes_and_carries_the_state(segmented, tmp_path, monkeypatch):
    """A program split with the reference carries the buffers it writes as a whole one does (lifted to
    inputs and outputs of the split program); a backend that takes no lifted state refuses it."""
    path, _ = segmented
    lowered = load_for_backend(path, backend="onnx", cache=False)
    with pytest.raises(BackendHandOffError, match=r"fallback='runtime_ref': pt2b falls back on 'reference'"):
        backends.to_backend(lowered, fallback="runtime_ref")
    torch.manual_seed(0)
    model = CountingSegmented().eval()
    x, offs = torch.randn(6, 4), torch.tensor([2, 6])
    export_model(model, (x, offs), tmp_path / "counting.pt2b")
    counting = load_for_backend(tmp_path / "counting.pt2b", backend="onnx", cache=False)
    compiled = backends.to_backend(counting, fallback="reference")
    assert compiled.share is not None and compiled.validation.state == 1
    for _ in range(3):
        for got, want in zip(compiled(x, offs), model(x, offs)):
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert float(compiled.state["calls"]) == 3
    monkeypatch.setitem(backends._CACHE, "onnx", dataclasses.replace(backends.get("onnx"), takes_lifted_state=False))
    with pytest.raises(BackendStateError, match="writes its buffers"):
        backends.to_backend(counting, fallback="reference")


def test_a_program_the_backend_takes_whole_is_not_split(segmented, tmp_path):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.GELU(), nn.Linear(8, 2)).eval()
    export_model(model, (torch.randn(3, 4),), tmp_path / "mlp.pt2b")
    compiled = backends.to_backend(load_for_backend(tmp_path / "mlp.pt2b", backend="onnx", cache=False),
                                   fallback="reference")
    assert compiled.share is None and type(compiled.native).__name__ == "ONNXProgram"


def test_pt2b_run_falls_back_and_prints_the_share(segmented, capsys):
    from exporter import cli

    path, _ = segmented
    assert cli.main(["run", str(path), "--backend", "onnx", "--no-cache"]) != 0
    assert "No ONNX function found" in capsys.readouterr().err
    assert cli.main(["run", str(path), "--backend", "onnx", "--fallback", "reference", "--no-cache"]) == 0
    out = capsys.readouterr().out
    assert "hand-off validation passed" in out
    assert f"the backend runs 5 of 6 op nodes (83.3%) and 100.0% of the FLOPs; the reference runs {NS}::branchy" in out


@pytest.mark.slow
def test_a_real_model_onnxruntime_computes_wrong_runs_right_with_fallback(tmp_path):
    """transformers' afmoe: onnxruntime's TopK breaks ties otherwise than torch, the chosen experts differ
    and the model's output with them; the split finds the topk node and the reference runs it."""
    pytest.importorskip("transformers")
    from tools.corpus.transformers_zoo import make_case

    case = make_case("afmoe")
    export_model(case.model, case.args, tmp_path / "afmoe.pt2b", kwargs=case.kwargs, dynamic_shapes=case.dynamic_shapes)
    lowered = load_for_backend(tmp_path / "afmoe.pt2b", backend="onnx", cache=False)
    with pytest.raises(BackendResultError, match="differs from the lowered program's"):
        backends.to_backend(lowered)
    compiled = backends.to_backend(lowered, fallback="reference")
    assert [op for _, op, _ in compiled.share.wrong] == ["aten::topk.default"]
    assert compiled.share.backend_nodes == compiled.share.nodes - 1 and compiled.validation.status == "passed"


def test_the_split_hands_over_a_counted_number_of_parts(tmp_path, monkeypatch):
    """Cutting stops at partition.MAX_PARTS hand-offs: what is left wrong then runs on the reference whole,
    still right."""
    from exporter.backends import partition

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.GELU(), nn.Linear(8, 8), nn.Softmax(-1), nn.Linear(8, 2)).eval()
    export_model(model, (torch.randn(3, 4),), tmp_path / "mlp.pt2b")
    lowered = load_for_backend(tmp_path / "mlp.pt2b", backend="onnx", cache=False)
    real = backends.get("onnx")
    calls = []
    counted = dataclasses.replace(real, hand_off=lambda ep, **o: calls.append(1) or real.hand_off(ep, **o))
    monkeypatch.setitem(backends._CACHE, "onnx", _wrong_at_softmax(counted))
    monkeypatch.setattr(partition, "MAX_PARTS", 1)
    splits, split_once = [], partition._split_once
    monkeypatch.setattr(partition, "_split_once", lambda *a, **k: splits.append(1) or split_once(*a, **k))
    compiled = backends.to_backend(lowered, fallback="reference")
    assert len(calls) == 2  # the whole program, then the one part the split may try
    assert len(splits) == 2  # (no cut is tried back once the hand-offs are spent: it could hand nothing over)
    assert compiled.share.backend_nodes == 0 and "already tried 1 parts" in compiled.share.describe()
    x = torch.randn(3, 4)
    torch.testing.assert_close(compiled(x), model(x), rtol=1e-5, atol=1e-5)


def _softmax_kernel_wrong(real, calls):
    """The backend ``real`` with a wrong softmax kernel (its values 1.5 times torch's), every hand-off
    counted in ``calls``: what follows the softmax is computed from the wrong values, what precedes it is right."""
    def hand_off(ep, **o):
        calls.append(1)
        return real.hand_off(ep, **o)

    def run(native, program, args, kwargs, **extra):
        gm = program.module()
        for node in [n for n in gm.graph.nodes if n.target is torch.ops.aten.softmax.int]:
            with gm.graph.inserting_after(node):
                scaled = gm.graph.call_function(torch.ops.aten.mul.Tensor, (node, 1.5))
            node.replace_all_uses_with(scaled)
            scaled.args = (node, 1.5)
        gm.recompile()
        with torch.no_grad():
            return gm(*args, **kwargs)

    return dataclasses.replace(real, hand_off=hand_off, run=run)


def test_the_node_a_backend_computes_wrong_is_found_in_one_probe(tmp_path, monkeypatch):
    """A part computed wrong is handed over once more returning every value it computes: the first value
    beyond its bound names the softmax, with no cutting in halves. Five hand-offs: the whole program, the
    one part, its probe, and the two parts around the softmax."""
    torch.manual_seed(0)
    layers = [m for _ in range(6) for m in (nn.Linear(8, 8), nn.GELU())]
    model = nn.Sequential(*layers, nn.Softmax(-1), nn.Linear(8, 8), nn.GELU(), nn.Linear(8, 2)).eval()
    export_model(model, (torch.randn(3, 8),), tmp_path / "deep.pt2b")
    lowered = load_for_backend(tmp_path / "deep.pt2b", backend="onnx", cache=False)
    calls: list = []
    monkeypatch.setitem(backends._CACHE, "onnx", _softmax_kernel_wrong(backends.get("onnx"), calls))
    compiled = backends.to_backend(lowered, fallback="reference")
    assert compiled.share.on_reference == {"aten::softmax.int": 1} and len(calls) == 5
    assert [op for _, op, _ in compiled.share.wrong] == ["aten::softmax.int"]
    x = torch.randn(3, 8)
    torch.testing.assert_close(compiled(x), model(x), rtol=1e-5, atol=1e-5)


def test_the_share_is_counted_from_the_graphs_where_the_counted_run_fails(segmented, monkeypatch):
    """Under torch's FLOP counter (a dispatch mode) some composite ops take their decomposed path, whose
    output strides a view traced on the kernel's may refuse (transformers' gemma3n on TVM): the run under
    the counter fails, and the share's FLOPs then come from the graphs, the whole's and the parts'."""
    from exporter.backends import partition

    path, model = segmented
    lowered = load_for_backend(path, backend="onnx", cache=False)
    counted = backends.to_backend(lowered, fallback="reference").share
    monkeypatch.setattr(partition, "_flops", lambda fn, args: None)
    compiled = backends.to_backend(lowered, fallback="reference")
    share = compiled.share
    whole = backends.exported_program(lowered).graph_module
    assert share.flops == partition._graph_flops(whole) == counted.flops > 0  # (the formulas are torch's)
    assert share.backend_flops == counted.backend_flops and share.backend_nodes == counted.backend_nodes
    _assert_runs_as_eager(compiled, model)


class _Noisy(nn.Module):
    """vibevoice's and reformer's noise: randn, which OpenVINO lists (a core ATen op) but has no translator for."""

    def forward(self, x):
        h = torch.nn.functional.gelu(x @ x.T)
        return (h + 0 * torch.randn(h.shape, dtype=h.dtype)).softmax(-1) * 2


def test_ops_a_refusal_names_run_on_the_reference_from_the_start(monkeypatch, tmp_path):
    """OpenVINO refuses the whole program naming the op ("No conversion rule found for operations:
    aten.randn.default"): the split leaves that op to the reference at once, no part handed over is
    refused; without reading the name, the part holding it is refused and cut down, hand-off by hand-off."""
    pytest.importorskip("openvino")
    from exporter.backends import partition

    model, x = _Noisy().eval(), torch.randn(5, 4)
    export_model(model, (x,), tmp_path / "noisy.pt2b")
    ep = load_for_backend(tmp_path / "noisy.pt2b", backend="openvino", cache=False)
    with pytest.raises(BackendHandOffError, match="No conversion rule found for operations: aten.randn.default"):
        backends.to_backend("openvino", ep)
    handed = []
    monkeypatch.setattr(partition, "_hand_part", lambda *a, _hand=partition._hand_part: handed.append(1) or _hand(*a))
    compiled = backends.to_backend("openvino", ep, fallback="reference")
    share = compiled.share
    assert share.on_reference == {"aten::randn.default": 1} and share.refused == () and share.wrong == ()
    assert compiled.validation.status == "passed" and len(handed) == 1  # (the noise depends on nothing else)
    x2 = torch.randn(5, 4)
    torch.testing.assert_close(compiled(x2), model(x2), rtol=1e-5, atol=1e-5)
    monkeypatch.setattr(partition, "ops_named", lambda reason, ep: frozenset())
    handed.clear()
    uninformed = backends.to_backend("openvino", ep, fallback="reference").share
    assert [w[1] for w in uninformed.wrong] == ["aten::randn.default"] and len(handed) > 1
    assert uninformed.on_reference == share.on_reference


def test_ops_named_reads_each_backends_form_and_only_the_programs_ops():
    from exporter.backends.partition import ops_named

    ep = torch.export.export(_Noisy(), (torch.randn(5, 4),))
    assert ops_named("OpConversionFailure: No conversion rule found for operations: aten.randn.default", ep) == \
        {"aten::randn.default"}
    assert ops_named("DispatchError: No ONNX function found for <OpOverload(op='aten.gelu', overload='default')>",
                     ep) == {"aten::gelu.default"}
    assert ops_named("cannot reach the backend's ops: aten::mul.Tensor, aten::histc.default", ep) == \
        {"aten::mul.Tensor"}
    assert ops_named("RuntimeError: Compilation failed: See diagnostics", ep) == frozenset()


class _GroupedConvScatter(nn.Module):
    """Grouped convolutions around a scatter OpenVINO lacks (scatter_reduce.two, as tapas's)."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv1d(16, 16, 3, groups=4, padding=1)

    def forward(self, x, idx):
        pooled = torch.zeros(2, 16, 4).scatter_reduce(2, idx, self.conv(x).relu(), "amax", include_self=False)
        return self.conv(pooled) * 2


def test_a_part_holds_the_weights_it_takes_and_openvino_runs_its_grouped_convolutions(tmp_path, monkeypatch):
    """A part used to take the program's weights as inputs, which OpenVINO typed with no static size, and
    its CPU plugin refused a grouped convolution ("Ngraph::Node::evaluate() is not implemented for op:
    opset1::GroupConvolution": vibevoice_acoustic_tokenizer ran 12% of its nodes on OpenVINO). The part's
    program holds them as weights of its own: OpenVINO runs both convolutions, the reference the scatter
    alone, and the split computes what the model does at other lengths."""
    pytest.importorskip("openvino")
    from exporter.backends import partition

    model, n = _GroupedConvScatter(), Dim("n", min=2, max=64)
    args = (torch.randn(2, 16, 8), torch.randint(0, 4, (2, 16, 8)))
    export_model(model, args, tmp_path / "c.pt2b", dynamic_shapes=({2: n}, {2: n}))
    lowered = load_for_backend(tmp_path / "c.pt2b", backend="openvino", cache=False)
    with monkeypatch.context() as m:
        m.setattr(partition, "_held", lambda value: False)
        inputs = backends.to_backend(lowered, fallback="reference").share
    assert inputs.on_reference.get("aten::convolution.default") == 2
    assert any("opset1::GroupConvolution" in why for _, _, why in inputs.wrong)
    split = backends.to_backend(lowered, fallback="reference")
    assert split.share.on_reference == {"aten::scatter_reduce.two": 1} and split.share.flop_share == 1.0
    for length in (3, 21):
        x, idx = torch.randn(2, 16, length), torch.randint(0, 4, (2, 16, length))
        with torch.no_grad():
            torch.testing.assert_close(split(x, idx), model(x, idx), rtol=1e-4, atol=1e-4)
