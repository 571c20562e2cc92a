"""Programs torch.export captures but torch's own serializer writes in a form its deserializer cannot
read (exporter/serialize/write/serde_repairs.py): pt2b writes and reads them back."""

from __future__ import annotations

import pytest
import torch

from exporter import export_model, load
from exporter.errors import ExportError
from exporter.serialize.write import serde_repairs


class AddOne(torch.nn.Module):
    def forward(self, x):
        return x + 1


def _with_dead_item(tmp_path):
    """A program holding what transformers' static-cache decoders leave after a non-strict export: an
    aten.item call nobody uses and whose value torch never recorded."""
    ep = torch.export.export(AddOne(), (torch.ones(1),))
    add = next(n for n in ep.graph.nodes if n.op == "call_function")
    with ep.graph.inserting_after(add):
        item = ep.graph.create_node("call_function", torch.ops.aten.item.default, (add,), {}, name="item")
    item.meta["val"] = None  # recorded as "no value", as torch left it in those decoders
    ep.graph_module.recompile()
    return ep


def test_torch_itself_cannot_read_a_dead_valueless_item_back(tmp_path):
    ep = _with_dead_item(tmp_path)
    torch.export.save(ep, tmp_path / "m.pt2")
    with pytest.raises(RuntimeError, match="error when deserializing the saved file"):
        torch.export.load(tmp_path / "m.pt2")


def test_dead_valueless_item_is_dropped_and_the_program_round_trips(tmp_path):
    ep = _with_dead_item(tmp_path)
    path = tmp_path / "m.pt2b"
    export_model(ep, path=path)
    prog = load(path)
    assert [str(n.target) for n in prog.exported_program().graph.nodes if n.op == "call_function"] == \
        ["aten.add.Tensor"]
    x = torch.randn(1)
    assert torch.equal(prog(x), x + 1)


def test_without_the_repair_pt2b_refuses_to_write_it(tmp_path, monkeypatch):
    """The repair is what makes it readable: without it the write => read check refuses the file."""
    monkeypatch.setattr(serde_repairs, "repair", lambda serialized: 0)
    path = tmp_path / "m.pt2b"
    with pytest.raises(ExportError, match="pt2b would refuse to load what it was about to write.*aten.item"):
        export_model(_with_dead_item(tmp_path), path=path)
    assert not path.exists()


class DeadNoGradRegion(torch.nn.Module):
    """phi4_multimodal's pattern: a no_grad block whose result the model never uses. torch.export keeps
    it as a wrap_with_set_grad_enabled region without outputs (with ``draw``, one that draws random
    numbers, which advances the generator even though its value is dropped)."""

    def __init__(self, draw=False):
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)
        self.draw = draw

    def forward(self, ids, x):
        with torch.no_grad():
            mask = ~(ids == 5).unsqueeze(-1)
            if self.draw:
                mask = mask & (torch.rand(mask.shape) > 0.5)
        return self.lin(x) * 2


def _region_args():
    return torch.tensor([[1, 5, 3]]), torch.randn(3, 4)


def _targets(ep):
    return [str(n.target) for n in ep.graph.nodes if n.op == "call_function"]


def test_torch_itself_cannot_read_a_dead_grad_region_back(tmp_path):
    ep = torch.export.export(DeadNoGradRegion(), _region_args())
    assert "wrap_with_set_grad_enabled" in _targets(ep)
    torch.export.save(ep, tmp_path / "m.pt2")
    with pytest.raises(Exception, match="wrap_with_set_grad_enabled is missing val field"):
        torch.export.load(tmp_path / "m.pt2")


def test_dead_functional_grad_region_is_dropped_and_the_program_round_trips(tmp_path):
    model = DeadNoGradRegion().eval()
    path = tmp_path / "m.pt2b"
    ep = export_model(model, _region_args(), path)
    loaded = load(path).exported_program()
    assert _targets(loaded) == ["aten.linear.default", "aten.mul.Tensor"]
    args = _region_args()
    assert torch.equal(loaded.module()(*args), ep.module()(*args))
    assert torch.equal(loaded.module()(*args), model(*args))


def test_dead_region_that_draws_random_numbers_is_not_dropped(tmp_path):
    """Dropping it would change the generator's state for what runs after it: pt2b keeps it, so the
    write => read check refuses the program with torch's reason, and no file is left."""
    path = tmp_path / "m.pt2b"
    with pytest.raises(ExportError, match="pt2b would refuse to load what it was about to write.*missing val"):
        export_model(DeadNoGradRegion(draw=True), _region_args(), path)
    assert not path.exists()


class Split(torch.nn.Module):
    def forward(self, x):
        a, b = torch.split(x, [1, 3])
        return a * 2, b.unbind(0)[1]


def test_list_values_read_back_as_captured(tmp_path):
    """split_with_sizes and unbind return Tensor[]: torch.export records a list, torch's deserializer a
    tuple (torch.export.load too); pt2b reads back the list, which IREE's FX importer needs to type the
    node (multihead attention did not import from a loaded program)."""
    ep = torch.export.export(Split(), (torch.randn(4, 2),))
    listed = {n.name: type(n.meta["val"]) for n in ep.graph.nodes if n.op == "call_function"
              and n.target in (torch.ops.aten.split_with_sizes.default, torch.ops.aten.unbind.int)}
    assert set(listed.values()) == {list}
    torch.export.save(ep, tmp_path / "m.pt2")
    theirs = torch.export.load(tmp_path / "m.pt2")
    assert {type(n.meta["val"]) for n in theirs.graph.nodes if n.name in listed} == {tuple}
    export_model(ep, path=tmp_path / "m.pt2b")
    ours = load(tmp_path / "m.pt2b").exported_program()
    assert {n.name: type(n.meta["val"]) for n in ours.graph.nodes if n.name in listed} == listed
