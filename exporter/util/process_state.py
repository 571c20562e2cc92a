"""The caller's process-wide torch state a program could change (grad mode, autocast, default dtype, deterministic
flags, matmul precision, mode stacks, threads, levels): read before each entry point, given back after (`preserved`)."""

from __future__ import annotations

import functools
import threading

import torch

_C = torch._C
_F = torch._C._functorch
_AUTOCAST_DEVICES = tuple(_C._autocast_supported_devices())

# On: a change no valid program makes (anything but grad mode) is an AssertionError after it is given
# back, when the call itself returned; tests and the fuzzers' oracle turn it on. Grad mode is not among
# them: torch.export records a grad-mode region's exit as the mode it was traced in, so a valid program
# run from another mode leaves that one, as torch's own GraphModule does.
ASSERT_UNCHANGED = False

FIELDS = ("grad mode", "autocast enabled (per device type)", "autocast nesting", "autocast cache", "default dtype",
          "deterministic algorithms", "deterministic warn-only", "deterministic fill of uninitialized memory",
          "float32 matmul precision", "torch function modes", "torch dispatch modes", "intra-op threads",
          "functorch levels", "autocast dtype (per device type)", "forward-AD dual level open")
_GRAD, _AUTOCAST_ON, _NESTING, _CACHE, _DTYPE, _DET, _DET_WARN, _DET_FILL, _MATMUL, _FN_MODES, _DISPATCH_MODES, \
    _THREADS, _LEVELS, _PER_DEVICE, _DUAL = range(len(FIELDS))


def _autocast_nesting() -> int:
    _C.autocast_increment_nesting()
    return _C.autocast_decrement_nesting()


def _autocast_enabled():
    """False where no device type autocasts (one call), else each device type's flag."""
    if not _C._is_any_autocast_enabled():
        return False
    return tuple(_C.is_autocast_enabled(d) for d in _AUTOCAST_DEVICES)


def _modes(length, at) -> tuple:
    n = length()
    return tuple(at(i) for i in range(n)) if n else ()


# Forward-AD levels are process-wide, not per thread: one thread's probe (enter, exit) seen by another's
# as an open level would have that one close it under the first. Probes and closes take turns.
_DUAL_LOCK = threading.Lock()


def _dual_level_open() -> bool:
    """Whether a forward-AD level is open: torch keeps one at most, so entering another fails then."""
    with _DUAL_LOCK:
        try:
            level = _C._enter_dual_level()
        except RuntimeError:
            return True
        _C._exit_dual_level(level=level)
        return False


def snapshot(full: bool = True) -> tuple:
    """The state, a tuple in FIELDS' order, read with a dozen C calls. ``full`` adds each device type's
    autocast dtype and whether a forward-AD level is open (a dozen more): a hot call leaves them out, as
    only an autocast region entered and never exited changes a dtype (the runtime's RegionGuard gives
    back the dtypes of the device types a program autocasts)."""
    state = (_C.is_grad_enabled(), _autocast_enabled(), _autocast_nesting(), _C.is_autocast_cache_enabled(),
             torch.get_default_dtype(), _C._get_deterministic_algorithms(),
             _C._get_deterministic_algorithms_warn_only(),
             _C._get_deterministic_fill_uninitialized_memory(), _C._get_float32_matmul_precision(),
             _modes(_C._len_torch_function_stack, _C._get_function_stack_at),
             _modes(_C._len_torch_dispatch_stack, _C._get_dispatch_stack_at),
             _C.get_num_threads(), _F.get_dynamic_layer_stack_depth())
    if not full:
        return state
    return (*state, tuple(_C.get_autocast_dtype(d) for d in _AUTOCAST_DEVICES), _dual_level_open())


def changed(before: tuple, after: tuple) -> list[str]:
    """The FIELDS whose value differs between two snapshots."""
    return [FIELDS[i] for i, (a, b) in enumerate(zip(before, after)) if a != b]


def _restore_modes(saved: tuple, length, at, pop, push) -> None:
    """The mode stack back to ``saved``: modes pushed on top of it popped, modes popped from it pushed again."""
    while length() and (length() > len(saved) or at(length() - 1) is not saved[length() - 1]):
        pop(at(length() - 1))
    for mode in saved[length():]:
        push(mode)


def _restore_autocast(before: tuple, after: tuple) -> None:
    now = after[_NESTING]
    while now > before[_NESTING]:  # regions entered and never exited
        now = _C.autocast_decrement_nesting()
        if now == 0:
            torch.clear_autocast_cache()
    while now < before[_NESTING]:
        now = _C.autocast_increment_nesting()
    enabled = before[_AUTOCAST_ON] or (False,) * len(_AUTOCAST_DEVICES)
    for d, on in zip(_AUTOCAST_DEVICES, enabled):
        _C.set_autocast_enabled(d, on)
    if len(before) > _PER_DEVICE:
        for d, dtype in zip(_AUTOCAST_DEVICES, before[_PER_DEVICE]):
            _C.set_autocast_dtype(d, dtype)
    _C.set_autocast_cache_enabled(before[_CACHE])


def restore(before: tuple, after: tuple) -> None:
    """Give back every field of ``before`` (a snapshot) that differs in ``after`` (one taken now); a field
    that did not change is not written (another thread may own it). The mode stacks come first: a
    mode left on them would see the calls that give back the rest."""
    if after[_FN_MODES] != before[_FN_MODES]:
        _restore_modes(before[_FN_MODES], _C._len_torch_function_stack, _C._get_function_stack_at,
                       lambda mode: _C._pop_torch_function_stack(), _C._push_on_torch_function_stack)
    if after[_DISPATCH_MODES] != before[_DISPATCH_MODES]:
        _restore_modes(before[_DISPATCH_MODES], _C._len_torch_dispatch_stack, _C._get_dispatch_stack_at,
                       lambda mode: _C._pop_torch_dispatch_stack(getattr(mode, "_mode_key", None)),
                       _C._push_on_torch_dispatch_stack)
    if after[_LEVELS] != before[_LEVELS]:
        _F.pop_dynamic_layer_stack_and_undo_to_depth(before[_LEVELS])
    if len(before) > _DUAL and after[_DUAL] and not before[_DUAL]:
        with _DUAL_LOCK:
            _C._exit_dual_level(level=0)
    if after[_GRAD] != before[_GRAD]:
        _C._set_grad_enabled(before[_GRAD])
    if after[_AUTOCAST_ON:_DTYPE] != before[_AUTOCAST_ON:_DTYPE] \
            or after[_PER_DEVICE:_DUAL] != before[_PER_DEVICE:_DUAL]:
        _restore_autocast(before, after)
    if after[_DTYPE] != before[_DTYPE]:
        torch.set_default_dtype(before[_DTYPE])
    if after[_DET:_MATMUL] != before[_DET:_MATMUL]:
        _C._set_deterministic_algorithms(before[_DET], warn_only=before[_DET_WARN])
        _C._set_deterministic_fill_uninitialized_memory(before[_DET_FILL])
    if after[_MATMUL] != before[_MATMUL]:
        _C._set_float32_matmul_precision(before[_MATMUL])
    if after[_THREADS] != before[_THREADS]:
        torch.set_num_threads(before[_THREADS])


def _given_back(before: tuple, full: bool, raised: bool) -> None:
    after = snapshot(full)
    if after == before:
        return
    restore(before, after)
    what = changed(before, after)
    if ASSERT_UNCHANGED and not raised and what != ["grad mode"]:
        fields = ", ".join(w for w in what if w != "grad mode")
        raise AssertionError(f"pt2b changed the caller's process state ({fields}) "
                             f"and gave it back; a program that passed the file's checks must not change it.")


class preserved:
    """``with preserved(): ...`` or ``@preserved()``: the process state (``snapshot``) after the block or
    call is what it was before, also when it raises. ``full=False`` for a program's call, which is
    measured per op (snapshot says what it then leaves out)."""

    __slots__ = ("full", "_before")

    def __init__(self, full: bool = True) -> None:
        self.full = full
        self._before: list = []  # a stack: one instance may be entered again inside its own block

    def __enter__(self) -> "preserved":
        self._before.append(snapshot(self.full))
        return self

    def __exit__(self, kind, value, traceback) -> None:
        _given_back(self._before.pop(), self.full, kind is not None)

    def __call__(self, fn):
        full = self.full

        @functools.wraps(fn)
        def preserving(*args, **kwargs):
            before = snapshot(full)
            raised = True
            try:
                out = fn(*args, **kwargs)
                raised = False
                return out
            finally:
                _given_back(before, full, raised)

        return preserving
