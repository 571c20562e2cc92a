"""Format majors: how an artifact of an older major is brought to the current one in memory on load, and
how a program is written down to an older major when it fits (``STEPS``, one ``MajorStep`` a major).
Only major 1 has been released so far, so STEPS is empty; tests/format/test_format_majors.py proves the
mechanism. The rules: docs/format.md#versions."""

from __future__ import annotations

import dataclasses
from typing import Callable

from ..errors import ExportError, UnsupportedVersionError
from . import formats


@dataclasses.dataclass
class RawProgram:
    """An artifact's format version, header and program section, as bytes, between steps."""

    version: tuple[int, int]
    header: object  # layout.container.Header (its major/minor are the file's)
    program: bytes


@dataclasses.dataclass(frozen=True)
class MajorStep:
    """The step from major ``from_major`` to ``to_version`` (``STEPS[m] = MajorStep(from_major=m,
    to_version=(m + 1, k), what="...", up=..., down=...)``).

    A major bump may change anything (formats.py), so a step works on the raw file pieces before
    anything is unpacked: the header and the program section as bytes. The weight segments are never
    rewritten by a step (they stay mapped from the file); a step that moves them says so through the
    header it returns. `up` turns a program of major m into one of `to_version`; `down` (optional)
    does the reverse for `export_model(..., format_version=...)` / `pt2b upgrade --to` and raises
    ExportError naming what does not fit. `read_header` parses major m's fixed header when its layout
    differs from today's. Steps chain: a 1.x file read by a major-3 pt2b goes through STEPS[1] then
    STEPS[2]."""

    from_major: int
    to_version: tuple[int, int]
    what: str  # one line: what the bump changed
    up: Callable[[RawProgram, str], RawProgram]
    down: Callable[[RawProgram, tuple[int, int], str], RawProgram] | None = None
    read_header: Callable | None = None  # (first bytes, where, file size) -> Header


STEPS: dict[int, MajorStep] = {}


def register(step: MajorStep) -> MajorStep:
    """Add the step from ``step.from_major`` to the next major (one per major)."""
    if step.from_major in STEPS:
        raise ValueError(f"a step from format major {step.from_major} is already registered")
    if step.to_version[0] != step.from_major + 1:
        raise ValueError(f"a step from major {step.from_major} must lead to major {step.from_major + 1}, "
                         f"not {formats.version_str(step.to_version)}")
    STEPS[step.from_major] = step
    return step


def _missing(major: int, where: str, version) -> UnsupportedVersionError:
    cur = formats.version_str(formats.FORMAT_VERSION)
    return UnsupportedVersionError(
        f"{where}: format {formats.version_str(version)} is older than this pt2b reads ({cur}) and no "
        f"upgrader exists from major {major}; read it with an older pt2b and re-export it.")


def check_readable(version: tuple[int, int], where: str) -> None:
    """Raise UnsupportedVersionError unless ``version`` is the current major or reaches it by steps."""
    major = version[0]
    if major > formats.FORMAT_MAJOR:
        raise UnsupportedVersionError(
            f"{where}: format {formats.version_str(version)} is newer than this pt2b reads "
            f"({formats.version_str(formats.FORMAT_VERSION)}); upgrade pt2b.")
    for m in range(major, formats.FORMAT_MAJOR):
        if m not in STEPS:
            raise _missing(m, where, version)


def header_reader(major: int):
    """The function a step registers to parse major ``major``'s fixed header, or None where today's
    layout (serialize's container.unpack_header) applies."""
    step = STEPS.get(major)
    return step.read_header if step is not None else None


def upgrade(raw: RawProgram, where: str) -> tuple[RawProgram, list[str]]:
    """``raw`` brought to the current major, with one note per step applied."""
    notes = []
    while raw.version[0] < formats.FORMAT_MAJOR:
        step = STEPS.get(raw.version[0])
        if step is None:
            raise _missing(raw.version[0], where, raw.version)
        before = raw.version
        raw = step.up(raw, where)
        if tuple(raw.version) != tuple(step.to_version):
            raise AssertionError(f"the step from major {step.from_major} returned format "
                                 f"{formats.version_str(raw.version)}, not {formats.version_str(step.to_version)}")
        notes.append(f"format {formats.version_str(before)} -> {formats.version_str(raw.version)} in memory: {step.what}")
    return raw, notes


def downgrade(raw: RawProgram, target: tuple[int, int], where: str) -> RawProgram:
    """``raw`` (current major) written down to ``target``'s major; ExportError when a step has no
    writer or the program does not fit."""
    while raw.version[0] > target[0]:
        step = STEPS.get(raw.version[0] - 1)
        if step is None or step.down is None:
            raise ExportError(
                f"writing format {formats.version_str(target)} is not supported by this pt2b: there is no writer "
                f"for major {raw.version[0] - 1} (it writes {formats.FORMAT_MAJOR}.0 to "
                f"{formats.version_str(formats.FORMAT_VERSION)}).")
        lower = raw.version[0] - 1
        raw = step.down(raw, target if lower == target[0] else _latest(lower), where)
    return raw


def _latest(major: int) -> tuple[int, int]:
    return max((v for v in formats.KNOWN_VERSIONS if v[0] == major), default=(major, 0))


def writable(version: tuple[int, int]) -> bool:
    """Whether ``version`` can be written: the current major up to the current minor, or an older
    major every step down to which has a writer."""
    if version[0] == formats.FORMAT_MAJOR:
        return version <= formats.FORMAT_VERSION
    return version[0] < formats.FORMAT_MAJOR and all(
        m in STEPS and STEPS[m].down is not None for m in range(version[0], formats.FORMAT_MAJOR))
