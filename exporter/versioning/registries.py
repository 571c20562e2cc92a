"""The operator registries of torch releases, stored in the repository: every aten and prims
operator schema (and the dtypes torch.export's serializer names) of each release pt2b supports, in
``schemas/ops/registry@<major.minor>.json`` (package data), written by tools/op_registry.py run in
that release's venv:

    ~/.cache/pt2b-matrix/torch-2.11.0/bin/python -m tools.op_registry
    python -m tools.op_registry --check   # the stored one of the running release is current

``export_model(..., target_torch=...)`` writes an artifact against another release's registry
(exporter/versioning/retarget.py), and tests/test_registries.py compares neighbouring releases'
registries to find the real schema differences that the upgraders and downgraders cover.
"""

from __future__ import annotations

import dataclasses
import functools
import pathlib

import torch

from .. import package_data

ROOT = package_data.path("ops")
# (the quantized namespaces are left out: which of their ops are registered depends on what the
# process imported; retarget.py leaves them unchecked, as it does custom ops)
NAMESPACES = ("aten::", "prims::")


def release_key(version: str) -> str:
    """'2.11.0+cu130' -> '2.11'."""
    parts = version.split("+")[0].split(".")
    if len(parts) < 2 or not all(p.isdigit() for p in parts[:2]):
        raise ValueError(f"{version!r} is not a torch release (expected e.g. '2.11' or '2.11.0')")
    return f"{int(parts[0])}.{int(parts[1])}"


def path_for(release: str) -> pathlib.Path:
    return ROOT / f"registry@{release_key(release)}.json"


def stored_releases() -> list[str]:
    found = [p.stem.split("@", 1)[1] for p in ROOT.glob("registry@*.json")]
    return sorted(found, key=lambda r: tuple(int(x) for x in r.split(".")))


def running_registry() -> dict:
    """The running torch's registry as stored (the document tools/op_registry.py writes)."""
    from .._torch.serde import schema as S

    ops = {}
    for s in torch._C._jit_get_all_schemas():
        if s.name.startswith(NAMESPACES):
            ops[f"{s.name}.{s.overload_name or 'default'}"] = str(s)
    return {"torch": torch.__version__.split("+")[0], "scalar_types": sorted(m.name for m in S.ScalarType),
            "ops": dict(sorted(ops.items()))}


@dataclasses.dataclass(frozen=True)
class Registry:
    """One release's operators: ``schema(qname, overload)`` is its schema string, or None where the
    release has no such operator."""

    torch_version: str
    ops: dict
    scalar_types: frozenset

    @property
    def release(self) -> str:
        return release_key(self.torch_version)

    def schema(self, qualified_name: str, overload: str) -> str | None:
        return self.ops.get(f"{qualified_name}.{overload or 'default'}")

    def overloads(self, qualified_name: str) -> list[str]:
        prefix = qualified_name + "."
        return sorted(k[len(prefix):] for k in self.ops if k.startswith(prefix))


@functools.lru_cache(maxsize=None)
def load(release: str) -> Registry:
    """The stored registry of ``release`` ('2.11' or '2.11.0'); ValueError naming the stored ones
    where there is none."""
    path = path_for(release)
    if not path.is_file():
        raise ValueError(f"pt2b has no operator registry of torch {release_key(release)} "
                         f"(it has: {', '.join(stored_releases())})")
    doc = package_data.read_json("ops", path.name)
    return Registry(doc["torch"], doc["ops"], frozenset(doc["scalar_types"]))


def differences(release: str | None = None) -> list[str]:
    """The op keys whose schema differs between the running torch and the stored registry of
    ``release`` (default: the running one's). Meaningful in a fresh process: modules such as
    torch._inductor register more prims ops when imported (tools/op_registry.py --check runs it so)."""
    mine = running_registry()
    stored = load(release or mine["torch"])
    keys = set(mine["ops"]) | set(stored.ops)
    out = sorted(k for k in keys if mine["ops"].get(k) != stored.ops.get(k))
    if set(mine["scalar_types"]) != stored.scalar_types:
        out.append("scalar_types")
    return out
