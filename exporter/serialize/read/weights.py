"""Weight segments mapped back from the file: a view per segment (no copy), its checksum checked on
request, and each tensor record materialized as a strided view into its segment, so tensors that
shared a storage when written stay tied.
"""

from __future__ import annotations

import math

import torch

from ...errors import CorruptArtifactError
from ..mapping.dtypes import enum_to_dtype
from .integrity import check_segment_bounds
from .untrusted import extent_problem


def segment_view(mm, data_offset: int, data_size: int, seg, index: int, where: str) -> torch.Tensor:
    """A uint8 tensor over one segment of the mapped file (no copy)."""
    off, n = int(seg.offset), int(seg.nbytes)
    check_segment_bounds(off, n, data_size, index, where)
    if n == 0:
        return torch.empty(0, dtype=torch.uint8)
    return torch.frombuffer(mm, dtype=torch.uint8, count=n, offset=data_offset + off)


def materialize(record, views: list[torch.Tensor], where: str, file_size: int | None = None) -> torch.Tensor:
    """The tensor a record describes, as a strided view into its segment. Its element count and
    byte extent must fit an int64, and (``file_size`` given) a tensor whose zero strides repeat its
    bytes may not claim more bytes than the whole file holds: every use of it (a first call, a
    validation) would compute over that many elements."""
    name = record.name.decode("utf-8", "replace") if isinstance(record.name, bytes) else record.name
    here = f"{where}: tensor {name!r}"
    if not 0 <= record.segment < len(views):
        raise CorruptArtifactError(f"{here}: segment index {record.segment} out of range.")
    dtype = enum_to_dtype(record.dtype, here)
    sizes = [int(s) for s in (record.sizes if record.sizes is not None else [])]
    strides = [int(s) for s in (record.strides if record.strides is not None else [])]
    offset = int(record.storageOffset)
    if len(sizes) != len(strides) or any(s < 0 for s in sizes) or any(s < 0 for s in strides) or offset < 0:
        raise CorruptArtifactError(f"{here}: invalid shape {sizes} / strides {strides} / offset {offset}.")
    itemsize = dtype.itemsize
    why = extent_problem(sizes, strides, offset, itemsize)
    if why is not None:
        raise CorruptArtifactError(f"{here}: shape {sizes[:8]} / strides {strides[:8]} {why}; the file is damaged.")
    numel = math.prod(sizes)
    if file_size is not None and numel * itemsize > file_size:
        raise CorruptArtifactError(
            f"{here}: shape {sizes[:8]} / strides {strides[:8]} claims {numel * itemsize} bytes, more than the "
            f"{file_size}-byte file holds (zero strides repeat a few stored bytes); pt2b refuses such a tensor "
            f"because every use of it would compute over all of them.")
    view = views[record.segment]
    extent = 0 if 0 in sizes else offset + 1 + sum((s - 1) * st for s, st in zip(sizes, strides))
    if 0 not in sizes and extent * itemsize > view.numel():
        raise CorruptArtifactError(
            f"{here}: needs {extent * itemsize} bytes but its segment holds {view.numel()}."
        )
    if view.numel() % itemsize:
        view = view[: view.numel() - view.numel() % itemsize]
    storage = view.untyped_storage()
    byte_offset = view.storage_offset()
    if byte_offset % itemsize:
        raise CorruptArtifactError(f"{here}: segment is not aligned for {dtype}.")
    out = torch.empty(0, dtype=dtype)
    out.set_(storage, byte_offset // itemsize + offset, sizes, strides)
    return out
