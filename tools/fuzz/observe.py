"""The oracle's own observers of a worker process (independent of the code under test): torch's
process-global state, what reached file descriptors 1 and 2, and resident memory against a file's size.

State: ``snapshot()`` reads every setting in ``STATE``; ``changes(before, after)`` names the ones that
differ; ``restore(snapshot)`` sets them back and names those it could not (the worker is then replaced).
Output: ``Capture`` redirects fds 1 and 2 into a file around a call; ``terminal_controls(data)`` names the
first byte a terminal would act on (ESC, BEL, a C1 control, any other C0 control but \\n \\t \\r).
Memory: ``Peak`` resets the kernel's high-water mark (Linux /proc/self/clear_refs) and reads it back;
``rss_bound(disk_bytes(path))`` is what the checking phases may add to it for a file of that size.
"""

from __future__ import annotations

import os
import re
import sys
import tempfile

DEVICE_TYPES = ("cpu", "cuda")


def _autocast_nesting() -> int:
    import torch

    torch.autocast_increment_nesting()
    return torch.autocast_decrement_nesting()


def _set_autocast_nesting(level: int) -> None:
    import torch

    while _autocast_nesting() < level:
        torch.autocast_increment_nesting()
    while _autocast_nesting() > level:
        torch.autocast_decrement_nesting()


def _pop_to(length, pop):
    def set_length(n):
        while length() > n:
            pop()
    return set_length


def _state_table() -> dict:
    """name -> (getter, setter or None): every piece of torch's process-global state the oracle watches."""
    import torch

    C = torch._C
    table = {
        "grad_enabled": (torch.is_grad_enabled, torch._C._set_grad_enabled),
        "inference_mode": (torch.is_inference_mode_enabled, None),
        "anomaly_mode": (torch.is_anomaly_enabled, torch.set_anomaly_enabled),
        "default_dtype": (torch.get_default_dtype, torch.set_default_dtype),
        "deterministic_algorithms": (
            lambda: (torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()),
            lambda v: torch.use_deterministic_algorithms(v[0], warn_only=v[1])),
        "float32_matmul_precision": (torch.get_float32_matmul_precision, torch.set_float32_matmul_precision),
        "autocast_cache_enabled": (torch.is_autocast_cache_enabled, torch.set_autocast_cache_enabled),
        "autocast_nesting": (_autocast_nesting, _set_autocast_nesting),
        "torch_function_mode_stack": (C._len_torch_function_stack,
                                      _pop_to(C._len_torch_function_stack, C._pop_torch_function_stack)),
        "torch_dispatch_mode_stack": (C._len_torch_dispatch_stack,
                                      _pop_to(C._len_torch_dispatch_stack, C._pop_torch_dispatch_stack)),
        "num_threads": (torch.get_num_threads, torch.set_num_threads),
        "num_interop_threads": (torch.get_num_interop_threads, None),
    }
    for dev in DEVICE_TYPES:
        table[f"autocast_enabled[{dev}]"] = (lambda d=dev: torch.is_autocast_enabled(d),
                                             lambda v, d=dev: torch.set_autocast_enabled(d, v))
        table[f"autocast_dtype[{dev}]"] = (lambda d=dev: torch.get_autocast_dtype(d),
                                           lambda v, d=dev: torch.set_autocast_dtype(d, v))
    return table


_TABLE: dict | None = None


def snapshot() -> dict:
    global _TABLE
    _TABLE = _TABLE or _state_table()
    return {name: get() for name, (get, _) in _TABLE.items()}


def changes(before: dict, after: dict) -> list[str]:
    """``"name: before -> after"`` for every setting that differs."""
    return [f"{k}: {before[k]} -> {after[k]}" for k in before if after.get(k) != before[k]]


def restore(before: dict) -> list[str]:
    """Set every changed setting back to ``before``; the names of those that stay changed."""
    now = snapshot()
    for name in before:
        setter = _TABLE[name][1]
        if now[name] != before[name] and setter is not None:
            try:
                setter(before[name])
            except Exception:
                pass
    now = snapshot()
    return [k for k in before if now[k] != before[k]]


# ---- output ----
# What a terminal acts on: C0 controls but \t \n \r (ESC, BEL among them), C1 controls as code points,
# and the raw bytes 0x80-0x9f that are not UTF-8 (surrogate-escaped), which 8-bit terminals read as C1.
_CONTROL = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x80-\x9f\udc80-\udc9f]")
_NAMES = {0x1b: "ESC", 0x07: "BEL", 0x00: "NUL", 0x9b: "CSI", 0x9d: "OSC"}


def terminal_controls(data: bytes) -> str:
    """'' if ``data`` is safe to print on a terminal, else which control character it holds and where."""
    text = data.decode("utf-8", "surrogateescape")
    m = _CONTROL.search(text)
    if m is None:
        return ""
    c = ord(m.group()) - (0xdc00 if ord(m.group()) >= 0xdc00 else 0)
    kind = "C1 control" if c >= 0x80 else "C0 control"
    near = text[max(0, m.start() - 30):m.start() + 30].encode("utf-8", "surrogateescape")
    return f"{kind} {_NAMES.get(c, '')} 0x{c:02x} at character {m.start()} of {len(text)}: {near!r}".replace("  ", " ")


class Capture:
    """File descriptors 1 and 2 (C++ writes included) redirected into one temporary file while active;
    ``data`` then holds what was written (at most ``limit`` bytes), which is also passed on to the
    descriptors' own destination."""

    def __init__(self, limit: int = 1 << 24):
        self.file = tempfile.TemporaryFile()
        self.limit = limit
        self.data = b""

    def __enter__(self):
        _flush()
        self.file.seek(0)
        self.file.truncate()
        self.saved = (os.dup(1), os.dup(2))
        os.dup2(self.file.fileno(), 1)
        os.dup2(self.file.fileno(), 2)
        return self

    def __exit__(self, *exc):
        _flush()
        os.dup2(self.saved[0], 1)
        os.dup2(self.saved[1], 2)
        for fd in self.saved:
            os.close(fd)
        self.file.seek(0)
        self.data = self.file.read(self.limit)
        if self.data:
            os.write(1, self.data)
        return False


def _flush():
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError, AttributeError):
            pass


# ---- resident memory ----
# The checking phases (load, check, verify, inspect) may touch what a file of its size needs: its
# weights mapped and read once (verify=True), beside the decoded program (a fraction of its bytes);
# RSS_PER_DISK_BYTE per byte on disk leaves room for twice that. RSS_SLACK is the fixed part, what any
# small program builds (fake tensors, torch's per-op caches, a graph module's generated code, the
# allocator's rounding), with room for several times the most a seed's phases were seen to add.
# docs/untrusted.md ("The semantic mode") has the measurements behind both.
RSS_PER_DISK_BYTE = 4
RSS_SLACK = 256 << 20

def disk_bytes(path) -> int:
    """Bytes the file holds on disk (a sparse file's holes are not counted)."""
    st = os.stat(path)
    return min(st.st_size, st.st_blocks * 512) if hasattr(st, "st_blocks") else st.st_size


def rss_bound(on_disk: int) -> int:
    """What the checking phases may add to the resident high-water mark for a file of ``on_disk`` bytes."""
    return RSS_PER_DISK_BYTE * on_disk + RSS_SLACK


class Peak:
    """The process's resident-set high-water mark since ``reset()`` (Linux; elsewhere ``available`` is
    False and the bound is not checked: ru_maxrss cannot be reset)."""

    def __init__(self):
        self.available = self.reset()
        self.base = self.status("VmRSS") if self.available else 0

    @staticmethod
    def reset() -> bool:
        try:
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")  # resets VmHWM to the current VmRSS
            return True
        except OSError:
            return False

    @staticmethod
    def status(field: str) -> int:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
        return 0

    def growth(self) -> int:
        """Bytes the high-water mark rose above the resident size at the reset."""
        return self.status("VmHWM") - self.base if self.available else 0
