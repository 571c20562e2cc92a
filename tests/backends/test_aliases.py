"""A weight the graph never reads that shares its memory with one the graph writes (a transformers static
cache exported strict: the cache's buffers and the attention's constants over the same tensors) is left
out of the program a backend is handed: every retrace stopped on the aliased inputs."""

from __future__ import annotations

import pytest
import torch
from torch.export.graph_signature import ExportGraphSignature, InputKind, InputSpec, TensorArgument

from exporter import backends
from exporter.backends.aliases import functional, unread_aliases, without_unread_aliases
from exporter.errors import BackendStateError


class WrittenCache(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("keys", torch.zeros(4, 8))

    def forward(self, x, pos):
        self.keys.index_copy_(0, pos, x)
        return self.keys.sum(0) * 2


def _with_unread_alias(ep):
    """``ep`` with one more buffer, ``cache_alias``, over the written cache's own tensor, which the graph
    never reads (the form strict export gives a static cache: ``key_cache_0`` beside ``lifted_tensor_2``)."""
    gm = ep.graph_module
    first = next(n for n in gm.graph.nodes if n.op == "placeholder")
    with gm.graph.inserting_before(first):
        alias = gm.graph.placeholder("b_cache_alias")
    alias.meta["val"] = first.meta["val"]
    gm.recompile()
    sig = ep.graph_signature
    specs = [InputSpec(InputKind.BUFFER, TensorArgument("b_cache_alias"), "cache_alias", True), *sig.input_specs]
    return torch.export.ExportedProgram(
        root=gm, graph=gm.graph, graph_signature=ExportGraphSignature(specs, list(sig.output_specs)),
        state_dict={"cache_alias": ep.state_dict["keys"], **ep.state_dict}, range_constraints=ep.range_constraints,
        module_call_graph=ep.module_call_graph, example_inputs=ep.example_inputs, constants=ep.constants,
        verifiers=ep.verifiers)


def _aliased():
    args = (torch.randn(1, 8), torch.tensor([1]))
    return _with_unread_alias(torch.export.export(WrittenCache(), args))


def test_only_an_unread_alias_is_left_out():
    ep = _aliased()
    with pytest.raises(AssertionError, match="expected compiled_fn to be GraphModule"):
        ep.run_decompositions({})  # (torch's own retrace: what every hand-off does)
    assert unread_aliases(ep) == ["b_cache_alias"]
    clean = without_unread_aliases(ep)
    assert [s.target for s in clean.graph_signature.input_specs] == ["keys", None, None]
    assert "cache_alias" not in clean.state_dict and "cache_alias" in ep.state_dict
    clean.run_decompositions({})
    # tied weights the graph reads both of stay (nothing is written through them)
    tied = torch.nn.Linear(4, 4)
    model = torch.nn.Sequential(tied, torch.nn.ReLU(), torch.nn.Linear(4, 4))
    model[2].weight = tied.weight
    program = torch.export.export(model, (torch.randn(2, 4),))
    assert unread_aliases(program) == [] and without_unread_aliases(program) is program


@pytest.mark.parametrize("aliased", [True, False])
@pytest.mark.parametrize("name", ["onnx", "openvino", "inductor"])
def test_a_cache_with_an_unread_alias_is_handed_over_and_carried(name, aliased):
    """Both as torch.export gives the program, its writes in the graph and none in its signature: the
    hand-off makes it functional, so the cache is carried from call to call (it was handed over as a
    constant, every call starting from zeros, and the one-call hand-off check passed)."""
    pytest.importorskip({"onnx": "onnxruntime", "openvino": "openvino", "inductor": "torch"}[name])
    args = (torch.randn(1, 8), torch.tensor([1]))
    program = _aliased() if aliased else torch.export.export(WrittenCache(), args)
    assert not [s for s in program.graph_signature.output_specs if s.kind.name == "BUFFER_MUTATION"]
    compiled = backends.to_backend(name, program)
    assert compiled.validation.status == "passed"
    eager = WrittenCache()
    for pos in (0, 2, 3):  # the cache written call after call, as the model writes its own
        args = (torch.randn(1, 8), torch.tensor([pos]))
        torch.testing.assert_close(compiled(*args), eager(*args))


def test_a_program_torch_cannot_make_functional_is_refused_not_frozen():
    """Where torch's retrace fails on a program that writes its own weights in its graph, handing it over
    as it is would freeze that state: a BackendStateError naming the write and what to do."""
    with pytest.raises(BackendStateError, match=r"the program writes b_keys in its graph and torch could not make "
                                                r"it functional \(AssertionError: .*\); lower it first"):
        functional(_aliased())
    program = torch.export.export(WrittenCache(), (torch.randn(1, 8), torch.tensor([1])))
    made = functional(program)
    assert [s.target for s in made.graph_signature.output_specs if s.kind.name == "BUFFER_MUTATION"] == ["keys"]
    still = torch.export.export(torch.nn.Linear(2, 2), (torch.randn(1, 2),))
    assert functional(still) is still
