"""What one run of an exported program's graph costs on this CPU: the work it does (program_work: matmul-like
FLOPs per dtype, bytes moved) and this machine's measured rates (rates) that turn that work into seconds."""

from __future__ import annotations

import dataclasses
import time
from collections import defaultdict

import torch
from torch.utils.flop_counter import FlopCounterMode, flop_registry

from .._torch.compat import hinted_expressions
from .._torch.pytree import pytree
from .._torch.dispatch import HigherOrderOperator, OpOverload
from ..graph_walk import attr_of, subgraph_of

__all__ = ["FRESH_BYTES", "Rates", "Work", "estimated_run_seconds", "program_work", "rates"]

# the placeholders a run reads from the program's own state, once per run
_STATE_KINDS = ("PARAMETER", "BUFFER", "CONSTANT_TENSOR")
_COMPOSITE = torch.DispatchKey.CompositeImplicitAutograd


@dataclasses.dataclass(frozen=True)
class Rates:
    """This machine's speeds: FLOPs per second of a matmul per dtype, bytes per second of a memory copy."""

    flops_per_s: dict
    bytes_per_s: float
    # bytes of weight per second a product of a few rows by a weight reads, per dtype: what a model at
    # a small batch spends its time on (a CPU without a fast kernel for a half-precision dtype converts
    # each weight it reads, far below the copy rate)
    weight_bytes_per_s: dict = dataclasses.field(default_factory=dict)
    measure: bool = False  # (rates()) a dtype's rates are measured when first asked for
    # bytes per second an op writes into a new output of FRESH_BYTES or more: memory that size is mapped
    # for each output and returned when it is freed (the C allocator's rule), so every page is faulted in
    # anew, several times slower than a copy into memory already mapped; measured when first asked for
    fresh_bytes_per_s: list = dataclasses.field(default_factory=list)

    def fresh_rate(self) -> float:
        """Bytes per second an op writes into a new output of FRESH_BYTES or more."""
        if not self.fresh_bytes_per_s:
            rate = self.bytes_per_s
            if self.measure:
                rate = min(rate, max(_fresh_rate(time.perf_counter() + _CALIBRATION_S / 3), _FLOOR["fresh"]))
            self.fresh_bytes_per_s.append(rate)
        return self.fresh_bytes_per_s[0]

    def flops_rate(self, dtype: torch.dtype) -> float:
        """FLOPs per second for ``dtype``; a dtype not measured runs at float32's rate."""
        self._measured(dtype)
        return self.flops_per_s.get(dtype) or self.flops_per_s[torch.float32]

    def weight_rate(self, dtype) -> float:
        """Weight bytes per second for ``dtype``; a dtype not measured reads at float32's rate, else the copy's."""
        self._measured(dtype)
        return self.weight_bytes_per_s.get(dtype) or self.weight_bytes_per_s.get(torch.float32) or self.bytes_per_s

    def _measured(self, dtype) -> None:
        if self.measure and dtype in _MEASURED and dtype not in self.flops_per_s:
            share = _CALIBRATION_S / 3  # (each measurement its own share, from its own start)
            try:  # (a reading below the floor is a busy moment, not the machine)
                rate = _matmul_rate(dtype, time.perf_counter() + share)
                if rate < _RETRY_BELOW * _FLOOR["flops", dtype]:  # (near the floor: most often busy too, once more)
                    rate = max(rate, _matmul_rate(dtype, time.perf_counter() + share))
                self.flops_per_s[dtype] = max(rate, _FLOOR["flops", dtype])
                self.weight_bytes_per_s[dtype] = max(_weight_rate(dtype, time.perf_counter() + share), _FLOOR["weights"])
            except RuntimeError:  # a dtype this build cannot multiply runs at float32's rate
                self.flops_per_s[dtype] = None


@dataclasses.dataclass(frozen=True)
class Work:
    """What one run of a graph does: matmul-like FLOPs per dtype, bytes written and state read, and the
    number of call nodes left out (their sizes or their formula could not be had)."""

    flops: dict
    bytes: int
    unknown: int = 0
    state_bytes: dict = dataclasses.field(default_factory=dict)  # dtype -> bytes of the weights read (once)
    # the names of the call nodes that do FLOPs, and of those left out (what a check computing values
    # from the program's inputs stays clear of: op_checks)
    heavy: frozenset = frozenset()
    fresh_bytes: int = 0  # bytes written into outputs of FRESH_BYTES or more (not in ``bytes``)

    def seconds(self, rates: Rates) -> float:
        """The run's time at ``rates``: each dtype's FLOPs at its rate plus the bytes at the copy rate (at
        the fresh-memory rate for large outputs)."""
        return (sum(f / rates.flops_rate(d) for d, f in self.flops.items()) + self.bytes / rates.bytes_per_s
                + (self.fresh_bytes / rates.fresh_rate() if self.fresh_bytes else 0.0)
                + sum(b / rates.weight_rate(d) for d, b in self.state_bytes.items()))


class _Unknown(Exception):
    """A size with neither a given value nor a hint."""


def program_work(program, sizes=None) -> Work:
    """The work of one run of ``program`` (an ExportedProgram or a GraphModule). FLOPs come from torch's
    own formulas (torch.utils.flop_counter), bytes from each call's tensor outputs (views move none) and
    the parameters, buffers and constants it reads (once each). A symbolic size takes its value from
    ``sizes`` (sympy symbol or its name -> int), else the size torch.export saw; a node whose work cannot
    be had is left out and counted in ``Work.unknown``. Never raises on a node."""
    gm = getattr(program, "graph_module", program)
    state = set()
    signature = getattr(program, "graph_signature", None)
    for spec in getattr(signature, "input_specs", ()):
        if spec.kind.name in _STATE_KINDS and hasattr(spec.arg, "name"):
            state.add(spec.arg.name)
    walk = _Walk({str(k): int(v) for k, v in (sizes or {}).items()})
    walk.graph(gm, state)
    return Work({d: f for d, f in walk.flops.items() if f}, walk.bytes, walk.unknown,
                state_bytes=dict(walk.state_bytes), heavy=frozenset(walk.heavy), fresh_bytes=walk.fresh_bytes)


def estimated_run_seconds(program, sizes=None) -> float:
    """Seconds one run of ``program`` should take on this machine: ``program_work`` at ``rates()``."""
    return program_work(program, sizes).seconds(rates())


class _Walk:
    def __init__(self, sizes: dict[str, int]):
        self.sizes = sizes
        self.flops: dict = defaultdict(int)
        self.bytes = 0
        self.fresh_bytes = 0
        self.unknown = 0
        self.heavy: set = set()
        self.state_bytes: dict = defaultdict(int)
        # FLOPs of a composite op per (op, argument shapes): repeated layers run its decomposition once
        self.composite_flops: dict = {}

    def graph(self, gm, state) -> None:
        for node in gm.graph.nodes:
            try:
                if node.op == "placeholder" and node.name in state and node.users:
                    value = node.meta.get("val")
                    if isinstance(value, torch.Tensor):
                        self.state_bytes[value.dtype] += self.nbytes(value)
                elif node.op == "get_attr" and node.users:
                    value = attr_of(gm, node)
                    if isinstance(value, torch.Tensor):
                        self.state_bytes[value.dtype] += value.nbytes
                elif node.op == "call_function":
                    self.call(gm, node)
            except Exception:  # an estimate: a node it cannot price is left out and counted, never raised
                self.unknown += 1
                self.heavy.add(node.name)

    def call(self, gm, node) -> None:
        if isinstance(node.target, HigherOrderOperator):
            # the body runs once per call of the higher-order op (both branches of a cond are counted)
            for arg in node.all_input_nodes:
                body = subgraph_of(gm, arg)
                if body is not None:
                    self.graph(body, ())
            return
        if not isinstance(node.target, OpOverload):
            return  # getitem and symbolic arithmetic: their values are counted where they are made
        schema = node.target._schema
        if "val" not in node.meta:
            if schema.returns:
                raise _Unknown(node.name)
            return
        val = node.meta["val"]
        outputs = val if len(schema.returns) > 1 and isinstance(val, (tuple, list)) else (val,)
        for ret, out in zip(schema.returns, outputs):
            # a view returns an input's memory; an in-place op writes it (into memory mapped already)
            if ret.alias_info is None:
                written = self.nbytes(out)
                if written >= FRESH_BYTES and isinstance(out, torch.Tensor):
                    self.fresh_bytes += written
                else:
                    self.bytes += written
            elif ret.alias_info.is_write:
                self.bytes += self.nbytes(out)
        flops, dtype = self.node_flops(node, val)
        if flops:
            self.flops[dtype] += int(flops)
            self.heavy.add(node.name)

    def node_flops(self, node, val):
        """(FLOPs, the dtype they are done in) of one ATen call."""
        op = node.target
        packet = op.overloadpacket
        composite = packet not in flop_registry and op.has_kernel_for_dispatch_key(_COMPOSITE)
        if packet not in flop_registry and not composite or next(_tensors(val), None) is None:
            return 0, None  # (an op that makes no tensor, such as a size, does no matmul)
        args, kwargs = torch.fx.node.map_aggregate((node.args, node.kwargs), self.concrete)
        dtype = next((a.dtype for a in _tensors((args, kwargs))), None)
        if not composite:
            return flop_registry[packet](*args, **kwargs, out_val=self.concrete(val)), dtype
        # torch keeps formulas for the ops a composite op is made of (linear is addmm, conv2d is
        # convolution, scaled_dot_product_attention is two bmm): run its decomposition on meta tensors
        # and count with torch's own counter, as FlopCounterMode counts an eager run
        key = (op, _key((args, kwargs)))
        try:
            return self.composite_flops[key], dtype
        except KeyError:
            pass
        except TypeError:  # an argument with no stand-in: counted, not remembered
            key = None
        with FlopCounterMode(display=False) as counter:
            op(*args, **kwargs)
        if key is not None:
            self.composite_flops[key] = counter.get_total_flops()
        return counter.get_total_flops(), dtype

    def concrete(self, value):
        """``value`` (a node's argument: an fx Node, a fake tensor, a SymInt) with every size concrete,
        tensors as meta tensors, so a formula or a decomposition computes no data."""
        if isinstance(value, torch.fx.Node):
            value = value.meta["val"]
        if isinstance(value, torch.Tensor):
            return torch.empty(self.shape(value), dtype=value.dtype, device="meta")
        if isinstance(value, (torch.SymInt, torch.SymFloat, torch.SymBool)):
            cast = int if isinstance(value, torch.SymInt) else float if isinstance(value, torch.SymFloat) else bool
            return cast(self.number(value))
        if isinstance(value, torch.device):
            return torch.device("meta")  # a decomposition that allocates does so on meta
        if isinstance(value, (list, tuple)):
            return type(value)(self.concrete(v) for v in value)
        return value

    def shape(self, tensor) -> list[int]:
        return [d if isinstance(d, int) else int(self.number(d)) for d in tensor.shape]

    def nbytes(self, value) -> int:
        if isinstance(value, torch.Tensor):
            n = 1
            for d in self.shape(value):
                n *= d
            return n * value.dtype.itemsize
        if isinstance(value, (list, tuple)):
            return sum(self.nbytes(v) for v in value)
        return 0

    def number(self, sym):
        """A symbolic value made concrete: the given sizes first, then the hints torch.export recorded."""
        node = sym.node
        if not self.sizes:
            hint = getattr(node, "hint", None)
            if hint is not None:
                return hint
        import sympy  # (loaded already: the expression is one)

        expr = node.expr
        hinted = hinted_expressions(getattr(node, "shape_env", None))
        values = {}
        for symbol in expr.free_symbols:
            if symbol.name in self.sizes:
                values[symbol] = sympy.Integer(self.sizes[symbol.name])
            elif symbol in hinted:
                values[symbol] = sympy.sympify(hinted[symbol])
            else:
                raise _Unknown(symbol.name)
        result = expr.xreplace(values)
        if not result.is_number:
            raise _Unknown(str(result))
        return result


def _tensors(tree):
    return (t for t in pytree.tree_leaves(tree) if isinstance(t, torch.Tensor))


def _key(tree):
    """A hashable stand-in for concrete arguments: a tensor by its shape and dtype."""
    if isinstance(tree, torch.Tensor):
        return ("tensor", tuple(tree.shape), tree.dtype)
    if isinstance(tree, (list, tuple)):
        return (type(tree).__name__, *map(_key, tree))
    if isinstance(tree, dict):
        return ("dict", *((k, _key(v)) for k, v in sorted(tree.items())))
    return tree


_RATES: Rates | None = None
# the dtypes whose rates are measured (when a program computes in them); any other runs at float32's
_MEASURED = (torch.float32, torch.bfloat16, torch.float16)
# The least a rate is taken to be: on a CPU another process holds, a calibration's few short runs each
# wait for a time slice and read hundreds of times slower than the machine runs a model; a machine
# slower than these floors (a float32 matmul, a half-precision one without a fast kernel, a copy, a
# product's weight reads) is not one pt2b lowers on
_FLOOR = {("flops", torch.float32): 5e9, ("flops", torch.bfloat16): 2e8, ("flops", torch.float16): 2e8,
          "copy": 2e9, "weights": 2e8, "fresh": 5e8}
# a matmul rate read below this many times its floor is read once more and the faster reading kept: a
# fast machine can read near the floor at a busy moment, and a program's runs are then priced many times
# too long (docs/lowering.md)
_RETRY_BELOW = 4
# an output this large is mapped anew for each op that makes it, and its pages faulted in as they are
# written: glibc's malloc maps any block above its mmap threshold, which grows to at most 32 MiB
FRESH_BYTES = 32 << 20
# the whole calibration's time: each measurement stops at its share, after at least one timed run (on a
# busy CPU a parallel op waits for a time slice, and more runs would only repeat that wait)
_CALIBRATION_S = 0.03


def rates() -> Rates:
    """This machine's rates, measured once per process within a few milliseconds: a matmul per dtype
    (float32, bfloat16, float16) with torch's threads, and a 16 MiB memory copy."""
    global _RATES
    if _RATES is None:
        _RATES = Rates({}, max(_copy_rate(time.perf_counter() + _CALIBRATION_S / 3), _FLOOR["copy"]), {}, measure=True)
        _RATES.flops_rate(torch.float32)
    return _RATES


def _weight_rate(dtype: torch.dtype, deadline: float) -> float:
    # a product of 8 rows by a weight (a decoder's token step), per byte of the weight: 2048 x 2048, larger
    # than the caches as a model's weights are, where a 512 x 512 one says that costs little; else that
    x, w = torch.randn(8, 512).to(dtype), torch.randn(512, 512).to(dtype)
    x @ w
    rate = w.nbytes / _best_of(2, lambda: x @ w, deadline, least=2)
    if 16 * w.nbytes / rate <= 2e-3 and time.perf_counter() < deadline:
        x, w = torch.randn(8, 2048).to(dtype), torch.randn(2048, 2048).to(dtype)
        x @ w
        rate = w.nbytes / _best_of(3, lambda: x @ w, deadline, least=2)
    return rate


def _best_of(runs: int, fn, deadline: float, least: int = 1) -> float:
    """The shortest of up to ``runs`` timings of ``fn`` (the first one warms it up), no more than ``least``
    past ``deadline``."""
    best = float("inf")
    for i in range(runs):
        start = time.perf_counter()
        fn()
        end = time.perf_counter()
        best = min(best, end - start)
        if end > deadline and i + 1 >= least:
            break
    return max(best, 1e-9)


def _matmul_rate(dtype: torch.dtype, deadline: float) -> float:
    # a small product first: a dtype this CPU has no fast kernel for (float16 or bfloat16 on many) is
    # tens of times slower, so the measured size follows its speed and the calibration stays short
    n = 64
    a = torch.randn(n, n).to(dtype)
    a @ a  # (the first product of a dtype may set up its kernel)
    seconds = _best_of(2, lambda: a @ a, deadline)
    # (a product this small is mostly call overhead: grow it to 256 where that costs a few milliseconds)
    while n < 256 and (2 * n) ** 3 / n ** 3 * seconds <= 1e-3 or n == 64 and 64 * seconds <= 5e-3:
        n *= 2
    if n > 64 and time.perf_counter() < deadline:
        a = torch.randn(n, n).to(dtype)
        a @ a  # (each size's first product may set up a kernel of its own)
        seconds = _best_of(3, lambda: a @ a, deadline, least=2)
    else:
        n = 64
    return 2 * n ** 3 / seconds


def _fresh_rate(deadline: float) -> float:
    # bytes per second of an elementwise op writing a new output of 40 MiB (above FRESH_BYTES): the
    # allocation, its page faults and the write, as a program's large outputs cost them
    source = torch.ones(10 << 20, dtype=torch.float32)
    return source.nbytes / _best_of(2, lambda: source.neg(), deadline, least=2)


def _copy_rate(deadline: float) -> float:
    # bytes per second of a copy, counted once per byte copied: the work counts each output byte once
    # (the op that writes it has read about as much). The first copy also maps the target's pages.
    source = torch.ones(16 << 20, dtype=torch.uint8)  # touched, so its pages are real memory
    target = torch.empty_like(source)
    return source.nbytes / _best_of(3, lambda: target.copy_(source), deadline, least=2)
