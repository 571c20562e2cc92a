"""Pt2bProgram: what `load` returns; a callable program plus everything the artifact recorded."""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from .errors import ArtifactError, CorruptArtifactError, MethodNotFoundError, MissingKernelError
from .lazy import Lazy
from .lifted import finite_int
from .util.process_state import preserved


@dataclasses.dataclass(frozen=True)
class OperatorInfo:
    """One operator a program calls, as the artifact's op table records it: its qualified name
    ("aten::add"), overload ("Tensor"), schema string, kind ("aten", "custom", "higher_order", ...)
    and number of call sites."""

    qualified_name: str
    overload: str
    schema: str
    kind: str
    count: int

    @property
    def name(self) -> str:
        """The full name, \"aten::add.Tensor\"."""
        return f"{self.qualified_name}.{self.overload}" if self.overload else self.qualified_name


def _dim_ranges(ep) -> list[tuple[int, int, str, str, int | None, int | None]]:
    """(user input index, dim, input name, symbol, lowest or None, highest or None) of every input dim
    that is a symbol with a recorded range."""
    from torch.export.graph_signature import InputKind

    placeholders = {n.name: n for n in ep.graph.nodes if n.op == "placeholder"}
    users = [s.arg.name for s in ep.graph_signature.input_specs if s.kind == InputKind.USER_INPUT]
    out = []
    for i, name in enumerate(users):
        val = placeholders[name].meta.get("val") if name in placeholders else None
        if not isinstance(val, torch.Tensor):
            continue
        for d, size in enumerate(val.shape):
            if isinstance(size, torch.SymInt) and size.node.expr in ep.range_constraints:
                vr = ep.range_constraints[size.node.expr]
                out.append((i, d, name, str(size.node.expr), finite_int(vr.lower), finite_int(vr.upper)))
    return out


def _check_dynamic_dims(ranges, flat, where) -> None:
    """InputGuardError where a dim of the call's flat inputs is outside its range (``ranges``: _dim_ranges)."""
    from .errors import InputGuardError

    for i, d, name, sym, lo, hi in ranges:
        x = flat[i] if i < len(flat) else None
        if isinstance(x, torch.Tensor) and d < x.dim() and ((lo is not None and x.shape[d] < lo)
                                                          or (hi is not None and x.shape[d] > hi)):
            raise InputGuardError(f"{where}: dim {d} of input {name!r} is {x.shape[d]}, outside the range "
                                  f"[{lo if lo is not None else '-inf'}, {hi if hi is not None else 'inf'}] of its "
                                  f"dynamic dim {sym}.")


class _CallCheck:
    """The checks of a call of ``ep.module()``, each failure a RuntimeInputError naming what was expected
    and what was given, before torch's own checks would raise a ValueError on the inputs' structure, an
    AttributeError on a value where a tensor was exported, or a guard's bare AssertionError: the
    structure, each input's kind and rank, each dynamic dim's range; the module's guards (static sizes,
    derived dims' relations) are InputGuardErrors with torch's text of the condition."""

    def __init__(self, ep, where: str, ranges: list):
        from torch.export.graph_signature import InputKind

        from .shared.call_inputs import leaf_names, positional_names

        self.in_spec, self.where, self.ranges = ep.call_spec.in_spec, where, ranges
        sig = ep.module_call_graph[0].signature if ep.module_call_graph else None
        forward_names = list(getattr(sig, "forward_arg_names", None) or [])
        self.positional = positional_names(self.in_spec, forward_names)
        placeholders = {n.name: n for n in ep.graph.nodes if n.op == "placeholder"}
        vals = [placeholders[s.arg.name].meta.get("val") if getattr(s.arg, "name", None) in placeholders else None
                for s in ep.graph_signature.input_specs if s.kind == InputKind.USER_INPUT]
        self.expected = list(zip(leaf_names(self.in_spec, forward_names), vals))

    def _guard_error(self, condition: str):
        from .errors import InputGuardError

        return InputGuardError(f"{self.where}: the inputs break a condition on input sizes the program was "
                               f"exported with: {condition}.")

    def __call__(self, module, args: tuple, kwargs: dict) -> None:
        """A forward pre-hook (prepended, with kwargs) of the module."""
        if torch.compiler.is_compiling() or torch.compiler.is_exporting():
            return None  # a trace through the module: torch's checks as they are
        from ._torch.compat import check_call_structure, check_module_inputs
        from .errors import RuntimeInputError

        try:
            flat = [x for _, x in check_call_structure(args, kwargs, self.in_spec)]
        except ValueError:
            from .shared.call_inputs import mismatch

            raise RuntimeInputError(f"{self.where}: {mismatch(self.in_spec, self.positional, args, dict(kwargs))}\n"
                                    f"Call it with the inputs it was exported with (`pt2b inspect` lists "
                                    f"them).") from None
        for (name, val), x in zip(self.expected, flat):
            if not isinstance(val, torch.Tensor):
                continue
            want = f"a {str(val.dtype).removeprefix('torch.')} tensor of rank {val.dim()}"
            if not isinstance(x, torch.Tensor):
                raise RuntimeInputError(f"{self.where}: input {name!r} is not a tensor: expected {want}, got "
                                        f"{type(x).__name__} {str(x)[:80]}.")
            if x.dim() != val.dim():
                raise RuntimeInputError(f"{self.where}: input {name!r} has rank {x.dim()} (shape {list(x.shape)}): "
                                        f"expected {want}.")
        _check_dynamic_dims(self.ranges, flat, self.where)
        guards = getattr(module, "_guards_fn", None)  # torch's guard function: run here first to type its failure
        if guards is not None:
            try:
                guards(*flat)
            except AssertionError as e:
                if not str(e).startswith("Guard failed: "):
                    raise
                raise self._guard_error(str(e).removeprefix("Guard failed: ")) from None
        else:  # torch's pre-hook checks the sizes itself: the same check, typed
            try:
                check_module_inputs(module, args, kwargs)
            except RuntimeError as e:
                raise self._guard_error(str(e)) from None
        return None


class ProgramHandle:
    """What every program pt2b hands out shares: the ExportedProgram and a callable module."""

    _ep: torch.export.ExportedProgram
    _module: torch.nn.Module | None = None
    _direct: Any = None  # lifted.DirectCall, False where the program needs ep.module(); built at the first call
    method: str = "forward"  # the method's name ("forward" for a single-method artifact)
    _methods: dict | None = None  # every method of the artifact by name (shared by all of them)
    dim_names: dict = {}  # symbol -> the user's Dim name, as the artifact recorded it (exporter.dims); never mutated

    def exported_program(self) -> torch.export.ExportedProgram:
        """The program as a torch.export ExportedProgram, for existing tools."""
        return self._ep

    def _call_source(self):
        """What a direct call (lifted.DirectCall) runs: the ExportedProgram's graph module and signature."""
        return self._ep

    def module(self) -> torch.nn.Module:
        """The program as an nn.Module (torch's ep.module()), built once. A call of other inputs than it
        was exported with is a RuntimeInputError naming what was expected and what was given, as a call
        of the program is: another structure, a value where a tensor was, another rank, a dynamic dim
        outside its range, a broken condition on sizes (an InputGuardError, an AssertionError too)."""
        if self._module is None:
            try:
                module = self._ep.module()
            except ArtifactError:
                raise
            except Exception as e:  # the program came from a file that passed every check
                raise CorruptArtifactError(
                    f"{getattr(self, 'path', 'program')}: the program cannot be turned into a module "
                    f"({type(e).__name__}: {e}); the artifact is malformed.") from None  # (reader._by_torchs_deserializer)
            from .dims import label

            ranges = [(*r[:3], label(r[3], self.dim_names), *r[4:]) for r in _dim_ranges(self._ep)]
            module.register_forward_pre_hook(_CallCheck(self._ep, self._where(), ranges), prepend=True,
                                             with_kwargs=True)
            self._module = module
        return self._module

    def _label(self) -> str:
        """What an error calls the program: its file."""
        return getattr(self, "path", None) or "the program"

    def _where(self) -> str:
        """The program as an error names it (``_label``), and its method where the file holds several."""
        name = self._label()
        return f"{name} (method {self.method!r})" if self._methods and len(self._methods) > 1 else name

    @preserved()  # full: torch runs the autocast regions itself, and one a raise leaves open has set a dtype
    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Run the program like the model it was captured from. Inputs other than it was exported with
        are a RuntimeInputError naming what was expected and what was given, as runtime_ref says it
        (``module()``: another structure, a value where a tensor was, another rank, a dynamic dim
        outside its range; a broken condition on sizes is an InputGuardError). Until ``module()`` is
        asked for, a call that matches the program's inputs (shapes within their ranges) runs its
        lifted graph directly (lifted.DirectCall: the same kernels, the same writes into the program's state).
        An op this torch has no kernel of for the inputs' device is a MissingKernelError naming it."""
        try:
            return self._call(args, kwargs)
        except NotImplementedError as e:
            if isinstance(e, MissingKernelError):
                raise
            message = self._missing_kernels(args, kwargs)
            if message is None:
                raise
            raise MissingKernelError(f"{self._where()}: {message}") from None

    def _missing_kernels(self, args, kwargs) -> str | None:
        """What missing_kernels says of the program on the device of its first tensor input (or the CPU)."""
        from ._torch.pytree import pytree
        from .shared.kernels import missing_kernels

        leaves = pytree.tree_leaves((args, kwargs))
        device = next((x.device for x in leaves if isinstance(x, torch.Tensor)), torch.device("cpu"))
        return missing_kernels(self._ep.graph_module, device, "torch")

    def _call(self, args: tuple, kwargs: dict) -> Any:
        if self._module is None:
            if self._direct is None:
                from .lifted import DirectCall, Unbindable
                from ._torch.deferred_codegen import compiled

                try:
                    source = self._call_source()
                    self._direct = DirectCall(source)
                except Unbindable:  # (ep.module() runs a copy of the graph: this one's code is not needed)
                    self._direct = False
                else:
                    compiled(source)  # a program read from a file generates its code here, once
            if self._direct:
                out = self._direct(args, kwargs)
                if out is not NotImplemented:
                    return out
        return self.module()(*args, **kwargs)

    @property
    def methods(self) -> dict[str, "ProgramHandle"]:
        """Every method of the artifact by name, the default first (format 1.2 artifacts can hold
        several: ``prog["decode"]``); they share the file's mapped weights."""
        return dict(self._methods or {self.method: self})

    def __getitem__(self, name: str) -> "ProgramHandle":
        """The method ``name`` of the artifact (MethodNotFoundError lists the methods it holds)."""
        try:
            return (self._methods or {self.method: self})[name]
        except (KeyError, TypeError):
            raise MethodNotFoundError(f"{getattr(self, 'path', 'the program')}: no method {name!r}; the artifact holds "
                                      f"{', '.join(self.methods)}.") from None


class Pt2bProgram(ProgramHandle):
    """An undecomposed program loaded from a .pt2b artifact.

    Call it like the model; ``exported_program()`` hands the torch.export form to existing tools.
    """

    def __init__(self, ep, *, path: str, format_version: tuple[int, int], torch_version: str,
                 producer: str, ir_level: str, operators: list[OperatorInfo], metadata: dict,
                 provenance: dict[str, str] | Lazy, lowering: dict | None = None, checked: Lazy | None = None,
                 method: str = "forward", for_call: Lazy | None = None, methods: dict | None = None,
                 dim_names: dict | None = None):
        # an ExportedProgram, or a Lazy building it on first use (load(): the op table and records
        # are read at load, the graph is checked at its first use, before torch's deserializer runs)
        self._built = ep if isinstance(ep, Lazy) else Lazy.of(ep)
        self._checked = checked  # reader.Checked, on first use
        # load(): the lifted graph a first call runs (reader.build_for_call) while no ExportedProgram is built
        self._for_call = for_call
        self.path = path
        self.format_version = format_version
        self.torch_version = torch_version
        self.producer = producer
        self.ir_level = ir_level
        self.operators = operators
        self.metadata = metadata
        self._provenance = provenance if isinstance(provenance, Lazy) else Lazy.of(provenance)
        # format 1.1+: how pt2b lowered this program ({"request", "fingerprint", "torch_version",
        # "outside_opset"}); None for a program not written after load_for_backend
        self.lowering = lowering
        self.method = method
        self._methods = methods  # every method of the artifact by name (a dict its maker fills)
        self.dim_names = dict(dim_names or {})

    @property
    def _ep(self) -> torch.export.ExportedProgram:
        return self._built.get()

    def _call_source(self):
        """The ExportedProgram where it is built; else the lifted graph torch's deserializer builds without
        one (fake values, metadata and the ExportedProgram's checks are what a call does not need, and a
        large part of a first call's cost). A program whose recorded guards a direct call does not
        reproduce goes through the ExportedProgram."""
        if self._for_call is None or self._built.done or self._checked is None or self._checked.get().serialized.guards_code:
            return self._ep
        return self._for_call.get()

    @property
    def provenance(self) -> dict[str, str]:
        """Who wrote the program and what was done to it since (capture, lowering, upgrades: the op
        schema upgrades applied in memory are known once the graph is read, so this reads it)."""
        return self._provenance.get()

    def check(self) -> "Pt2bProgram":
        """Run every check of the file now (load() leaves the graph's to its first use): the FlatBuffer
        walk of the graph, names, targets, expressions, op schemas, state against the signature,
        example inputs, guards. Raises the ArtifactError a first use would; returns self."""
        if self._checked is not None:
            self._checked.get()
        return self

    def needs(self) -> Any:
        """What the file needs of a process to load and run it beyond torch, as the command line's file check prints it
        (a serialize.read.needs.Needs): the Python types of its inputs and outputs that torch does not
        register itself, its custom ops, its tensor-subclass classes (each with where this process finds
        it or what to do: ``missing``), and its ops with kernels for some devices only."""
        from .serialize.read import needs, reader

        return needs.needs_to_load(reader.open_artifact(self.path))

    def ops(self) -> dict[str, int]:
        """Operator (qualified name.overload) -> number of call sites, over all subgraphs."""
        return {op.name: op.count for op in self.operators}

    @property
    def graph_signature(self) -> torch.export.ExportGraphSignature:
        """The program's graph signature (inputs, outputs, parameters, buffers, mutations)."""
        return self._ep.graph_signature

    def __repr__(self) -> str:
        method = f", method {self.method!r} of {len(self.methods)}" if len(self.methods) > 1 else ""
        return (f"Pt2bProgram({self.path!r}{method}, format {self.format_version[0]}.{self.format_version[1]}, "
                f"ir={self.ir_level}, {len(self.operators)} ops, torch {self.torch_version})")
