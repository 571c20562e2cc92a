"""Lowering presets as data: schemas/opsets/<preset>@<torch major.minor>.json, each a named
opset (ops a result may hold) and the list of ops to decompose to reach it."""

from __future__ import annotations

import dataclasses
import functools
import json
import pathlib

import torch

from .. import package_data
from ..errors import LoweringError
from ..ops import op_name
from . import tables
from .preset_names import PRESETS, unknown_preset

OPSETS_DIR = package_data.path("opsets")
# The one list of preset names: the command line's help, the audit and the explorer read it.
DESCRIPTIONS = {
    "none": "functionalize only: no decomposition, every op stays at the level it was exported",
    "core": "torch's own table (torch.export.default_decompositions()), exactly what "
            "ep.run_decompositions() does; it lets non-core functional ops through",
    "core-tag": "only torch.Tag.core ops: keeps the core-tagged ops torch's table decomposes and "
                "decomposes every non-core op that has a registered decomposition",
    "max": "every registered decomposition, down to the ops that have none (the PrimTorch end)",
}


@dataclasses.dataclass(frozen=True)
class Preset:
    name: str
    torch_version: str  # major.minor the lists were computed for
    description: str
    decompose: tuple[str, ...]  # op names to decompose
    opset: tuple[str, ...] | None  # ops a result may hold; None: any functional op
    closed_opset: bool  # an op outside `opset` in the result is an error (else only reported)

    @property
    def key(self) -> str:
        return f"{self.name}@{self.torch_version}"

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), indent=1, sort_keys=True) + "\n"


def torch_minor() -> str:
    major, minor = torch.__version__.split("+")[0].split(".")[:2]
    return f"{major}.{minor}"


def core_names() -> tuple[str, ...]:
    """Every registered aten/prims overload tagged torch.Tag.core (from the dispatcher's full list,
    not torch.ops' lazily filled attributes)."""
    ops = set()
    for qualified in torch._C._dispatch_get_all_op_names():
        ns, _, rest = qualified.partition("::")
        if ns not in ("aten", "prims"):
            continue
        name, _, overload = rest.partition(".")
        try:
            op = getattr(getattr(getattr(torch.ops, ns), name), overload or "default")
        except (AttributeError, RuntimeError):
            continue
        if tables.is_core(op):
            ops.add(op_name(op))
    return tuple(sorted(ops))


def compute(name: str) -> Preset:
    """The preset ``name`` computed from the running torch."""
    if name == "none":
        decompose, opset, closed = (), None, False
    elif name == "core":
        decompose = tuple(sorted(op_name(op) for op in tables.torch_default_table()))
        opset, closed = core_names(), False
    elif name == "core-tag":
        decompose = tuple(sorted(op_name(op) for op in tables.available_decompositions() if not tables.is_core(op)))
        opset, closed = core_names(), True
    elif name == "max":
        decompose = tuple(sorted(op_name(op) for op in tables.available_decompositions()))
        opset, closed = None, False
    else:
        raise LoweringError(unknown_preset(name) or f"unknown preset {name!r}.")
    return Preset(name, torch_minor(), DESCRIPTIONS[name], decompose, opset, closed)


def frozen_path(name: str, version: str) -> pathlib.Path:
    return OPSETS_DIR / f"{name}@{version}.json"


@functools.cache
def load(spec: str) -> Preset:
    """"core" (this torch's frozen list, else computed) or "core@2.13" (that frozen list)."""
    name, _, version = spec.partition("@") if isinstance(spec, str) else (spec, "", "")
    if name not in PRESETS:
        raise LoweringError(unknown_preset(spec) or f"unknown preset {spec!r}.")
    path = frozen_path(name, version or torch_minor())
    if path.exists():
        data = package_data.read_json("opsets", path.name)
        return Preset(data["name"], data["torch_version"], data["description"], tuple(data["decompose"]),
                      None if data["opset"] is None else tuple(data["opset"]), data["closed_opset"])
    if version and version != torch_minor():
        frozen = sorted(p.stem for p in OPSETS_DIR.glob(f"{name}@*.json"))
        raise LoweringError(f"no frozen opset {spec!r}; available: {', '.join(frozen) or 'none'}.")
    return compute(name)


def diff(a: Preset, b: Preset) -> dict[str, tuple[list[str], list[str]]]:
    """{"opset": (only in a, only in b), "decompose": (...)} between two presets."""
    out = {}
    for field in ("opset", "decompose"):
        sa, sb = set(getattr(a, field) or ()), set(getattr(b, field) or ())
        out[field] = (sorted(sa - sb), sorted(sb - sa))
    return out


def describe(p: Preset) -> str:
    lines = [f"{p.key}: {p.description}",
             f"  decomposes {len(p.decompose)} ops; opset: "
             + ("any op the table leaves" if p.opset is None else f"{len(p.opset)} ops")
             + (" (closed: anything else is an error)" if p.closed_opset else "")]
    lines += [f"  {name}" for name in p.opset or ()]
    return "\n".join(lines)


def frozen_releases(name: str = "core") -> list[str]:
    """The torch releases (major.minor) whose preset ``name`` is frozen in schemas/opsets/, oldest first."""
    found = [p.stem.partition("@")[2] for p in OPSETS_DIR.glob(f"{name}@*.json")]
    return sorted(found, key=release_key)


def release_key(version: str) -> tuple[int, ...]:
    """"2.13" -> (2, 13): releases in order."""
    return tuple(int(x) for x in version.split("."))


def release_changes(name: str = "core", examples: int = 4) -> str:
    """A markdown table of how preset ``name``'s opset and decomposition table changed from each frozen
    release to the next (README's section; python -m tools.freeze_presets --changes)."""
    releases = frozen_releases(name)
    lines = [f"| {name} | opset (ops) | opset changes | decomposition table (ops) | table changes |",
             "|---|---|---|---|---|"]

    def listed(added, removed):
        parts = [f"+{len(added)}: {', '.join(added[:examples])}{', ...' if len(added) > examples else ''}"
                 if added else "", f"-{len(removed)}: {', '.join(removed[:examples])}"
                 f"{', ...' if len(removed) > examples else ''}" if removed else ""]
        return "; ".join(x for x in parts if x) or "none"

    prev = None
    for version in releases:
        p = load(f"{name}@{version}")
        if prev is None:
            lines.append(f"| {version} | {len(p.opset or ())} | (first) | {len(p.decompose)} | (first) |")
        else:
            d = diff(prev, p)
            lines.append(f"| {prev.torch_version} -> {version} | {len(p.opset or ())} | "
                         f"{listed(d['opset'][1], d['opset'][0])} | {len(p.decompose)} | "
                         f"{listed(d['decompose'][1], d['decompose'][0])} |")
        prev = p
    return "\n".join(lines)


def release_summary(name: str = "core") -> str:
    """One line: preset ``name``'s opset and table size on each frozen release (README)."""
    ps = [load(f"{name}@{v}") for v in frozen_releases(name)]
    sizes = {len(p.opset or ()) for p in ps}
    opset = (f"{sizes.pop()} ops on every release" if len(sizes) == 1 and all(p.opset == ps[0].opset for p in ps)
             else ", ".join(f"{len(p.opset or ())} ({p.torch_version})" for p in ps))
    return (f"`{name}` across torch {ps[0].torch_version} to {ps[-1].torch_version}: its opset {opset}; its "
            f"decomposition table " + ", ".join(f"{len(p.decompose)} ops ({p.torch_version})" for p in ps) + ".")
