"""Faults planted in a semantic fuzz worker's phases (tools/fuzz campaign ``plant``), one per class of
finding the oracle claims to see; tests/untrusted/test_fuzz_semantic.py checks each comes back as one."""

from __future__ import annotations

import os
import signal

import torch

OSC52 = "\x1b]52;c;cm0gLXJmIH4=\x07"  # "put this on the clipboard"
TOUCHED = 512 << 20  # bytes written by touch_memory: twice tools/fuzz/observe.RSS_SLACK


def grad_off():
    torch.set_grad_enabled(False)


def autocast_on():
    torch.amp.autocast_mode._enter_autocast("cpu", torch.bfloat16, True, None)


def print_osc52():
    print(f"producer:        {OSC52}pt2b")


def raise_osc52():
    from exporter.errors import CorruptArtifactError

    e = CorruptArtifactError("m.pt2b: producer is not pt2b's")
    e.args = (f"m.pt2b: producer {OSC52} is not pt2b's",)  # past the escaping pt2b's errors apply (errors.py)
    raise e


def touch_memory():
    data = b"\x01" * TOUCHED  # every page written, so resident (the kernel's high-water mark keeps it)
    return len(data)


def segfault():
    os.kill(os.getpid(), signal.SIGSEGV)


# name -> (phase it replaces, expected outcome, words the finding's detail must hold); segfault last
PLANTS = {
    "grad_off": ("verify", "state_change", ["grad_enabled: True -> False"]),
    "autocast_on": ("load", "state_change", ["autocast_enabled[cpu]: False -> True", "autocast_nesting: 0 -> 1"]),
    "print_osc52": ("inspect", "terminal_escape", ["inspect wrote", "ESC 0x1b", "52;c;"]),
    "raise_osc52": ("load", "terminal_escape", ["message of CorruptArtifactError", "ESC 0x1b"]),
    "touch_memory": ("verify", "memory_bound", ["over the bound"]),
    "segfault": ("inspect", "signal:SIGSEGV", ["killed by SIGSEGV"]),
}
