"""Tensor data of a program: planned into aligned segments on write, mapped back with mmap.

Tensors that share a storage (tied weights, views) share one segment and stay tied on load.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import hashlib
import math
import zlib

import torch

from ..errors import CorruptArtifactError
from .container import align
from .untrusted import extent_problem
from .dtypes import dtype_to_enum, enum_to_dtype
from .generated import pt2b_generated as G

KIND_NAMES = {G.TensorKind.PARAMETER: "parameter", G.TensorKind.BUFFER: "buffer",
              G.TensorKind.CONSTANT: "constant", G.TensorKind.EXAMPLE_INPUT: "example input"}


@dataclasses.dataclass
class SegmentPlan:
    storage: torch.UntypedStorage
    offset: int  # relative to the data section
    nbytes: int
    checksum: int = 0
    digest: bytes = b""  # sha256 of the bytes (format 1.3+)


@dataclasses.dataclass
class WeightPlan:
    records: list  # G.TensorRecordT
    segments: list[SegmentPlan]
    data_size: int


def plan(tensors: list[tuple[str, int, torch.Tensor]], alignment: int) -> WeightPlan:
    """Assign every (name, kind, tensor) a segment; one segment per distinct storage."""
    by_storage: dict[tuple[int, int], int] = {}
    segments: list[SegmentPlan] = []
    records = []
    offset = 0
    for name, kind, t in tensors:
        if t.device.type != "cpu":
            t = t.detach().cpu()
        requires_grad = t.requires_grad
        t = t.detach()
        storage = t.untyped_storage()
        key = (storage.data_ptr(), storage.nbytes())
        if key not in by_storage or storage.nbytes() == 0:
            by_storage[key] = len(segments)
            segments.append(SegmentPlan(storage, offset, storage.nbytes()))
            offset = align(offset + storage.nbytes(), alignment)
        r = G.TensorRecordT()
        r.name = name
        r.kind = kind
        r.dtype = dtype_to_enum(t.dtype, f"tensor {name!r}")
        r.sizes = list(t.shape)
        r.strides = list(t.stride())
        r.storageOffset = t.storage_offset()
        r.segment = by_storage[key]
        r.requiresGrad = requires_grad
        records.append(r)
    return WeightPlan(records, segments, offset)


def storage_bytes(storage: torch.UntypedStorage) -> memoryview:
    """A zero-copy byte view of a CPU storage."""
    if storage.nbytes() == 0:
        return memoryview(b"")
    t = torch.empty(0, dtype=torch.uint8).set_(storage)
    return memoryview(t.numpy()).cast("B")


DIGEST_SIZE = 32  # sha256


def digest(data) -> bytes:
    """The digest format 1.3 records of a segment's bytes (sha256)."""
    return hashlib.sha256(data).digest()


def write_segments(f, wp: WeightPlan, data_start: int, *, digests: bool = True) -> None:
    """Write every segment at data_start + its offset, filling checksums (and with ``digests``, the
    sha256 digests) in the plan. They are computed on other threads while the segments are written
    (zlib, hashlib and file writes release the GIL on large buffers): a save of weights costs about
    one pass over them, not three."""
    views = [storage_bytes(seg.storage) for seg in wp.segments]
    with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
        sums = pool.map(zlib.crc32, views)
        hashes = pool.map(digest, views) if digests else ()
        pos = data_start
        for seg, mv in zip(wp.segments, views):
            target = data_start + seg.offset
            if target > pos:
                f.write(b"\0" * (target - pos))
            f.write(mv)
            pos = target + seg.nbytes
        end = data_start + wp.data_size
        if end > pos:
            f.write(b"\0" * (end - pos))
        for seg, checksum in zip(wp.segments, sums):
            seg.checksum = checksum
        for seg, d in zip(wp.segments, hashes):
            seg.digest = d


def segment_view(mm, data_offset: int, data_size: int, seg, index: int, where: str) -> torch.Tensor:
    """A uint8 tensor over one segment of the mapped file (no copy)."""
    off, n = int(seg.offset), int(seg.nbytes)
    if off + n > data_size:
        raise CorruptArtifactError(
            f"{where}: segment {index} [{off}, {off + n}) lies outside the data section "
            f"({data_size} bytes); the file is truncated or damaged."
        )
    if n == 0:
        return torch.empty(0, dtype=torch.uint8)
    return torch.frombuffer(mm, dtype=torch.uint8, count=n, offset=data_offset + off)


def verify_segment(view: torch.Tensor, seg, index: int, where: str, recorded: bytes | None = None) -> None:
    """Check one segment's bytes: against its sha256 digest where the file records one (``recorded``,
    format 1.3+), else against its CRC32."""
    data = memoryview(view.numpy()) if view.numel() else b""
    if recorded is not None:
        ok = digest(data) == recorded
    else:
        ok = not view.numel() or zlib.crc32(data) == int(seg.checksum)
    if not ok:
        raise CorruptArtifactError(
            f"{where}: checksum mismatch in weight segment {index} ({'sha256' if recorded is not None else 'CRC32'}); "
            f"the weights are damaged or are not the ones the program section records "
            f"(re-export or re-copy the file)."
        )


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
