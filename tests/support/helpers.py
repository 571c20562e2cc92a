"""Comparison helpers shared by the round-trip tests: graphs node by node, outputs bitwise."""

from __future__ import annotations

import math
import operator

import torch
import torch.fx
import torch.utils._pytree as pytree


def _norm_arg(a):
    """An fx argument with nodes replaced by their names, so two graphs can be compared."""
    if isinstance(a, torch.fx.Node):
        return ("node", a.name)
    if isinstance(a, (list, tuple)):
        # torch's export schema has one sequence kind: tuples of higher-order-op operands come
        # back as lists (as with torch.export.save/load); both call the op identically.
        return ("seq", tuple(_norm_arg(x) for x in a))
    if isinstance(a, dict):
        return ("dict", tuple((k, _norm_arg(v)) for k, v in a.items()))
    if isinstance(a, float):
        return ("float", math.copysign(1.0, a) if a == 0 else a) if not math.isnan(a) else ("float", "nan")
    if isinstance(a, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        return ("sym", str(a))
    return (type(a).__name__, a if isinstance(a, (int, bool, str, type(None))) else str(a))


def _meta_val(v):
    if isinstance(v, torch.Tensor):
        # Symbolic strides are compared only where static: torch's deserializer simplifies
        # stride expressions against the symbol ranges (Min(4, 4*s27) -> 4 when s27 >= 1).
        return ("tensor", tuple(str(s) for s in v.shape), v.dtype, v.device.type)
    if isinstance(v, (list, tuple)):
        return tuple(_meta_val(x) for x in v)
    if isinstance(v, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        return ("sym", str(v))
    return ("other", type(v).__name__)


def _module_stack(node):
    stack = node.meta.get("nn_module_stack") or {}
    return tuple((k, v[0]) for k, v in stack.items())


def assert_graphs_equal(gm_a: torch.fx.GraphModule, gm_b: torch.fx.GraphModule, where: str = "graph") -> None:
    nodes_a, nodes_b = list(gm_a.graph.nodes), list(gm_b.graph.nodes)
    # torch's deserializer emits a multi-output op's getitem nodes right after the op; apart
    # from getitems the order must be identical.
    not_getitem = lambda nodes: [n.name for n in nodes if n.target is not operator.getitem]
    assert not_getitem(nodes_a) == not_getitem(nodes_b), f"{where}: node order differs"
    by_name_b = {n.name: n for n in nodes_b}
    assert sorted(n.name for n in nodes_a) == sorted(by_name_b), f"{where}: node names differ"
    for a in nodes_a:
        b = by_name_b[a.name]
        here = f"{where}:{a.name}"
        assert a.op == b.op, f"{here}: op {a.op} != {b.op}"
        assert str(a.target) == str(b.target), f"{here}: target {a.target} != {b.target}"
        assert _norm_arg(a.args) == _norm_arg(b.args), f"{here}: args {a.args} != {b.args}"
        assert _norm_arg(a.kwargs) == _norm_arg(b.kwargs), f"{here}: kwargs {a.kwargs} != {b.kwargs}"
        if a.op not in ("output",):
            va, vb = a.meta.get("val"), b.meta.get("val")
            assert _meta_val(va) == _meta_val(vb), f"{here}: meta['val'] differs"
            if isinstance(va, torch.Tensor) and all(isinstance(s, int) for s in (*va.stride(), *vb.stride())):
                assert va.stride() == vb.stride(), f"{here}: strides {va.stride()} != {vb.stride()}"
        if a.op == "call_function":
            assert _module_stack(a) == _module_stack(b), f"{here}: nn_module_stack differs"
            assert a.meta.get("stack_trace") == b.meta.get("stack_trace"), f"{here}: stack_trace differs"
        if a.op == "get_attr":
            sub_a, sub_b = getattr(gm_a, a.target), getattr(gm_b, b.target)
            if isinstance(sub_a, torch.fx.GraphModule):
                assert_graphs_equal(sub_a, sub_b, f"{here}")


def assert_programs_equal(ep_a, ep_b) -> None:
    """Two ExportedPrograms hold the same graph, signature, state, ranges and call graph."""
    assert_graphs_equal(ep_a.graph_module, ep_b.graph_module)
    # `persistent` only means something for buffers (torch's schema drops it elsewhere)
    specs = lambda ep: [(s.kind, s.arg, s.target, s.persistent if s.kind.name == "BUFFER" else None)
                        for s in ep.graph_signature.input_specs]
    assert specs(ep_a) == specs(ep_b)
    assert ep_a.graph_signature.output_specs == ep_b.graph_signature.output_specs
    assert {str(k): str(v) for k, v in ep_a.range_constraints.items()} == {
        str(k): str(v) for k, v in ep_b.range_constraints.items()
    }
    assert [e.fqn for e in ep_a.module_call_graph] == [e.fqn for e in ep_b.module_call_graph]
    for ea, eb in zip(ep_a.module_call_graph, ep_b.module_call_graph):
        if ea.signature is not None:
            assert ea.signature.in_spec == eb.signature.in_spec
            assert ea.signature.out_spec == eb.signature.out_spec
    assert ep_a.state_dict.keys() == ep_b.state_dict.keys()
    for k in ep_a.state_dict:
        assert_bitwise(ep_a.state_dict[k], ep_b.state_dict[k])
        assert isinstance(ep_b.state_dict[k], torch.nn.Parameter) == isinstance(ep_a.state_dict[k], torch.nn.Parameter)
    assert ep_a.constants.keys() == ep_b.constants.keys()
    for k in ep_a.constants:
        assert_bitwise(ep_a.constants[k], ep_b.constants[k])
    assert [v.dialect for v in ep_a.verifiers] == [v.dialect for v in ep_b.verifiers]


def _bytes(t: torch.Tensor) -> torch.Tensor:
    flat = torch.empty(t.numel(), dtype=t.dtype)
    flat.copy_(t.detach().reshape(-1))
    return flat.view(torch.uint8) if t.numel() else torch.empty(0, dtype=torch.uint8)


def assert_bitwise(a, b) -> None:
    """Same pytree structure; tensor leaves of equal dtype, shape, stride and identical bits."""
    la, sa = pytree.tree_flatten(a)
    lb, sb = pytree.tree_flatten(b)
    assert sa == sb, f"output structure differs: {sa} != {sb}"
    for x, y in zip(la, lb):
        if isinstance(x, torch.Tensor):
            assert isinstance(y, torch.Tensor)
            assert x.dtype == y.dtype and x.shape == y.shape, f"{x.dtype}{list(x.shape)} != {y.dtype}{list(y.shape)}"
            assert x.stride() == y.stride(), f"strides {x.stride()} != {y.stride()}"
            assert torch.equal(_bytes(x), _bytes(y)), "tensor bits differ"
        else:
            assert x == y or (isinstance(x, float) and math.isnan(x) and math.isnan(y))


def assert_close_to_eager(out, eager, rtol: float, atol: float) -> None:
    lo, so = pytree.tree_flatten(out)
    le, se = pytree.tree_flatten(eager)
    assert so == se, f"output structure differs from eager: {so} != {se}"
    for x, y in zip(lo, le):
        if isinstance(x, torch.Tensor):
            torch.testing.assert_close(x, y, rtol=rtol, atol=atol, equal_nan=True)
        else:
            assert x == y


class CacheFilledEagerly(torch.nn.Module):
    """A static KV cache in small: a buffer written in place with a value computed from parameters.
    ``made()`` calls it once eagerly outside no_grad first, as a user filling the cache would: the
    buffer then requires grad, and torch.export records that in its placeholder's value."""

    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(4, 4)
        self.register_buffer("cache", torch.zeros(2, 8, 4), persistent=False)

    def forward(self, x, pos):
        self.cache.index_copy_(1, pos, self.proj(x))
        return self.cache.sum(1)

    @classmethod
    def made(cls):
        """(model, its inputs, the model's state before the call to export, as a fresh copy's)."""
        torch.manual_seed(0)
        model, args = cls(), (torch.randn(2, 3, 4), torch.tensor([0, 1, 2]))
        model(*args)
        assert model.cache.requires_grad
        return model, args


class Mlp(torch.nn.Module):
    """Two linear layers around a relu, 4 -> 8 -> 4: the small model of the hostile-file tests."""

    def __init__(self):
        super().__init__()
        self.l1, self.l2 = torch.nn.Linear(4, 8), torch.nn.Linear(8, 4)

    def forward(self, x):
        return self.l2(self.l1(x).relu())


def same_tensor_leaves(a, b) -> bool:
    """Whether ``a`` and ``b`` hold the same tensor leaves, shape and bits, in the same order."""
    la = [v for v in pytree.tree_leaves(a) if isinstance(v, torch.Tensor)]
    lb = [v for v in pytree.tree_leaves(b) if isinstance(v, torch.Tensor)]
    return len(la) == len(lb) and all(x.shape == y.shape and torch.equal(x, y) for x, y in zip(la, lb))


def raised(fn, args):
    """The exception ``fn(*args)`` raises, or None."""
    try:
        fn(*args)
    except Exception as e:  # noqa: BLE001 -- what each raises is compared by the caller
        return e
    return None


def tiny_bert_artifact(path):
    """(model, ids): a one-layer transformers BertModel (random weights, seed 0), exported to ``path`` with
    one (1, 6) ``input_ids``: a file whose outputs are a transformers type. Skips where transformers is
    missing."""
    import pytest

    from exporter import export_model

    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    cfg = transformers.BertConfig(hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32,
                                  vocab_size=50, max_position_embeddings=16)
    model = transformers.BertModel(cfg).eval()
    ids = torch.randint(0, 50, (1, 6))
    export_model(model, (ids,), path)
    return model, ids


class WritesItsInput(torch.nn.Module):
    """A program that writes its own input in place (``x.add_(1)``) and returns from it."""

    def forward(self, x, *, scale):
        x.add_(1)
        return x * scale


def input_writes_reach_the_caller(backend: str, tmp_path):
    """WritesItsInput handed to ``backend`` (validated), called twice on a caller's tensor: the tensor
    holds each write (x + 1, then x + 2) and the outputs are eager's. Returns the Compiled."""
    from exporter import backends, export_model, load_for_backend

    path = tmp_path / f"writes-{backend}.pt2b"
    export_model(WritesItsInput(), (torch.randn(3),), path, kwargs={"scale": torch.tensor(2.0)})
    compiled = backends.to_backend(load_for_backend(path, backend=backend, cache=False))
    assert compiled.validation.status == "passed"
    x, want = torch.arange(3.0), torch.arange(3.0)
    for _ in range(2):
        out = compiled(x, scale=torch.tensor(2.0))
        ref = WritesItsInput()(want, scale=torch.tensor(2.0))
        torch.testing.assert_close(x, want, rtol=0, atol=0)
        torch.testing.assert_close(out, ref, rtol=1e-6, atol=1e-6)
    return compiled


def zoo_artifact(directory, name: str):
    """(path, case): the zoo case ``name`` exported to ``directory``/NAME.pt2b, the case keeping a copy of
    its model as exported (``case.pristine``: eager from the exported state, every call)."""
    import copy

    from exporter import export_model
    from tools.corpus.zoo import make_case

    case = make_case(name)
    case.pristine = copy.deepcopy(case.model)
    path = directory / f"{name}.pt2b"
    export_model(case.model, case.args, path, kwargs=case.kwargs, dynamic_shapes=case.dynamic_shapes)
    return path, case


def zoo_artifacts(directory):
    """zoo_artifact of each name asked for, exported once into ``directory`` (a module fixture's)."""
    made: dict = {}

    def get(name: str):
        if name not in made:
            made[name] = zoo_artifact(directory, name)
        return made[name]

    return get


def buffers_carry_from_call_to_call(backend: str, path, case):
    """The zoo's ``buffer_mutation`` (``path``, ``case``: zoo_artifact) handed to ``backend``: three calls
    give what three eager calls give, its counter and moving average carried. Returns the Compiled and
    the eager model as the three calls left it."""
    import copy

    from exporter import backends, load_for_backend

    compiled = backends.to_backend(load_for_backend(path, backend=backend, cache=False))
    assert sorted(compiled.state) == ["count", "ema"]
    eager = copy.deepcopy(case.pristine)
    for _ in range(3):
        with torch.no_grad():
            torch.testing.assert_close(compiled(*case.args), eager(*case.args), rtol=1e-4, atol=1e-4)
    assert int(compiled.state["count"]) == 3
    torch.testing.assert_close(compiled.state["ema"], eager.ema, rtol=1e-4, atol=1e-4)
    return compiled, eager


class CountsFromFive(torch.nn.Module):
    """A buffer the program writes whose exported value is not zero (a counter at 5, positions 5, 6, 7)."""

    def __init__(self):
        super().__init__()
        self.register_buffer("count", torch.arange(3.0) + 5)

    def forward(self, x):
        self.count.add_(x)
        return self.count * 2


def state_starts_from_the_programs_values(backend: str, tmp_path):
    """CountsFromFive handed to ``backend``, validated (a backend that holds the state is checked on a
    runtime of its own), then called three times: each call gives what eager's gives, the first from the
    buffer's exported value. Returns the Compiled."""
    from exporter import backends, export_model, load_for_backend

    path = tmp_path / f"from-five-{backend}.pt2b"
    export_model(CountsFromFive(), (torch.ones(3),), path)
    compiled = backends.to_backend(load_for_backend(path, backend=backend, cache=False))
    assert compiled.validation.status == "passed", compiled.validation.describe()
    eager = CountsFromFive()
    for step in range(3):
        x = torch.full((3,), float(step + 1))
        torch.testing.assert_close(compiled(x), eager(x), rtol=0, atol=0)
    return compiled


def export_decoder_case(path) -> None:
    """tools.corpus.methods.decoder_case (a tiny Llama with seeded weights in transformers' static-cache
    export wrapper), its prefill and decode exported into one artifact at ``path``."""
    from exporter import export_model
    from tools.corpus.methods import decoder_case

    case = decoder_case()
    export_model({name: case.export(name) for name in case.methods}, path)


def generates_what_transformers_generates(backends_: tuple[str, ...], tmp_path, exported: bool = False) -> None:
    """export_decoder_case's artifact (``exported``: already at tmp_path/llama.pt2b), handed to each of
    ``backends_`` with its methods on one state (to_backend_methods): greedy tokens equal transformers'
    own generate()."""
    from exporter import backends, load_for_backend
    from tools.corpus.methods import decoder_case

    case = decoder_case()
    if not exported:
        export_decoder_case(tmp_path / "llama.pt2b")
    llama = case.model.model  # the LlamaForCausalLM inside the wrapper
    expected = llama.generate(case.prompt, max_new_tokens=case.n_new, do_sample=False,
                              cache_implementation="static")[0, case.prompt.shape[1]:].tolist()
    assert len(set(expected)) > 1
    for backend in backends_:
        compiled = backends.to_backend_methods(load_for_backend(tmp_path / "llama.pt2b", backend=backend, cache=False))
        assert case.generate(lambda name, args, kwargs: compiled[name](*args, **kwargs)) == expected, backend


def tiny_llama(layers: int = 2, padded: int | None = None):
    """(a transformers Llama with random weights, its input_ids, its attention mask) at batch 2, length 7;
    ``padded``: that many leading positions of the second row masked (left padding: those rows attend to
    nothing, as a padded batch's do)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=layers,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64, use_cache=False)
    ids, mask = torch.randint(0, 64, (2, 7)), torch.ones(2, 7, dtype=torch.long)
    if padded:
        mask[1, :padded] = 0
    return LlamaForCausalLM(config).eval(), ids, mask


class _Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin, self.norm = torch.nn.Linear(16, 16), torch.nn.LayerNorm(16)

    def forward(self, x):
        return self.norm(torch.nn.functional.gelu(self.lin(x)) + x)


class LayerStack(torch.nn.Module):
    """``n`` identical blocks (Linear, GELU, residual, LayerNorm): what the engine that lowers repeated
    layers once reuses."""

    def __init__(self, n=4):
        super().__init__()
        self.blocks = torch.nn.ModuleList(_Block() for _ in range(n))

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return x


ENGINES = ("node by node", "whole program", "reuse")


def force_engine(name: str, monkeypatch) -> None:
    """Force one lowering engine of ENGINES: node by node, the whole-program retrace, or repeated layers
    lowered once."""
    from exporter.lowering import engines
    from exporter.lowering.engines import local

    if name != "reuse":
        monkeypatch.setattr(engines, "lower_with_reuse", lambda ep, decompose: None)
    if name == "whole program":
        monkeypatch.setattr(local, "lower_locally", lambda *a, **k: None)


def file_naming_pytree_type(tmp_path, monkeypatch, type_name: str):
    """A file whose output is a dataclass registered with torch's pytree as ``type_name``, then forgotten by
    pytree (as in a process that never imported its library): its path."""
    import dataclasses

    from exporter import export_model

    @dataclasses.dataclass
    class Out:
        a: torch.Tensor

    pytree.register_dataclass(Out, serialized_type_name=type_name)

    class M(torch.nn.Module):
        def forward(self, x):
            return Out(x + 1)

    path = tmp_path / "o.pt2b"
    export_model(M(), (torch.randn(2),), path)
    monkeypatch.delitem(pytree.SERIALIZED_TYPE_TO_PYTHON_TYPE, type_name)
    return path


class CheckedIds(torch.nn.Module):
    """``torch._check`` of a bool read from a tensor: torch.export records ``sym_ite(ids_ok.item(), 1, 0)``
    (a Python function), as it does for transformers' data-dependent checks (its vision-language models')."""

    def forward(self, x, ids):
        torch._check((ids >= 0).all().item())
        return x * 2 + ids.sum()


class CheckedRows(torch.nn.Module):
    """A check torch.export records with ``torch.sym_not``: the rows a mask picks are not none (smolvlm's
    and idefics' image rows)."""

    def forward(self, x, mask):
        rows = x[mask]
        torch._check(torch.sym_not(rows.shape[0] == 0))
        return rows * 2


class CheckedCount(torch.nn.Module):
    """Checks torch.export records with ``torch.sym_not`` and ``|`` on a count summed from a tensor."""

    def forward(self, x, counts):
        k = counts.sum().item()
        torch._check(k <= x.shape[0])
        torch._check(torch.sym_not(k == 3))
        torch._check((k == 0) | (k > 1))
        return x[:k] + 1


class PlacedFeatures(torch.nn.Module):
    """omniasr's placeholder check: the features fill the places a token marks, their count checked
    against the features' size, which the program's shapes then fix (torch.export records the range
    checks of that count as ``8 >= 8``)."""

    def forward(self, x, ids, features):
        mask = (ids == 7).unsqueeze(-1).expand_as(x)
        torch._check(x[mask].numel() == features.numel())
        return x.masked_scatter(mask, features)


def placed_features_args():
    return torch.randn(2, 5, 4), torch.tensor([[7, 1, 7, 2, 3], [1, 1, 1, 1, 1]]), torch.randn(2, 4)


class NoGrad(torch.nn.Module):
    """A no_grad region, whose grad-mode markers (torch._C._set_grad_enabled calls) pt2b keeps."""

    def forward(self, x):
        with torch.no_grad():
            y = x.sin()
        return y * 2 + x


def _taken_only_as_ops(backend: str, model, args, path, monkeypatch, holds) -> object:
    """``model`` exported to ``path`` and lowered for ``backend``, whose program ``holds`` (a test of its
    graph's nodes): refused without exporter/backends/sym_ops.py's rewrite, then handed over (checked by
    a run where the backend runs on this system); the caller's program keeps every node as it was after
    both hand-offs (an importer once rewrote it). Returns the Compiled."""
    from exporter import backends, export_model, load_for_backend
    from exporter.backends import sym_ops
    from exporter.errors import BackendHandOffError

    import pytest

    export_model(model, args, path)
    lowered = load_for_backend(path, backend=backend, cache=False)
    nodes = lambda: list(lowered.exported_program().graph.nodes)  # noqa: E731
    assert holds(nodes())
    before = [(n.name, n.target, n.args) for n in nodes()]
    with monkeypatch.context() as m:
        m.setattr(sym_ops, "ops_only", lambda ep: ep)
        with pytest.raises(BackendHandOffError, match="could not take the program"):
            backends.to_backend(lowered)
    # the same lowered program handed over again after that failure (which left the symbols its trace read
    # from tensors pending in the program's shape environment, until the hand-off restores them)
    compiled = backends.to_backend(lowered)
    assert compiled.validation.status == ("passed" if compiled.backend.runs_here else "skipped")
    assert [(n.name, n.target, n.args) for n in nodes()] == before
    return compiled


def a_grad_mode_region_is_taken(backend: str, tmp_path, monkeypatch):
    """The hand-off leaves the lowered program's grad-mode markers out for ``backend`` (they change no
    value), which refuses them as Python calls; the caller's program keeps them."""
    marked = lambda nodes: sum(getattr(n.target, "__name__", "") == "_set_grad_enabled" for n in nodes) == 2  # noqa: E731
    return _taken_only_as_ops(backend, NoGrad(), (torch.randn(3, 4),), tmp_path / "no_grad.pt2b", monkeypatch, marked)


def a_check_of_a_value_is_taken(backend: str, tmp_path, monkeypatch):
    """The hand-off gives ``backend`` the program's sym_ite of a value read from a tensor as ATen ops,
    which it refuses without; the caller's program keeps its sym_ite."""
    ite = lambda nodes: any(n.target is torch.sym_ite for n in nodes)  # noqa: E731
    return _taken_only_as_ops(backend, CheckedIds(), (torch.randn(3), torch.tensor([1, 2])),
                              tmp_path / "checked.pt2b", monkeypatch, ite)


def model_output_built_out_of_field_order():
    """A module returning transformers' ModelOutput with its keys set in another order than its fields
    (as AyaVision's vision tower sets ``pooler_output`` after ``hidden_states``), and its input."""
    import dataclasses

    from transformers.utils import ModelOutput

    @dataclasses.dataclass
    class Out(ModelOutput):
        first: torch.Tensor = None
        second: torch.Tensor = None
        third: torch.Tensor = None

    class OutOfOrder(torch.nn.Module):
        def forward(self, x):
            out = Out(first=x + 1)
            out["third"] = x.sum(0)
            out["second"] = x * 2
            return out

    return OutOfOrder(), (torch.randn(3, 4),)


def an_output_class_comes_back_as_built(backend: str):
    """``backend`` runs a program returning a ModelOutput built out of its fields' order and gives each
    key its own value: the hand-off gives the backend plain containers (a retrace that rebuilds the
    class reorders the graph's outputs under the program's structure) and restores the structure."""
    import pytest

    from exporter import backends

    pytest.importorskip("transformers")
    model, args = model_output_built_out_of_field_order()
    ep = torch.export.export(model, args)
    compiled = backends.to_backend(backend, ep)
    got, want = compiled(*args), model(*args)
    assert list(want.keys()) == ["first", "third", "second"] and sorted(got.keys()) == sorted(want.keys())
    for key in want.keys():
        torch.testing.assert_close(got[key], want[key])
    return compiled


class CausalConvs(torch.nn.Module):
    """Two causal 1-d convolutions padded as Mimi's and Pocket TTS's are: kernel size, stride and
    padding kept in buffers, the extra padding computed from them and read as numbers (``F.pad`` takes
    ints): each read an unbacked symbol of the program."""

    SIZES = ((5, 2), (3, 1))

    def __init__(self):
        super().__init__()
        self.convs = torch.nn.ModuleList(torch.nn.Conv1d(4, 4, k, stride=s) for k, s in self.SIZES)
        for i, (k, s) in enumerate(self.SIZES):
            self.register_buffer(f"kernel_{i}", torch.tensor(k), persistent=False)
            self.register_buffer(f"stride_{i}", torch.tensor(s), persistent=False)
            self.register_buffer(f"padding_{i}", torch.tensor(k - s), persistent=False)

    def forward(self, x):
        for i, conv in enumerate(self.convs):
            k, s, p = (getattr(self, f"{name}_{i}") for name in ("kernel", "stride", "padding"))
            length = x.shape[-1]
            frames = torch.ceil((length - k + p) / s + 1).to(torch.int64) - 1
            x = conv(torch.nn.functional.pad(x, (p, frames * s + k - p - length)))
        return x
