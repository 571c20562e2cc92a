"""Issue 39: weights the program never reads (the fp32 originals a PT2E quantization leaves beside the
int8 weights it folded, a layer forward never calls) are not stored by default; the program written
has no such input, its outputs are unchanged, the provenance names what was left out, and
keep_unused_weights=True stores them."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

import exporter
import runtime_ref
from exporter import export_model


class _WithSpare(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.used = torch.nn.Linear(8, 8)
        self.spare = torch.nn.Linear(8, 8)  # never called
        self.register_buffer("steps", torch.zeros(()))  # mutated by forward: read by its mutation
        self.register_buffer("table", torch.ones(8))  # never read

    def forward(self, x):
        self.steps.add_(1)
        return self.used(x).relu()

    def other(self, x):
        return self.spare(x)


def test_weights_forward_never_reads_are_not_stored_and_named_in_the_provenance(tmp_path):
    m, x = _WithSpare(), torch.randn(2, 8)
    ep = torch.export.export(m, (x,))
    want = ep.module()(x)
    written = export_model(ep, tmp_path / "m.pt2b")
    assert set(ep.state_dict) == {"used.weight", "used.bias", "spare.weight", "spare.bias", "steps", "table"}  # as given
    assert set(written.state_dict) == {"used.weight", "used.bias", "steps"}
    prog = exporter.load(tmp_path / "m.pt2b")
    assert set(prog.exported_program().state_dict) == {"used.weight", "used.bias", "steps"}
    assert prog.provenance["unused_weights_dropped"] == "spare.bias, spare.weight, table"
    assert torch.equal(prog(x), want)
    lowered = exporter.load_for_backend(tmp_path / "m.pt2b", "core", cache=False)
    assert torch.equal(runtime_ref.Runtime(lowered)(x), want)

    export_model(ep, tmp_path / "all.pt2b", keep_unused_weights=True)
    kept = exporter.load(tmp_path / "all.pt2b")
    assert set(kept.exported_program().state_dict) == set(ep.state_dict)
    assert "unused_weights_dropped" not in kept.provenance
    assert (tmp_path / "m.pt2b").stat().st_size < (tmp_path / "all.pt2b").stat().st_size


def test_a_program_that_reads_every_weight_is_written_as_given(tmp_path):
    m, x = torch.nn.Linear(4, 4), torch.randn(2, 4)
    ep = torch.export.export(m, (x,))
    assert export_model(ep, tmp_path / "m.pt2b") is ep
    assert "unused_weights_dropped" not in exporter.load(tmp_path / "m.pt2b").provenance


def test_each_method_drops_what_it_never_reads(tmp_path):
    m, x = _WithSpare(), torch.randn(2, 8)
    want = m.other(x)
    written = export_model({"forward": (m, (x,)), "other": (m.other, (x,))}, tmp_path / "m.pt2b")
    assert set(written["other"].state_dict) == {"spare.weight", "spare.bias"}
    prog = exporter.load(tmp_path / "m.pt2b")
    assert prog.provenance["unused_weights_dropped:forward"] == "spare.bias, spare.weight, table"
    assert prog.provenance["unused_weights_dropped:other"] == "steps, table, used.bias, used.weight"
    assert torch.equal(prog.methods["other"](x), want)


def _pt2e_mlp():
    pytest.importorskip("torchao")
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e
    from torchao.quantization.pt2e.quantizer import x86_inductor_quantizer as xiq

    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 256)).eval()
    x = torch.randn(4, 256)
    fp32 = torch.export.export(m, (x,))
    quantizer = xiq.X86InductorQuantizer().set_global(xiq.get_default_x86_inductor_quantization_config())
    q = prepare_pt2e(fp32.module(), quantizer)
    q(x)  # calibration
    q = convert_pt2e(q)
    return fp32, torch.export.export(q, (x,)), q, x


def test_a_pt2e_quantized_program_stores_int8_weights_only_and_loads_without_torchao(tmp_path):
    fp32, ep, q, x = _pt2e_mlp()
    assert sum(1 for n in ep.graph.nodes if n.op == "placeholder" and not n.users) == 2  # the fp32 originals
    export_model(fp32, tmp_path / "fp32.pt2b")
    export_model(ep, tmp_path / "int8.pt2b")
    ratio = (tmp_path / "int8.pt2b").stat().st_size / (tmp_path / "fp32.pt2b").stat().st_size
    assert ratio < 0.35, ratio  # with the fp32 originals it was 1.25x
    prog = exporter.load(tmp_path / "int8.pt2b")
    stored = [*prog.exported_program().state_dict.values(), *prog.exported_program().constants.values()]
    assert sorted(tuple(t.shape) for t in stored if t.dtype == torch.int8) == [(256, 512), (512, 256)]
    assert not [t.shape for t in stored if t.is_floating_point() and t.dim() == 2]  # no fp32 matrix left
    want = q(x)
    assert torch.equal(prog(x), want)
    lowered = exporter.load_for_backend(tmp_path / "int8.pt2b", "core", cache=False)
    assert torch.equal(runtime_ref.Runtime(lowered)(x), want)
    # a fresh process that never imported torchao: torch's own quantized_decomposed library is loaded
    # for the artifact's op table (an allowlist of torch's libraries; no module name comes from the file)
    code = (f"import sys, torch, exporter\np = exporter.load({str(tmp_path / 'int8.pt2b')!r})\n"
            f"assert 'torchao' not in sys.modules and p.ops()\nprint('ok')")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), done.stderr[-2000:]


def test_weights_are_left_out_of_the_serialized_program_without_a_copy_of_the_graph(tmp_path, monkeypatch):
    """Issue 69: a save that leaves weights out copies no fx graph (a copy cost as much as torch's serializer
    on every program with a BatchNorm, whose num_batches_tracked eval never reads); it returns the program
    as the writer's check read it back."""
    copies = []
    real_copy = torch.fx.Graph.graph_copy
    monkeypatch.setattr(torch.fx.Graph, "graph_copy", lambda self, *a, **k: copies.append(1) or real_copy(self, *a, **k))
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4), torch.nn.ReLU()).eval()
    x = torch.randn(1, 3, 8, 8)
    ep = torch.export.export(m, (x,))
    copies.clear()
    written = export_model(ep, tmp_path / "m.pt2b")
    assert copies == []
    assert "1.num_batches_tracked" in ep.state_dict and "1.num_batches_tracked" not in written.state_dict
    assert [n.name for n in written.graph.nodes if n.op == "placeholder"] == \
        [n.name for n in ep.graph.nodes if n.op == "placeholder" and n.users]
    assert torch.equal(written.module()(x), m(x))
    prog = exporter.load(tmp_path / "m.pt2b")
    assert prog.provenance["unused_weights_dropped"] == "1.num_batches_tracked"
    assert set(prog.exported_program().state_dict) == set(written.state_dict)
