"""The held-apart benchmark sample (bench/sample_models.py): the draw is fixed by its seed, and building
a candidate downloads nothing. Needs the `bench` extra (torchvision, timm); skipped without it."""

import importlib.util

import pytest
import torch

pytestmark = pytest.mark.skipif(
    any(importlib.util.find_spec(m) is None for m in ("torchvision", "timm")),
    reason="the held-apart sample draws from torchvision and timm (pip install 'pt2b[bench]')")


def sample_models():
    from bench import sample_models as sm

    return sm


def test_the_same_seed_draws_the_same_sample_and_another_seed_another():
    sm = sample_models()
    libs = ("torchvision", "timm")
    first, again, other = sm.draw(7, libs), sm.draw(7, libs), sm.draw(8, libs)
    assert first == again
    assert first["timm"][:30] != other["timm"][:30]
    # each library's order is a permutation of its whole registry, named "<library>/<model>"
    assert sorted(first["timm"]) == [f"timm/{n}" for n in sm.registry("timm")]
    assert first["timm"] != sorted(first["timm"])


def test_the_quotas_add_up_and_bad_requests_are_refused():
    sm = sample_models()
    assert sum(sm.quotas(30).values()) == 30
    with pytest.raises(sm.SampleRefused, match="at least one model"):
        sm.quotas(0)
    with pytest.raises(sm.SampleRefused, match="the seed must be an int"):
        sm.draw("7", ("timm",))
    with pytest.raises(sm.SampleRefused, match="unknown library 'nope'"):
        sm.build("nope/x")
    with pytest.raises(sm.SampleRefused, match=r"vit_h_14: \d+M parameters, more than the sample's 60M"):
        sm.build("torchvision/vit_h_14")  # counted on the meta device: nothing allocated


def test_building_refuses_to_download(tmp_path, monkeypatch):
    sm = sample_models()
    monkeypatch.setenv("TORCH_HOME", str(tmp_path))  # no cached checkpoint to find
    tv = sm._torchvision()
    with sm.offline(), pytest.raises(sm.DownloadRefused, match="refused to download https://"):
        tv.models.get_model("squeezenet1_1", weights="DEFAULT")
    assert not any(tmp_path.rglob("*.pth"))
    built = sm.build("torchvision/squeezenet1_1")  # weights=None: random, seeded
    again = sm.build("torchvision/squeezenet1_1")
    with torch.no_grad():
        assert torch.equal(built.model(*built.args), again.model(*again.args))
    assert built.params == sum(p.numel() for p in built.model.parameters()) and built.dtype == "float32"
