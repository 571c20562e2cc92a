"""How pt2b's tools talk: progress bars for long commands, and torch's internal chatter kept out.

Bars are tqdm's, drawn on stderr (stdout stays machine-readable), and only when stderr is a terminal
and pt2b is not quiet: ``pt2b --quiet`` (:func:`set_quiet`) or ``PT2B_QUIET=1`` in the environment
turns them off. tqdm is imported when a bar is first drawn (a command without bars, such as
``pt2b verify`` in a script, does not pay for it). Library functions stay silent: their long loops take an optional ``track`` argument
(what :func:`tracker` returns), which the command line passes.
"""

from __future__ import annotations

import contextlib
import logging
import sys
import threading
import warnings
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from ..util.env_switch import env_switch
from . import terminal

_quiet: bool | None = None  # None: $PT2B_QUIET decides

# Warnings torch raises from its own internals while pt2b drives it (nothing the user's code did):
# (category, message regex). torch.export's module-call-graph update deep-copies pytree specs, and
# copying a LeafSpec trips torch's own deprecation of isinstance(spec, LeafSpec).
TORCH_INTERNAL_WARNINGS: tuple[tuple[type[Warning], str], ...] = (
    (FutureWarning, r"`isinstance\(treespec, LeafSpec\)` is deprecated"),
)
# torch's log lines about its own bookkeeping: (logger, message format). Deserializing a program whose
# range constraints name an unbacked symbol (while_loop's u0) that the top graph does not show.
TORCH_INTERNAL_LOGS: tuple[tuple[str, str], ...] = (
    ("torch._export.serde.serialize", "Symbol %s did not appear in the graph that was deserialized"),
)


def set_quiet(quiet: bool | None = True) -> None:
    """Turn progress off (True), on where stderr is a terminal (False), or leave it to $PT2B_QUIET (None)."""
    global _quiet
    _quiet = quiet


def is_quiet() -> bool:
    if _quiet is not None:
        return _quiet
    return env_switch("PT2B_QUIET", False)


def enabled() -> bool:
    """Whether bars are drawn now: stderr is a terminal and pt2b is not quiet."""
    if is_quiet():
        return False
    try:
        return bool(sys.stderr.isatty())
    except (AttributeError, ValueError):  # no stderr, or a closed one
        return False


def _bar(desc: str, total=None, unit: str = "it", **kw):
    """A tqdm bar, or None where bars are not drawn (tqdm then stays unimported)."""
    if not enabled():
        return None
    from tqdm import tqdm

    # the bar's own control sequences go to the terminal as they are; its text is escaped like any output
    return tqdm(desc=terminal.escape(desc), total=total, unit=unit, file=terminal.raw(sys.stderr),
                dynamic_ncols=True, **kw)


def _tqdm():
    """tqdm's class where a bar may be on screen (tqdm imported), else None."""
    module = sys.modules.get("tqdm")
    return getattr(module, "tqdm", None)


def track(items: Iterable, desc: str, *, total: int | None = None, unit: str = "it",
          label: Callable[[Any], str] | None = None) -> Iterator:
    """Iterate over ``items`` with a bar. ``label(item)`` names the item being worked on (shown beside
    the bar while its turn runs); an item counts as done when the loop asks for the next one."""
    if total is None:
        try:
            total = len(items)  # type: ignore[arg-type]
        except TypeError:
            pass
    b = _bar(desc, total, unit)
    if b is None:
        yield from items
        return
    try:
        for item in items:
            if label is not None:
                b.set_postfix_str(terminal.escape(label(item)))  # refreshes: the name of a slow item shows while it runs
            yield item
            b.update(1)
        b.set_postfix_str("", refresh=False)
    finally:
        b.close()


def tracker(desc: str, unit: str = "it") -> Callable[..., Iterator]:
    """A ``track=`` argument for pt2b's library loops: ``track(items, total=None, label=None)``
    iterates ``items`` under a bar named ``desc``."""

    def wrap(items, total=None, label=None):
        return track(items, desc, total=total, unit=unit, label=label)

    return wrap


def close_all() -> None:
    """Close the bars still open (a command that failed inside a loop), so that what is written next
    starts on a line of its own."""
    for inst in list(getattr(_tqdm(), "_instances", ())):
        inst.close()


@contextlib.contextmanager
def status(desc: str) -> Iterator[None]:
    """One long step with nothing to count: ``desc`` and a running clock while it runs, erased after."""
    b = _bar(desc, None, bar_format="{desc} [{elapsed}]", leave=False)
    if b is None:
        yield
        return
    done = threading.Event()

    def tick():
        while not done.wait(0.5):
            b.refresh()

    clock = threading.Thread(target=tick, name="pt2b-progress", daemon=True)
    clock.start()
    try:
        yield
    finally:
        done.set()
        clock.join()
        b.close()


def write(line: str = "", file=None) -> None:
    """print() for lines written while a bar may be on screen (the bar is cleared, then redrawn)."""
    tqdm = _tqdm()
    if tqdm is None:
        print(line, file=sys.stdout if file is None else file)
    else:
        tqdm.write(line, file=sys.stdout if file is None else file)


@contextlib.contextmanager
def printing(file=None) -> Iterator[None]:
    """Around several print() calls made while a bar may be on screen."""
    tqdm = _tqdm()
    with contextlib.nullcontext() if tqdm is None else tqdm.external_write_mode(
            file=sys.stdout if file is None else file):
        yield


class _TorchLogFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not any(record.name == name and record.msg == msg for name, msg in TORCH_INTERNAL_LOGS)


@contextlib.contextmanager
def torch_internals_quiet() -> Iterator[None]:
    """Around pt2b's own work (the command line, the demo): drop TORCH_INTERNAL_WARNINGS and
    TORCH_INTERNAL_LOGS, torch talking about itself; every other warning, those about the user's code
    included, shows as usual. Not thread-safe (warnings.catch_warnings is not): for entry points."""
    filt = _TorchLogFilter()
    loggers = [logging.getLogger(name) for name in dict.fromkeys(n for n, _ in TORCH_INTERNAL_LOGS)]
    for lg in loggers:
        lg.addFilter(filt)
    try:
        with warnings.catch_warnings():
            for category, message in TORCH_INTERNAL_WARNINGS:
                warnings.filterwarnings("ignore", message=message, category=category)
            yield
    finally:
        for lg in loggers:
            lg.removeFilter(filt)
