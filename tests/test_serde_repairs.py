"""Programs torch.export captures but torch's own serializer writes in a form its deserializer cannot
read (exporter/serialize/serde_repairs.py): pt2b writes and reads them back."""

from __future__ import annotations

import pytest
import torch

from exporter import export_model, load
from exporter.errors import ExportError
from exporter.serialize import serde_repairs


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
