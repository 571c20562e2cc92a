"""Tensor data of a program planned into aligned weight segments and written, with their CRC32 and
sha256 digests (the data section of docs/format.md). Tensors that share a storage (tied weights,
views) share one segment; read/weights.py maps them back.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses

import torch

from ...layout.generated import pt2b_generated as G
from ...layout.container import align
from ...layout.segments import crc32, digest
from ..mapping.dtypes import dtype_to_enum


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


WRITE_PIECE = 64 << 20  # bytes per write call: a big segment goes to the file in pieces


def write_segments(f, wp: WeightPlan, data_start: int, *, digests: bool = True, written=None,
                   progress=None) -> None:
    """Write every segment at data_start + its offset, filling checksums (and with ``digests``, the
    sha256 digests) in the plan. They are computed on other threads while the segments are written
    (the CRC32, hashlib and file writes release the GIL on large buffers): a save of weights costs
    about one pass over them, not three. Segments go to the file in pieces of WRITE_PIECE bytes, straight
    from the tensors' memory, ``progress(nbytes)`` called after each (the writer starts the disk's
    sync of what is written so far there, so that dirty pages never pile up to the kernel's limit,
    where it stalls the writer). ``written()`` is called once the bytes are in the file, before the
    checksums are waited for (the writer starts the disk's sync of the weights there)."""
    views = [storage_bytes(seg.storage) for seg in wp.segments]
    with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
        sums = pool.map(crc32, views)
        hashes = pool.map(digest, views) if digests else ()
        try:
            _write_views(f, wp, views, data_start, progress)
        except BaseException:
            pool.shutdown(cancel_futures=True)  # a write that failed or was given up: hash no more
            raise
        if written is not None:
            written()
        for seg, checksum in zip(wp.segments, sums):
            seg.checksum = checksum
        for seg, d in zip(wp.segments, hashes):
            seg.digest = d


def _write_views(f, wp: WeightPlan, views: list, data_start: int, progress) -> None:
    """The segments' bytes at their offsets, zeros between them and to the data section's end."""
    pos = data_start
    for seg, mv in zip(wp.segments, views):
        target = data_start + seg.offset
        if target > pos:
            f.write(b"\0" * (target - pos))
        for start in range(0, len(mv), WRITE_PIECE):
            piece = mv[start:start + WRITE_PIECE]
            f.write(piece)
            if progress is not None:
                progress(len(piece))
        pos = target + seg.nbytes
    end = data_start + wp.data_size
    if end > pos:
        f.write(b"\0" * (end - pos))
