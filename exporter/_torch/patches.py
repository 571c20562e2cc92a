"""Every patch pt2b makes to a torch object, in one list (``PATCHES``: symbol, scope, site, reason,
releases tested on; ``Patch`` defines the scopes), and the helpers that install them (``wrap_once``,
``swapped``, ``name_pytree_types``). tests/repo/test_torch_patches.py checks that what the code patches,
scanned and at run time, is this list. Why: docs/lowering.md#lowering-leaves-global-state-alone."""

from __future__ import annotations

import dataclasses
import importlib
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

RELEASES = ("2.11", "2.12", "2.13", "2.14", "2.15")  # pyproject.toml's range, as tools/release_matrix.py runs it
SCOPES = ("process", "per-trace", "per-instance", "registration", "copied body")
MARK = "_pt2b_wrapped"  # set on each process-wide wrapper: installed once


@dataclasses.dataclass(frozen=True)
class Patch:
    """One patch: ``symbol`` is the torch object as "module:qualified.name" (for a per-instance patch, the
    class of the instance); ``site`` the code of pt2b that makes it ("path.py::function"); ``attributes``
    the attributes a per-instance patch sets on the instance.

    ``scope`` is one of:

    - ``process``: a torch function is replaced by a wrapper for the rest of the process, installed once
      on first use (``wrap_once``); outside the context that asks for pt2b's behaviour, and in every
      other thread, the wrapper calls torch's function unchanged;
    - ``per-trace``: a class attribute is replaced for the duration of one functionalizing trace and
      restored after it (``swapped``; process-wide while it is replaced);
    - ``per-instance``: attributes set on one instance pt2b made and owns (a deserializer, the trace's
      functionalization mode), where nothing else sees them; or on the caller's object for one step of a
      call, removed before the call goes on;
    - ``registration``: an entry added to a torch registry (a higher-order op's rules for pt2b's own mode
      class; serialized names of torch's pytree nodes), once a process;
    - ``copied body``: a torch function whose body pt2b runs as its own copy (to skip a step), to compare
      with torch's on every upgrade."""

    symbol: str
    scope: str
    site: str
    reason: str
    attributes: tuple[str, ...] = ()
    tested_on: tuple[str, ...] = RELEASES  # the torch releases the patch is tested on (tools/release_matrix.py)


PATCHES: tuple[Patch, ...] = (
    Patch("torch.export.exported_program:_create_graph_module_for_export", "process",
          "exporter/_torch/deferred_codegen.py::_installed",
          "inside deferred(), this thread's new ExportedPrograms get a _LazyGraphModule (Python code generated "
          "on first use, not at creation for programs a lowering never runs); torch's own elsewhere"),
    Patch("torch.fx._lazy_graph_module:_get_graph_module_cls", "process",
          "exporter/_torch/deferred_codegen.py::_installed",
          "inside deferred(), the graph modules a lowering's traces make are _LazyGraphModules too, unless "
          "torch's own switch forbids it; torch's own choice elsewhere"),
    Patch("torch._higher_order_ops.utils:_hop_compile_and_call", "process",
          "exporter/_torch/eager_hops.py::eager",
          "inside eager() (pt2b's eager decomposition mode), this thread's eager cond, map and while_loop call "
          "their op directly, which dispatches to the mode's rule: torch's dynamo compile of the call, under a "
          "dispatch mode it does not know, fails or leaves dynamo's caches so that later exports of control "
          "flow fail; torch's own elsewhere"),
    Patch("torch.fx.experimental.symbolic_shapes:_free_unbacked_symbols_with_path", "process",
          "exporter/serialize/read/deserialize.py::_reading",
          "while pt2b's deserializer runs in this thread, a walk with nothing pending returns {} at once "
          "(it would find and change nothing)"),
    Patch("torch._decomp.decompositions_for_rng:PhiloxState.reset", "per-trace",
          "exporter/functionalize.py::_rng_tracker_outside_fake_mode",
          "aot_export resets the Philox RNG tracker twice per trace inside its fake mode (a "
          "large part of a small trace); during each functionalizing trace (under functionalize.LOCK, where functionalize_rng_ops "
          "is off) its tensors are made as plain tensors outside the fake mode, then the class attribute is "
          "restored. While it is swapped, another thread's aot_export gets plain tracker tensors too (read "
          "only where functionalize_rng_ops is on)"),
    Patch("torch._export.serde.serialize:GraphModuleDeserializer", "per-instance",
          "exporter/serialize/read/deserialize.py::_graph_module_deserializer",
          "the deserializer pt2b makes for one program gets cheaper fake tensors, memoized symbolic "
          "expressions and module stacks split once (torch's class is final: no subclass)",
          ("deserialize_tensor_meta", "_parse_sym_expr", "deserialize_metadata")),
    Patch("torch._export.serde.serialize:GraphModuleDeserializer", "per-instance",
          "exporter/serialize/read/deserialize.py::deserialize_for_call",
          "the deserializer a first call's graph is built by gives fake values to the graph's inputs only and "
          "reads no node metadata (a call needs neither)",
          ("sync_fx_node", "deserialize_metadata")),
    Patch("torch._subclasses.fake_tensor:FakeTensorMode", "per-instance",
          "exporter/serialize/read/deserialize.py::_deserialize_program",
          "the fake mode of the program read back allows fallback kernels, as torch.export's tracing did, "
          "so that a program read back can be retraced where the exported one can",
          ("allow_fallback_kernels",)),
    Patch("torch.fx.graph_module:GraphModule", "per-instance",
          "exporter/_torch/serializer.py::unprinted",
          "while torch's serializer reads a program being saved, its graph modules answer print_readable "
          "with '' (torch formats the whole graph's code as the argument of a debug log call whether or not "
          "it is logged); the shadows are removed before the save goes on, and none is set while that logger "
          "logs at DEBUG",
          ("print_readable",)),
    Patch("torch._subclasses.functional_tensor:FunctionalTensorMode", "per-instance",
          "exporter/functionalize.py::_AboveFunctionalization._decompose_in_functionalization",
          "the trace's own functionalization mode object is told to decompose the CIA ops the table runs as "
          "their C++ kernels (2.12 on; compat.functional_mode_decides_per_object)",
          ("_can_decompose", "_pt2b_cia")),
    Patch("torch._higher_order_ops.cond:cond_op", "registration",
          "exporter/lowering/eager.py::_register_hop_rules",
          "cond's rule for EagerDecompositions (pt2b's mode class; no other mode sees it): run the branch "
          "with the mode on, so its ops are decomposed too"),
    Patch("torch._higher_order_ops.map:map_impl", "registration",
          "exporter/lowering/eager.py::_register_hop_rules",
          "map's rule for EagerDecompositions: run the body with the mode on"),
    Patch("torch._higher_order_ops.while_loop:while_loop_op", "registration",
          "exporter/lowering/eager.py::_register_hop_rules",
          "while_loop's rule for EagerDecompositions: run the loop with the mode on"),
    Patch("torch.utils._pytree:SUPPORTED_SERIALIZED_TYPES", "registration",
          "exporter/serialize/mapping/return_types.py::register",
          "torch.return_types classes are pytree nodes without a serialized name: each gets its path as one "
          "(with SERIALIZED_TYPE_TO_PYTHON_TYPE), so programs returning them can be written and read"),
    Patch("torch._export.serde.serialize:ExportedProgramSerializer.serialize", "copied body",
          "exporter/serialize/write/writer.py::_serialize_program",
          "the same pieces without the self-test that canonicalizes a deep copy and throws it away (a "
          "large part of a save)"),
    Patch("torch._export.serde.serialize:ExportedProgramDeserializer.deserialize", "copied body",
          "exporter/serialize/read/deserialize.py::_deserialize_program",
          "the same steps with pt2b's per-instance deserializer (above) and fallback kernels allowed"),
)

_DECLARED = {p.symbol: p for p in PATCHES}
_INSTALL = threading.Lock()


def resolve(symbol: str):
    """(owner, attribute name, current value) of "module:qualified.name"; None where this torch lacks it."""
    module_name, _, qualname = symbol.partition(":")
    try:
        owner = importlib.import_module(module_name)
    except ImportError:
        return None
    *path, name = qualname.split(".")
    for part in path:
        owner = getattr(owner, part, None)
        if owner is None:
            return None
    value = getattr(owner, name, None)
    return None if value is None else (owner, name, value)


def _declared(symbol: str, scope: str) -> None:
    patch = _DECLARED.get(symbol)
    if patch is None or patch.scope != scope:
        raise ValueError(f"{symbol} is not declared as a {scope} patch in exporter/_torch/patches.py")


def wrap_once(symbol: str, make: Callable[[Callable], Callable]) -> bool:
    """Replace the declared process-wide ``symbol`` by ``make(torch's function)``, once a process (a
    second call finds the wrapper and returns). False where this torch lacks ``symbol``."""
    _declared(symbol, "process")
    found = resolve(symbol)
    if found is None:
        return False
    if getattr(found[2], MARK, False):
        return True
    with _INSTALL:
        owner, name, current = resolve(symbol)
        if not getattr(current, MARK, False):
            wrapper = make(current)
            setattr(wrapper, MARK, True)
            setattr(owner, name, wrapper)
    return True


class ThreadSwitch:
    """A switch a process-wide wrapper reads: on in a thread while that thread is inside ``on()`` (nested
    uses keep it on until the outermost exits), off in every other thread, so that the wrapper calls
    torch's own function there."""

    def __init__(self):
        self._state = threading.local()

    @property
    def active(self) -> bool:
        return getattr(self._state, "depth", 0) > 0

    @contextmanager
    def on(self) -> Iterator[None]:
        self._state.depth = getattr(self._state, "depth", 0) + 1
        try:
            yield
        finally:
            self._state.depth -= 1


@contextmanager
def swapped(symbol: str, make: Callable[[Callable], Callable]) -> Iterator[bool]:
    """Within, the declared per-trace ``symbol`` is ``make(torch's)``; restored on exit. Yields False
    (and changes nothing) where this torch lacks it. Callers hold a lock that serializes them."""
    _declared(symbol, "per-trace")
    found = resolve(symbol)
    if found is None:
        yield False
        return
    owner, name, torch_value = found
    setattr(owner, name, make(torch_value))
    try:
        yield True
    finally:
        setattr(owner, name, torch_value)


def name_pytree_types(names: dict[type, str]) -> None:
    """Give each class (a registered pytree node) its serialized name in torch's pytree registry, where
    it has none yet (the declared registration on torch.utils._pytree:SUPPORTED_SERIALIZED_TYPES)."""
    from .pytree import pytree

    missing = getattr(pytree, "NO_SERIALIZED_TYPE_NAME_FOUND", None)
    for cls, name in names.items():
        known = pytree.SUPPORTED_SERIALIZED_TYPES.get(cls)
        if cls not in pytree.SUPPORTED_NODES or name in pytree.SERIALIZED_TYPE_TO_PYTHON_TYPE or (
                known is not None and known.serialized_type_name != missing):
            continue
        pytree.SUPPORTED_SERIALIZED_TYPES[cls] = pytree._SerializeNodeDef(cls, name, None, None)
        pytree.SERIALIZED_TYPE_TO_PYTHON_TYPE[name] = cls
