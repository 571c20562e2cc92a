"""Lowering with repeated layers traced once (exporter/lowering/engines/reuse.py) gives exactly what
torch's run_decompositions gives on the whole program: node for node, and bit for bit at run time.
Most cases compare with pt2b's own whole-program lowering; test_reuse_equals_torchs_run_decompositions_bitwise
compares with torch's."""

import copy

import pytest
import torch
from torch import nn

from exporter import export_model, load_for_backend
from exporter.lowering.engines import reuse
from tools.corpus.zoo import GPT
from tests.support.helpers import assert_bitwise
from runtime_ref import Runtime


class Block(nn.Module):
    def __init__(self, d, eps=1e-5):
        super().__init__()
        self.mlp = nn.Sequential(nn.Linear(d, d), nn.GELU(), nn.LayerNorm(d, eps=eps))

    def forward(self, x):
        return x + self.mlp(x)


class Stack(nn.Module):
    """A ModuleList of equal residual MLP blocks between an input and an output layer."""

    def __init__(self, n=5, d=16):
        super().__init__()
        self.inp = nn.Linear(8, d)
        self.blocks = nn.ModuleList(Block(d) for _ in range(n))
        self.out = nn.Linear(d, 4)

    def forward(self, x):
        x = self.inp(x)
        for b in self.blocks:
            x = b(x)
        return self.out(x)


class ResBlock(nn.Module):
    """A residual conv block with batch norm (eval: running stats are read, not updated)."""

    def __init__(self, c):
        super().__init__()
        self.c1, self.bn, self.c2 = nn.Conv2d(c, c, 3, padding=1), nn.BatchNorm2d(c), nn.Conv2d(c, c, 3, padding=1)

    def forward(self, x):
        return torch.relu(x + self.c2(torch.relu(self.bn(self.c1(x)))))


class ResNet(nn.Module):
    def __init__(self, n=4):
        super().__init__()
        self.stem, self.body, self.head = nn.Conv2d(3, 8, 3, padding=1), nn.Sequential(*[ResBlock(8) for _ in range(n)]), \
            nn.Linear(8, 10)

    def forward(self, x):
        return self.head(self.body(self.stem(x)).mean((2, 3)))


def _encoder(n=4):
    layer = nn.TransformerEncoderLayer(32, 4, dim_feedforward=64, dropout=0.1, batch_first=True)
    return nn.TransformerEncoder(layer, num_layers=n, enable_nested_tensor=False).eval()


def _cases():
    torch.manual_seed(0)
    return {
        "stack": (Stack().eval(), (torch.randn(3, 8),)),
        "encoder": (_encoder(), (torch.randn(2, 7, 32),)),
        "resnet": (ResNet().eval(), (torch.randn(2, 3, 8, 8),)),
        "gpt": (GPT(vocab=97, context=16, d_model=32, nhead=4, num_layers=4).eval(), (torch.randint(0, 97, (1, 12)),)),
    }


CASES = _cases()


def _structure(ep):
    """The graph as a list of (target, arguments with nodes named by position or placeholder name)."""
    index = {}
    out = []
    for i, n in enumerate(ep.graph.nodes):
        index[n] = n.name if n.op == "placeholder" else f"#{i}"
        if n.op in ("call_function", "output"):
            args = torch.fx.node.map_arg((n.args, n.kwargs), lambda a: index[a])
            out.append((n.op, str(n.target), repr(args)))
    return out


def _lowered_with_reuse(name, preset, tmp_path, monkeypatch):
    """(artifact path, args, LoweredProgram) of CASES[name] lowered with ``preset``, asserting the
    repeated layers were reused."""
    model, args = CASES[name]
    path = tmp_path / f"{name}.pt2b"
    export_model(model, args, path)
    calls = []
    real = reuse.lower_with_reuse
    monkeypatch.setattr("exporter.lowering.engines.lower_with_reuse",
                        lambda ep, dec: calls.append(real(ep, dec)) or calls[-1])
    lowered = load_for_backend(path, preset, cache=False)
    assert calls and calls[0] is not None, "the repeated layers were not reused"
    return path, args, lowered


@pytest.mark.parametrize("name", sorted(CASES))
@pytest.mark.parametrize("preset", ["core", "max"])
def test_reuse_equals_whole_program_lowering(name, preset, tmp_path, monkeypatch):
    path, args, lowered = _lowered_with_reuse(name, preset, tmp_path, monkeypatch)
    monkeypatch.setattr("exporter.lowering.engines.lower_with_reuse", lambda ep, dec: None)
    whole = load_for_backend(path, preset, cache=False)
    assert _structure(lowered.exported_program()) == _structure(whole.exported_program())
    assert lowered.ops() == whole.ops()
    with torch.no_grad():
        want = whole.exported_program().module()(*copy.deepcopy(args))
        assert_bitwise(lowered.exported_program().module()(*copy.deepcopy(args)), want)
        assert_bitwise(Runtime(lowered)(*copy.deepcopy(args)), Runtime(whole)(*copy.deepcopy(args)))


@pytest.mark.parametrize("name", ["gpt"])  # one case in the default run (13 s); the others: against pt2b's
def test_reuse_equals_torchs_run_decompositions_bitwise(name, tmp_path, monkeypatch):
    """The claim of docs/lowering.md, against torch itself rather than pt2b's own whole-program
    lowering (which shares the decomposition table with reuse, so it cannot catch a change to both):
    core with the repeated layers traced once has torch's run_decompositions nodes, op counts and signature,
    and bitwise-equal outputs."""
    from exporter import load
    from exporter.graph_walk import op_counts

    path, args, lowered = _lowered_with_reuse(name, "core", tmp_path, monkeypatch)
    theirs = load(path).exported_program().run_decompositions()
    ours = lowered.exported_program()
    assert _structure(ours) == _structure(theirs)  # node for node
    assert op_counts(ours.graph_module) == op_counts(theirs.graph_module)
    kinds = lambda e: ([(s.kind, s.target) for s in e.graph_signature.input_specs],  # noqa: E731
                       [(s.kind, s.target) for s in e.graph_signature.output_specs])
    assert kinds(ours) == kinds(theirs)
    with torch.no_grad():
        want = theirs.module()(*copy.deepcopy(args))
        assert_bitwise(ours.module()(*copy.deepcopy(args)), want)
        assert_bitwise(Runtime(lowered)(*copy.deepcopy(args)), want)


def test_blocks_found_and_chained():
    model, args = CASES["gpt"]
    ep = torch.export.export(model, args)
    blocks = reuse.find_blocks(ep)
    assert len(blocks) == 4 and len({len(b[0]) for b in blocks}) == 1
    assert reuse._chain(blocks) == blocks
    model, args = CASES["encoder"]  # the first layer reads the user input: it differs from the rest
    assert len(reuse.find_blocks(torch.export.export(model, args))) == 3


def _whole(ep):
    return ep.run_decompositions()


def test_not_used_with_mutation_dynamic_shapes_or_unequal_blocks():
    torch.manual_seed(0)
    train = Stack(n=3)
    for b in train.blocks:
        b.mlp.append(nn.BatchNorm1d(16))
    train.train()
    ep = torch.export.export(train, (torch.randn(4, 8),))
    assert reuse.lower_with_reuse(ep, _whole) is None  # running stats are mutated

    model, args = CASES["stack"]
    dyn = torch.export.export(model, args, dynamic_shapes=({0: torch.export.Dim("b")},))
    assert reuse.lower_with_reuse(dyn, _whole) is None  # symbolic shapes

    uneven = Stack(n=3).eval()
    uneven.blocks[1] = Block(16, eps=1e-3)  # the middle block differs in a constant
    ep = torch.export.export(uneven, (torch.randn(3, 8),))
    assert len(reuse.find_blocks(ep)) == 2  # blocks 0 and 2 are equal, but not a chain
    assert reuse.lower_with_reuse(ep, _whole) is None


def test_cache_stores_the_collapsed_lowering_and_expands_it_alike(tmp_path, monkeypatch):
    from exporter import load

    monkeypatch.setenv("PT2B_CACHE_DIR", str(tmp_path / "cache"))
    model, args = CASES["gpt"]
    path = tmp_path / "gpt.pt2b"
    export_model(model, args, path)
    cold = load_for_backend(path, "core", cache=True)
    assert cold.reused is not None and not cold.from_cache
    hit = load_for_backend(path, "core", cache=True)
    assert hit.from_cache
    assert hit.ops() == cold.ops()  # (a stored program comes back with a getitem per output of multi-output ops)
    with torch.no_grad():
        assert_bitwise(Runtime(hit)(*copy.deepcopy(args)), Runtime(cold)(*copy.deepcopy(args)))
    (entry,) = (tmp_path / "cache").glob("lowered-*.pt2b")
    stored = load(entry)
    assert stored.metadata["pt2b_reuse_recipe"] == {"forward": cold.reused.recipe}  # by method name
    n_stored = sum(1 for n in stored.exported_program().graph.nodes if n.op == "call_function")
    n_full = sum(1 for n in cold.exported_program().graph.nodes if n.op == "call_function")
    assert n_stored < n_full / 2  # one block of four is stored
    monkeypatch.setattr("exporter.lowering.engines.valid_recipe", lambda r: False)  # an entry whose recipe is unusable: a miss
    assert not load_for_backend(path, "core", cache=True).from_cache
