"""The backends pt2b lowers for, each derived from the installed backend, never from a typed list: the
ops it accepts, the decompositions it applies itself, its version, and its hand-off (docs/backends.md).
``load_for_backend(path, preset=NAME)`` lowers to a backend's own op list; ``to_backend(NAME, lowered)``
hands the result over and returns a ``Compiled``: the backend's own object (``.native``), callable like
the model.

  inductor.py   torch's Inductor / AOTInductor (inside torch)
  onnx.py       torch.onnx with onnxscript's torchlib, run by onnxruntime (pt2b[onnx])
  openvino.py   OpenVINO's PyTorch frontend (convert_model), compiled for its CPU plugin (pt2b[openvino])
  executorch.py ExecuTorch's portable kernels, its runtime's own kernel registry (pip install executorch)
  iree.py       IREE through iree-turbine, its own AOT table, compiled for llvm-cpu (pip install iree-turbine ...)
  tvm.py        Apache TVM's Relax importer, compiled for llvm, run by its Relax VM (pip install apache-tvm)
  stablehlo.py  StableHLO through torchax's exporter, run by JAX on the CPU (pip install torchax jax[cpu])
  torch_mlir.py torch-mlir's FX importer to linalg, run through MLIR's execution engine (pip install torch-mlir)
  litert.py     LiteRT (litert-torch's converter to a TFLite flatbuffer, run by ai-edge-litert's interpreter)
  coreml.py     Core ML (coremltools converts to an ML program; it runs only on macOS, so here its spec is checked)
  calling.py    the program's calling convention around a backend's runner
  state.py      the buffers a program writes lifted to inputs and outputs, carried between calls (Compiled.state)
  library_tables.py  the conversion tables transformers' exporters keep for onnx and openvino, read from it
  validation.py the hand-off check: the backend's outputs against the program's own run
  partition.py  a program split between a backend and the reference (to_backend(..., fallback="reference"))
  sym_ops.py    a program's Python calls (a choice by a bool read from a tensor, grad mode) as ATen ops or
                left out, for backends taking ops only
  program_copy.py  a program's graph copied for a hand-off to rewrite, its nodes' names kept
  complex_views.py a view of a complex tensor as the same view of its real pairs (for ONNX)
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import logging
import os
import re
from typing import TYPE_CHECKING, Any, Callable

from ..errors import BackendHandOffError, BackendResultError, BackendStateError, BackendUnavailableError, Pt2bError

if TYPE_CHECKING:
    from collections.abc import Mapping

    import torch

    from ..lowering.lowered import LoweredProgram

__all__ = ["Backend", "Compiled", "get", "names", "to_backend", "to_backend_methods"]

# backend name -> (module of this package, what to pip install when it is missing)
ADAPTERS: dict[str, tuple[str, str]] = {
    "inductor": ("inductor", "torch"),
    "onnx": ("onnx", "pt2b[onnx]"),
    "openvino": ("openvino", "pt2b[openvino]"),
    "executorch": ("executorch", "pt2b[executorch]"),
    "iree": ("iree", "pt2b[iree]"),
    "tvm": ("tvm", "pt2b[tvm]"),
    "stablehlo": ("stablehlo", "pt2b[stablehlo]"),
    "torch_mlir": ("torch_mlir", "pt2b[torch-mlir]"),
    "litert": ("litert", "pt2b[litert]"),
    "coreml": ("coreml", "pt2b[coreml]"),
}


@dataclasses.dataclass(frozen=True)
class Backend:
    """An installed backend as pt2b reads it (``get(name)``): its version, the ops it accepts, its own
    decompositions and its hand-off; ``key`` ("onnx@0.7.2+ort1.32.0") names it in caches and records."""

    name: str
    version: str                      # the installed backend's version
    supported_ops: tuple[str, ...]    # from the installed backend's own registry
    source: str                       # where in the backend the list comes from
    decompositions: Callable[[], dict]  # the backend's own decompositions (op -> fn), used before torch's
    hand_off: Callable[..., tuple]    # (ExportedProgram, **options) -> (native object, the program it took[, plan])
    run: Callable[..., Any]           # (native, program, args, kwargs[, plan=]) -> the program's outputs, structured
    settings: str = ""                # what matters when running it (docs/backends.md repeats it)
    # True: ``decompositions`` is the backend's whole table and it takes every op that table leaves (it
    # re-runs the table itself, as OpenVINO's convert_model does); supported_ops then lists the ops it names
    takes_what_its_table_leaves: bool = False
    # True: an op that no decomposition brings to supported_ops is taken as it is, run by its ATen kernel
    # (Inductor's implicit fallbacks); supported_ops then lists what it lowers itself
    falls_back_to_aten: bool = False
    # True: the buffers a program writes live in the backend's runtime and carry from call to call
    # (ExecuTorch's mutable buffers); False: the backend holds them as constants, and takes them lifted
    # to inputs and outputs, which the Compiled carries (state.py)
    holds_state: bool = False
    # False: the backend cannot take a program whose state comes in as inputs and goes out as outputs; a
    # program that writes its buffers is then refused before any backend work
    takes_lifted_state: bool = True
    # (native) -> plan: the backend's runtime loaded afresh from its own object, its state the program's own;
    # where it holds state, the hand-off check runs on such a copy and leaves the caller's untouched
    load: Callable[[Any], Any] | None = None
    save: Callable[..., None] | None = None  # (Compiled, path): the backend's own file, read by its own runtime
    file_suffix: str = ""  # that file's usual suffix
    runs_here: bool = True  # False: its runtime is not on this system (Core ML off macOS): nothing runs it here
    # True: its importer converts ops only, no Python call on numbers or grad mode in a graph; the hand-off
    # gives it those calls as ops or leaves them out (sym_ops.py)
    takes_ops_only: bool = False

    @property
    def key(self) -> str:
        """The backend's name and installed version, "name@version"."""
        return f"{self.name}@{self.version}"


@dataclasses.dataclass
class Compiled:
    """What ``to_backend`` returns: the backend's own object (``native``: an ONNXProgram, an AOTInductor
    package path, ...) and the program it was made from; calling it runs it on the backend, with the
    exported model's arguments and output structure."""

    backend: Backend
    native: Any
    program: Any  # the torch.export.ExportedProgram the backend took
    plan: Any = None  # what the adapter's run needs beside them (the loaded runtime module; OpenVINO: its results' names)
    validation: Any = None  # validation.HandOffValidation: the outputs compared with the program's (None: not run)
    dim_names: dict = dataclasses.field(default_factory=dict)  # torch's symbol -> the user's Dim name (files name dims so)
    share: Any = None  # partition.Share: what the backend runs of a program split with the reference (fallback=)
    carry: Any = None  # state.Carry: the written buffers passed in and stored back at every call (None: none)
    write_back: Any = None  # state.WriteBack: the program's writes into its inputs, made after every call

    @property
    def state(self) -> Mapping[str, torch.Tensor] | None:
        """The buffers the program writes (a KV cache, running statistics), by qualified name, as they
        stand after the last call: a read-only mapping (``state.State``) that every call passes to the
        backend and updates; None where pt2b carries no state (the program writes none, the backend holds
        it in its runtime, or ``frozen_state=True`` made it constants)."""
        return None if self.carry is None else self.carry.state

    def reset_state(self) -> None:
        """Every carried buffer back to the program's own value, for a new sequence (shared with the other
        methods handed over on the same state)."""
        if self.carry is not None:
            self.carry.state.reset()

    def save(self, path: str | os.PathLike) -> str:
        """Write the backend's own file (``m.onnx``, ``m.pte``, ``m.vmfb``, OpenVINO's ``m.xml``, an
        AOTInductor ``m.pt2``), which the backend's own runtime loads with no pt2b installed; returns
        its path."""
        if self.share is not None:
            raise BackendHandOffError(f"the program runs split between {self.backend.key} and the reference "
                                      f"(fallback=), and no one file of {self.backend.name}'s holds both: save "
                                      f"the .pt2b and hand it over where it runs.")
        if self.backend.save is None:
            raise BackendHandOffError(f"{self.backend.key} has no file of its own that pt2b writes.")
        path = os.fspath(path)
        self.backend.save(self, path)
        return path

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Run the program on the backend with the exported model's arguments; its outputs, structured."""
        extra = {"plan": self.plan} if self.plan is not None else {}
        run = lambda a, k: self.backend.run(self.native, self.program, a, k, **extra)  # noqa: E731
        holder = getattr(self.plan, "holder", None)  # (the backend's runtime holding the state: state.State.hold)
        carried = run if self.carry is None else (lambda a, k: self.carry.call(run, a, k, holder))
        return carried(args, kwargs) if self.write_back is None else self.write_back.call(carried, args, kwargs)

    def __repr__(self) -> str:
        return f"Compiled({self.backend.key}, {type(self.native).__name__})"


def names() -> tuple[str, ...]:
    """The names of the backends pt2b knows, installed or not."""
    return tuple(ADAPTERS)


def get(name: str) -> Backend:
    """The installed backend ``name`` (BackendUnavailableError naming the pip package when it is not)."""
    if name not in ADAPTERS:
        from ..util.closest import did_you_mean

        raise BackendUnavailableError(f"unknown backend {name!r};{did_you_mean(str(name), ADAPTERS)} pt2b knows "
                                      f"{', '.join(ADAPTERS)}.")
    module, package = ADAPTERS[name]
    return _get(name, module, package)


_CACHE: dict[str, Backend] = {}


def _get(name: str, module: str, package: str) -> Backend:
    if name not in _CACHE:
        try:
            adapter = importlib.import_module(f"{__name__}.{module}")
            _CACHE[name] = adapter.backend()
        except ImportError as e:
            raise BackendUnavailableError(f"backend {name!r} is not installed here ({e}): pip install {package}") from None
    return _CACHE[name]


def to_backend(name: str | LoweredProgram, lowered: LoweredProgram | torch.export.ExportedProgram | None = None, *,
               validate: bool = True, frozen_state: bool = False, fallback: str | None = None,
               state: Mapping[str, torch.Tensor] | None = None, **options: Any) -> Compiled:
    """Hand a program to a backend: ``to_backend(lowered)`` hands what ``load_for_backend(path,
    backend=NAME)`` made to that backend; ``to_backend(NAME, program)`` names the backend (for any
    ExportedProgram, or a program lowered with a preset). Options go to the backend's hand-off
    (docs/backends.md lists them).

    ``validate=True`` (the default) runs the backend's compiled program on the program's stored example
    inputs and compares its outputs with the program's own run, within the dtype's bound
    (``Compiled.validation``); a difference is a BackendResultError naming the output.

    A program that writes its buffers (a KV cache, running statistics, a counter) is handed to a backend
    that holds no state of its own (onnx, openvino, inductor) with those buffers lifted: an extra input
    after the user's own and their new values an extra output (state.lift), and the ``Compiled``
    carries them from call to call as the program does (``Compiled.state``, ``Compiled.reset_state()``;
    the check runs from the program's own values and leaves the state as it was). ``state=`` (another
    Compiled's ``.state``) hands the program over on that state, shared: the methods of one artifact
    (``to_backend_methods`` does it for all of them). A backend that cannot take the lifted form is a
    BackendStateError before any backend work; ``frozen_state=True`` hands the buffers over as
    constants instead, every call starting from their exported values.

    ``fallback="reference"``: where the backend cannot take the whole program, it runs what it can: the
    program is split into the runs of nodes whose ops the backend lists, each handed over as a program
    of its own, and the nodes between them run by their ATen kernels (as runtime_ref runs them); a
    part the backend refuses runs there too. Where the backend takes the program but computes it
    wrong, the split parts are each checked, and a wrong part is cut down until the nodes the backend
    computes wrong run on the reference. ``Compiled.share`` says what share of the op nodes and FLOPs
    the backend runs, and the whole is validated as any hand-off. Without it, a program the backend
    cannot take is a BackendHandOffError, one it computes wrong a BackendResultError.
    A program lowered with ``load_for_backend(..., fallback="reference")`` brings its fallback as the
    default here; where that lowering left ops outside the backend's list, the program is split at once."""
    if lowered is None and not isinstance(name, str):
        lowered, name = name, getattr(name, "backend", None)
        if name is None:
            raise BackendHandOffError("the program was not lowered for a backend (load_for_backend(path, "
                                      "backend=NAME) does that); name the backend: to_backend('onnx', program).")
    elif getattr(lowered, "backend", None) not in (None, name):
        raise BackendHandOffError(f"the program was lowered to {lowered.backend}'s own op list, not {name}'s: hand "
                                  f"it to {lowered.backend}, or lower it with backend={name!r}.")
    from ..tensor_subclasses import is_subclass
    from .aliases import functional, without_unread_aliases
    from .state import lift_input_writes

    backend = get(name)
    ep = exported_program(lowered)
    kept = {n: type(v).__qualname__ for n, v in (*ep.state_dict.items(), *ep.constants.items()) if is_subclass(v)}
    if kept:
        raise BackendHandOffError(
            f"the program's weights {', '.join(f'{n!r} ({c})' for n, c in list(kept.items())[:4])} are tensor "
            f"subclasses, kept as such because the program's own inputs or outputs are subclasses too; {backend.key} takes "
            f"plain tensors. Run it with runtime_ref or the program itself, or export a model whose inputs and "
            f"outputs are plain tensors (its subclass weights are then lowered to their inner tensors).")
    # the weights the graph never reads that alias one it writes left out (aliases.py: retraces stop on them);
    # a program as torch.export gives it writes in its graph, where the signature names no write: made
    # functional by torch, its writes in the signature, so that the state it writes is carried
    ep = functional(without_unread_aliases(ep))
    # the caller's tensors a program writes, written by pt2b from the new values the backend returns
    program, write_back = lift_input_writes(ep)
    unlifted = program
    program, carry = _lifted(backend, program, frozen_state, state)
    from ..lowering.plan import fallback_refusal
    from ..lowering.verdicts import WRONG_REL
    from .validation import validated_hand_off

    if (why := fallback_refusal(fallback)) is not None:
        raise BackendHandOffError(why)
    lowered_with = getattr(lowered, "fallback", None)  # the fallback the lowering was asked for: the default
    left = lowered_with is not None and bool(getattr(lowered, "outside_opset", None))
    fallback = fallback if fallback is not None else lowered_with
    check = (lambda compiled, program: validated_hand_off(compiled, program, WRONG_REL)) if validate else None
    dim_names = dict(getattr(lowered, "dim_names", None) or {})
    def split(refusal: BaseException | None = None, ties_first: bool = False) -> Compiled:
        # the ops the backend's refusal of the whole program names run on the reference from the start
        from .partition import ops_named

        refused = ops_named(first_line(refusal), program) if refusal is not None else frozenset()
        split_program, split_carry = program, carry
        if carry is None and backend.holds_state and not frozen_state:
            # the parts a backend runs hold no state of their own: the split carries it, lifted to inputs and
            # outputs, as for a backend that holds none
            split_program, split_carry = _lifted(dataclasses.replace(backend, holds_state=False), unlifted,
                                                 frozen_state, state)
        return dataclasses.replace(_split(backend, split_program, lowered, options, dim_names, check, refused,
                                          ties_first),
                                   carry=split_carry, write_back=write_back)

    if left:  # the lowering left ops the backend does not list to the reference: no whole hand-off to try
        compiled = split()
    else:
        try:
            compiled = Compiled(backend, *_handed(backend, program, options, carry), dim_names=dim_names, carry=carry,
                                write_back=write_back)
        except BackendHandOffError as e:
            if fallback is None:
                raise
            compiled = split(e)
    if check is None:
        return compiled
    wrong = False
    try:
        return dataclasses.replace(compiled, validation=check(compiled, ep))
    except BackendResultError:
        if fallback is None or compiled.share is not None:
            raise
        wrong = True
    except Pt2bError:
        raise
    # a runtime that builds its session on the first run refuses a program there (ONNX Runtime's shape
    # inference): the hand-off's run is where the backend could not take it
    except Exception as e:  # noqa: BLE001 (whatever the backend raises, typed and chained)
        if fallback is None or compiled.share is not None:
            raise BackendHandOffError(f"{backend.key} took the program but could not run it on the stored example "
                                      f"inputs: {first_line(e)}") from e
    # the backend computes the whole program wrong or cannot run it: split, each part checked, the wrong
    # ones cut down; where it computed it wrong, the picks among equal values run on the reference at once
    # (which of equal values a backend picks is its own; torch's picks are the reference's)
    compiled = split(ties_first=wrong)
    return dataclasses.replace(compiled, validation=check(compiled, ep))


def to_backend_methods(name: str | LoweredProgram, lowered: LoweredProgram | None = None, **options: Any
                       ) -> dict[str, Compiled]:
    """Every method of a multi-method program (``load_for_backend(path, backend=NAME)`` of a
    prefill/decode artifact; its ``.methods``) handed to the backend over ONE state, by name, as
    ``runtime_ref.runtimes`` runs them: the KV cache ``prefill`` writes is the one ``decode`` reads, and
    ``reset_state()`` on any of them starts a new sequence for all. Each method is ``to_backend(...,
    state=shared)`` with ``options``; a buffer one method writes is lifted in every method that reads it."""
    from .state import State, written_buffers

    if lowered is None and not isinstance(name, str):
        lowered, name = name, getattr(name, "backend", None)
    methods = getattr(lowered, "methods", None) or {"forward": lowered}
    if name is None:
        raise BackendHandOffError("the program was not lowered for a backend (load_for_backend(path, "
                                  "backend=NAME) does that); name the backend: to_backend_methods('onnx', program).")
    if options.get("frozen_state"):
        raise BackendStateError("to_backend_methods shares the methods' state, which frozen_state=True makes "
                                "constants: hand the methods over one by one with to_backend(..., frozen_state=True).")
    shared = State()
    for program in methods.values():  # what any method writes, held before any hand-off: the readers see it
        ep = exported_program(program)
        shared.take(ep, written_buffers(ep), get(name).key)
    return {method: to_backend(name, program, state=shared, **options) for method, program in methods.items()}


def _lifted(backend: Backend, ep, frozen_state: bool, state) -> tuple:
    """(the program to hand over, its state.Carry or None): ``ep`` with the buffers it writes (and those of
    ``state`` it reads) lifted to inputs and outputs where ``backend`` holds no state of its own or a state
    is shared; ``ep`` itself where it writes none, the backend holds them, or ``frozen_state`` asks for
    constants."""
    from torch.export.graph_signature import InputKind, OutputKind

    from .state import Carry, State, lift, state_keyword, written_buffers

    written = written_buffers(ep)
    shown = lambda names: ", ".join(names[:6]) + (f" and {len(names) - 6} more" if len(names) > 6 else "")  # noqa: E731
    if state is not None and frozen_state:
        raise BackendStateError("state= shares a carried state and frozen_state=True holds the buffers as constants: "
                                "pass one of them.")
    if state is not None and not isinstance(state, State):
        raise BackendStateError(f"state= takes another Compiled's .state (a State), not {type(state).__name__}: "
                                f"hand the first method over, then to_backend(..., state=first.state).")
    if frozen_state or (state is None and (not written or backend.holds_state)):
        return ep, None
    params = [s.target for s in ep.graph_signature.output_specs if s.kind == OutputKind.PARAMETER_MUTATION]
    if params or not backend.takes_lifted_state:
        what = (f"writes its parameters ({shown(params)}), which pt2b lifts only as buffers" if params else
                f"writes its buffers ({shown(written)}), and {backend.key} neither holds state nor takes it as "
                f"inputs and outputs")
        raise BackendStateError(
            f"the program {what}: a copy held as constants would start every call from the exported values (a KV "
            f"cache that never fills, running statistics that never move). Run it with runtime_ref or the program "
            f"itself, which carry the state, or pass to_backend(..., frozen_state=True) (`pt2b run --frozen-state`) "
            f"to accept constants.")
    state = State() if state is None else state
    names = [s.target for s in ep.graph_signature.input_specs
             if s.kind == InputKind.BUFFER and (s.target in written or s.target in state)]
    if not names:
        return ep, None
    state.take(ep, names, backend.key)
    return lift(ep, names), Carry(state, names, state_keyword(ep))


def _handed(backend: Backend, ep, options: dict, carry=None) -> tuple:
    """(native, the program it took[, plan]): ``backend``'s hand-off of ``ep``, its failure typed; a
    hand-off that takes ``carry`` gets the state.Carry of a lifted program (to hold that state itself)."""
    import inspect

    import torch

    from . import calling
    from .constant_outputs import constant_outputs, with_constant_outputs, without_constant_outputs
    from .program_copy import handed_spec, program_returning

    params = inspect.signature(backend.hand_off).parameters
    takes = [n for n, p in params.items() if n != "carry" and (
        p.kind == p.KEYWORD_ONLY or (p.kind == p.POSITIONAL_OR_KEYWORD and n != "ep"))]
    unknown = [k for k in options if k not in takes]
    if unknown and not any(p.kind == p.VAR_KEYWORD for p in params.values()):
        raise BackendHandOffError(f"{backend.key}'s hand-off takes no option {', '.join(map(repr, unknown))}; it takes "
                                  f"{', '.join(takes) or 'none'} (docs/backends.md).")
    from .._torch.tracing import get_shape_env

    # a backend's trace that fails midway leaves the symbols it read from tensors pending in the program's
    # shape environment, and the next trace of the program (a hand-off tried again) stops on them
    env = get_shape_env(ep.graph_module)
    pending = list(getattr(env, "pending_fresh_unbacked_symbols", None) or ())
    try:
        if backend.takes_ops_only:
            from .sym_ops import ops_only

            ep = ops_only(ep)
        # where the program's outputs do not flatten back to its structure (a class rebuilt from its keys
        # reorders them), the backend gets them in plain containers, as a retrace would permute them, and
        # the program it took gives them back in the program's own structure; a program returning
        # constants gets them back the same way, the backend given the other outputs alone
        # (constant_outputs.py)
        spec = calling.out_spec(ep)
        plain = handed_spec(spec)
        constants = constant_outputs(ep)
        given = (without_constant_outputs(ep, spec) if constants else
                 program_returning(ep, plain) if plain != spec else ep)
        handed = backend.hand_off(given, **options,
                                  **({"carry": carry} if carry is not None and "carry" in params else {}))
        took = handed[1]
        if not isinstance(took, torch.export.ExportedProgram):
            return handed
        if constants:
            restored = with_constant_outputs(took, constants, spec)
            return handed if restored is None else (handed[0], restored, *handed[2:])
        if plain != spec and calling.out_spec(took) == plain:
            handed = (handed[0], program_returning(took, spec, copy=False), *handed[2:])
        return handed
    except Pt2bError:
        raise
    except Exception as e:  # noqa: BLE001 (whatever the backend raises, typed and chained)
        raise BackendHandOffError(f"{backend.key} could not take the program: {first_line(e)}") from e
    finally:
        if isinstance(getattr(env, "pending_fresh_unbacked_symbols", None), list):
            env.pending_fresh_unbacked_symbols[:] = pending


def _split(backend: Backend, ep, lowered, options: dict, dim_names: dict, check, refused=frozenset(),
           ties_first: bool = False) -> Compiled:
    """``ep`` split between ``backend`` (the ops its list names, less ``refused``: op names) and the
    reference (partition.py), each part handed over checked with ``check`` (None: unchecked)."""
    from ..ops import OpMatcher, op_name
    from .partition import split_for

    listed = getattr(lowered, "supported", None) or OpMatcher(backend.supported_ops)
    # a backend that publishes no op list (IREE) is offered every op: its hand-offs find what it refuses
    offered = (lambda op: op in listed) if backend.supported_ops else (lambda op: True)
    supported = (lambda op: offered(op) and op_name(op) not in refused) if refused else offered
    part = lambda part_ep, **o: Compiled(backend, *_handed(backend, part_ep, o))  # noqa: E731
    from .validation import tied_nodes

    partitioned = split_for(backend, ep, supported, part, options, check, tied_nodes if ties_first else None)
    run = lambda native, program, args, kwargs: native(*args, **kwargs)  # noqa: E731
    return Compiled(dataclasses.replace(backend, run=run, save=None), partitioned, ep, dim_names=dim_names,
                    share=partitioned.share)


def first_line(e: BaseException) -> str:
    """``Type: reason`` of a backend's error in one line: torch.onnx's "Exception summary", OpenVINO's
    conversion summary or the last line of its C++ trace, or the first line of anything else; without
    terminal colour codes."""
    text = re.sub(r"\x1b\[[0-9;]*m", "", str(e)).strip()
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    for marker in ("## Exception summary", "Summary:", "Failed operations detailed log:"):
        if marker in lines:
            after = lines[lines.index(marker) + 1:]
            if after:
                reason = re.sub(r"^<class '(?:[\w.]+\.)?(\w+)'>", r"\1", after[0]).lstrip("- ")
                return f"{type(e).__name__}: {reason}"
    if lines and lines[0].startswith("Exception from "):  # OpenVINO's C++ trace: the reason comes last
        return f"{type(e).__name__}: {lines[-1]}"
    return f"{type(e).__name__}: {lines[0] if lines else ''}"


def retraceable(ops) -> tuple[str, ...]:
    """The names of ``ops`` (a backend's list) that a program handed to the backend may hold: every
    hand-off retraces its program (torch.onnx.export and aoti_compile_and_package run torch's
    functionalizing trace over it), and torch's functionalization refuses a non-ATen op whose output
    is a view of an input ("Found a custom (non-ATen) operator whose output has alias annotations:
    prims::broadcast_in_dim"). A backend translates such a PrimTorch view where its own
    decompositions emit it, never where it comes in the program: those prims are left out, and the
    closure reaches ATen's views instead (lowering/tables.view_prims_via_aten, from the running torch's
    schemas)."""
    from ..lowering.tables import view_prims_via_aten
    from ..ops import op_name

    views = {op_name(op) for op in view_prims_via_aten()}
    return tuple(name for name in ops if name not in views)


def exported_program(lowered):
    """The ExportedProgram of load_for_backend's result (or ``lowered`` itself when it is one)."""
    return lowered.exported_program() if hasattr(lowered, "exported_program") else lowered


@contextlib.contextmanager
def quiet_logger(name: str, level: int = logging.ERROR):
    """A backend's chatty logger held at ``level`` for a block (restored after)."""
    logger = logging.getLogger(name)
    before = logger.level
    logger.setLevel(level)
    try:
        yield
    finally:
        logger.setLevel(before)
