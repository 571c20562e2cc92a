"""bench/bench_device.py on the CPU (its comparisons without a GPU): the rows it reports and the
accuracy it measures, so that the GPU's bench does not rot between the runs a GPU is lent for."""

from __future__ import annotations

import pathlib
import sys

import pytest
import torch

BENCH = pathlib.Path(__file__).resolve().parents[2] / "bench"


@pytest.fixture(scope="module")
def bench_device():
    sys.path.insert(0, str(BENCH))
    try:
        import bench_device
    finally:
        sys.path.remove(str(BENCH))
    return bench_device


def test_the_device_bench_compares_runtime_ref_with_torch_on_the_same_program(bench_device, tmp_path):
    rows = bench_device.bench("mlp", torch.device("cpu"), 5, str(tmp_path))
    by_label = {label: (ours, anchor, key) for label, ours, anchor, key in rows}
    steady = by_label["steady call, vs torch running the same lowered program (`.module().to(device)`)"]
    assert steady[2] == "runtime_large" and steady[0] > 0 and steady[1] > 0
    # the same lowered graph on the same kernels: runtime_ref's error against float64 is torch's, to the bit
    ours, eager = by_label["max abs error against float64, runtime_ref vs eager's"][:2]
    assert ours == by_label["max abs error against float64, torch's same program vs eager's"][0]
    assert 0 < ours < 1e-5 and 0 < eager < 1e-5
    assert by_label["graph calls, runtime_ref's program vs the on-device lowering's"][:2] == (6, 6)
    # the artifact lowered for the device (load_for_backend(device=...)): on the CPU the same program
    assert by_label["graph calls, the artifact lowered for the device vs the on-device lowering's"][:2] == (6, 6)
    assert by_label["max abs error against float64, runtime_ref lowered for the device vs eager's"][0] == ours


def test_a_bf16_model_name_casts_the_model_and_its_floating_inputs(bench_device):
    model, args = bench_device.build("mlp_bf16")
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    assert all(a.dtype == torch.bfloat16 for a in args if a.is_floating_point())
    with pytest.raises(SystemExit, match="unknown model 'nope'; known: mlp, encoder_6x512"):
        bench_device.build("nope")
