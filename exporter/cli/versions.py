"""`pt2b --version`: the versions of pt2b, its artifact format and torch."""

from __future__ import annotations


def versions() -> str:
    """`pt2b --version`: pt2b's version, the artifact format version it writes, torch's version and
    the torch releases pt2b supports (its installed metadata: pyproject.toml's dependency)."""
    from importlib import metadata

    import torch
    from packaging.requirements import Requirement

    from ..version import __version__
    from ..versioning.formats import FORMAT_VERSION, version_str

    try:
        wanted = next((str(req.specifier) for req in map(Requirement, metadata.requires("pt2b") or ())
                       if req.name == "torch" and req.marker is None), "")
    except metadata.PackageNotFoundError:  # run from a source tree that is not installed
        wanted = ""
    supported = f" (pt2b supports torch {wanted})" if wanted else ""
    return f"pt2b {__version__}\nformat {version_str(FORMAT_VERSION)}\ntorch {torch.__version__}{supported}"
