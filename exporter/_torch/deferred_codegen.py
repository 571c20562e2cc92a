"""Graph modules whose Python code is generated when first run or printed, not when made: inside
``deferred()`` the programs and traces a lowering makes on the way are torch.fx's _LazyGraphModule;
``compiled(ep)`` generates the code of the program a lowering returns. Why:
docs/lowering.md#programs-made-on-the-way-generate-no-code."""

from __future__ import annotations

import contextlib
import warnings

import torch

from . import compat, patches

__all__ = ["compiled", "deferred"]

_SWITCH = patches.ThreadSwitch()
_MAKE = "torch.export.exported_program:_create_graph_module_for_export"
_PICK = "torch.fx._lazy_graph_module:_get_graph_module_cls"


def _lazy_class():
    return compat.lazy_graph_module_class()


def _installed() -> bool:
    """Whether ExportedProgram's graph-module maker is wrapped (wrapping it, and torch.fx's choice of
    graph-module class where this torch has it, on the first call: exporter/_torch/patches.py)."""
    if _lazy_class() is None or not patches.wrap_once(_MAKE, _deferring_make):
        return False
    patches.wrap_once(_PICK, _deferring_pick)
    return True


def _deferring_make(make):
    """ExportedProgram's graph-module maker: a _LazyGraphModule in a thread inside ``deferred()``."""
    lazy = _lazy_class()

    def create(root, graph, _torch_make=make):
        if _SWITCH.active:
            return lazy(root, graph)
        return _torch_make(root, graph)

    return create


def _deferring_pick(pick):
    """torch.fx's choice of graph-module class: _LazyGraphModule in a thread inside ``deferred()``,
    unless torch's own switch forbids it."""
    lazy = _lazy_class()

    def graph_module_cls(_torch_pick=pick):
        if _SWITCH.active and not compat.lazy_graph_modules_forbidden():
            return lazy
        return _torch_pick()

    return graph_module_cls


@contextlib.contextmanager
def deferred():
    """Inside, this thread's new ExportedPrograms, and the graph modules the traces make (make_fx's
    result in each aot_export, otherwise made and then recompiled after its passes, each time a full code generation),
    are torch.fx's _LazyGraphModule, which generates its code on first use. ExportedProgram makes its
    graph module in torch.export.exported_program._create_graph_module_for_export, and torch.fx picks
    the class of the graph modules it makes in torch.fx._lazy_graph_module._get_graph_module_cls; this
    puts a wrapper on each once, for the process (they call torch's own outside ``deferred()``, in
    every thread: declared in exporter/_torch/patches.py). Where a torch release lacks these names,
    it changes nothing. (torch's own switch for this, torch.fx._lazy_graph_module._use_lazy_graph_module,
    is one flag for all threads: two lowerings in two threads could leave it on for everyone.)"""
    if not _installed():
        yield
        return
    with _SWITCH.on():
        yield


def compiled(ep):
    """``ep`` with its graph module's code generated now (a no-op for one made outside ``deferred()``).
    Code that cannot be generated (an object in the graph that Python source cannot name) leaves the
    graph module runnable only by torch.fx.Interpreter, with a warning saying so (torch's own
    ExportedProgram does the same)."""
    lazy = _lazy_class()
    gm = ep.graph_module
    if lazy is not None and isinstance(gm, lazy):
        try:
            lazy.force_recompile(gm)
        except SyntaxError:
            warnings.warn(
                "pt2b: the lowered graph holds an object Python source cannot name, so its graph module "
                "has no generated code and cannot be called itself; run the ExportedProgram, or the graph "
                "module through torch.fx.Interpreter.", stacklevel=2)
    return ep


def is_deferred(gm: torch.fx.GraphModule) -> bool:
    """Whether ``gm``'s code is still to be generated (tests)."""
    lazy = _lazy_class()
    return lazy is not None and isinstance(gm, lazy) and gm._needs_recompile()
