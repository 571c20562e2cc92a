"""Runtime: the reference executor of a lowered torch.export program on cpu or cuda.
Owns construction (opset check, state, plan, input checks) and the per-call path that ties them."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import torch
from torch.export.graph_signature import InputKind

from exporter.shared import autocast_devices, call_nodes, count_calls, dims, has_regions, preserved

from .inputs import InputChecker
from .opset import Acceptor, check_device_kernels, check_program_ops
from .outputs import OutputHandler
from .plan import Plan
from .regions import RegionGuard
from .state import RuntimeState

if TYPE_CHECKING:
    from exporter import LoweredProgram, Pt2bProgram
    from exporter.shared import OpSpec

__all__ = ["Runtime", "runtimes"]


def _program(program):
    """(what to plan from, where it came from, why not from the table): a program load() returned
    is planned straight from its graph table where table_program reads it (no ExportedProgram is
    built), anything else from its ExportedProgram."""
    if isinstance(program, torch.export.ExportedProgram):
        return program, "exported_program", "an ExportedProgram was given"
    from .table_program import from_table  # (imports torch.export's serializer, and with it torch._dynamo)

    table, why = from_table(program)
    if table is not None:
        return table, "table", None
    return _exported_program(program), "exported_program", why


def _exported_program(program) -> torch.export.ExportedProgram:
    if isinstance(program, torch.export.ExportedProgram):
        return program
    getter = getattr(program, "exported_program", None)
    if callable(getter):
        ep = getter()
        if isinstance(ep, torch.export.ExportedProgram):
            return ep
    raise TypeError(f"Runtime needs a torch.export.ExportedProgram or an object with an exported_program() "
                    f"method returning one, got {type(program).__name__}")


def _device(device) -> torch.device:
    d = torch.device(device)
    if d.type not in ("cpu", "cuda"):
        raise ValueError(f"the reference runtime runs on 'cpu' or 'cuda', not {str(d)!r}")
    if d.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError("device 'cuda' asked for, but CUDA is not available in this process")
        if d.index is None:
            d = torch.device("cuda", torch.cuda.current_device())
    return d


class Runtime:
    """Run a lowered (functional) program: `Runtime(program, device="cpu")(*args, **kwargs)`.

    Everything is decided at construction: the opset check (one OpsetError listing every refused
    op), the state moved to `device`, the execution plan. A call only checks its inputs, runs the
    planned steps without autograd, writes back mutated buffers and returns the outputs.

    A program `exporter.load` returned is planned straight from the artifact's graph table, with no
    fx graph, fake tensor or ExportedProgram built (`planned_from == "table"`); one the table plan
    does not read (control flow, regions, input sizes recorded as expressions: `not_from_table` says why), a lowered
    program and an ExportedProgram are planned from their ExportedProgram. Both plans run alike.

    Grad-mode and autocast regions of the program (no_grad/enable_grad/autocast in model code) run as
    torch's GraphModule runs them (regions.py); the caller's grad mode and autocast state are the same
    after a call as before, also when it raises, and outputs never carry autograd history.

    A program recorded on one device type runs on another (captured and lowered on the CPU, run with
    `device="cuda"`): every device baked into it follows `device`, a `view` runs as a `reshape` (the
    other device's kernels may lay values out otherwise), a moved autocast region's dtype assertions
    are dropped (each device type has its own autocast policy) and prims get their CPU scalars
    expanded (graphs.py). Inputs must be on `device`.
    """

    @preserved()
    def __init__(self, program: LoweredProgram | torch.export.ExportedProgram, device: str | torch.device = "cpu",
                 opset: Iterable[OpSpec] | None = None, extra_ops: Iterable[OpSpec] = (), *,
                 _shared: dict | None = None) -> None:
        ep, self.planned_from, self.not_from_table = _program(program)
        self.device = _device(device)
        check_program_ops(ep.graph_module, Acceptor(opset, extra_ops))
        check_device_kernels(ep.graph_module, self.device)
        user_inputs = [s.arg.name for s in ep.graph_signature.input_specs if s.kind == InputKind.USER_INPUT]
        self._ops = count_calls(call_nodes(ep.graph_module))
        self._state = RuntimeState(ep, self.device, _shared)
        self._outputs = OutputHandler(ep, self._state.named, user_inputs)
        self._inputs = InputChecker(ep, self.device, dims.names_of(program))
        self.plan = Plan(ep.graph_module, user_inputs, self._state.by_placeholder, self.device)
        self._run = self.plan.run
        if has_regions(ep.graph_module):
            autocast = autocast_devices(ep.graph_module)
            self._run = RegionGuard(autocast | {self.device.type} if autocast else ()).wrap(self.plan.run)

    @preserved(full=False)
    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Run the program on ``args``/``kwargs`` (checked against the program's inputs)."""
        leaves = self._inputs(args, kwargs)
        grad = torch.is_grad_enabled()
        torch._C._set_grad_enabled(False)  # the switch, not torch.no_grad()'s context manager: every call takes this path
        try:
            return self._outputs(self._run(leaves), leaves)
        finally:
            torch._C._set_grad_enabled(grad)

    def ops(self) -> dict[str, int]:
        """Call target name ('aten::add.Tensor', 'higher_order::cond', 'operator.getitem') -> call
        sites, over the graph and all its subgraphs."""
        return dict(self._ops)

    def state_dict(self) -> dict[str, torch.Tensor]:
        """The runtime's current parameters and buffers (persistent or not), by qualified name."""
        return dict(self._state.named)

    def __repr__(self) -> str:
        return f"Runtime({len(self.plan.steps)} steps, {sum(self._ops.values())} calls, device={self.device})"


def runtimes(program: LoweredProgram | Pt2bProgram | torch.export.ExportedProgram, device: str | torch.device = "cpu",
             opset: Iterable[OpSpec] | None = None, extra_ops: Iterable[OpSpec] = ()) -> dict[str, Runtime]:
    """A Runtime for every method of ``program`` (what ``load`` or ``load_for_backend`` returned for a
    multi-method artifact; ``.methods``), by name, over ONE state: parameters are moved once, and
    every buffer is copied once and shared, so a buffer one method writes (a KV cache ``prefill``
    fills) is what the next method reads (``decode`` continues the same sequence), as the methods of
    the eager model share it. The loaded programs themselves are never written to."""
    methods = getattr(program, "methods", None) or {"forward": program}
    shared: dict = {}
    return {name: Runtime(p, device, opset, extra_ops, _shared=shared) for name, p in methods.items()}
