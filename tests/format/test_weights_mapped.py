"""Weights are mmap'd, not copied: every loaded tensor's memory lies inside the artifact's own file
mapping, at the file offset of its segment (README, docs/format.md).

Equal bytes and 64-byte alignment do not prove this (a heap copy has both: torch's CPU allocator
aligns to 64), so these tests look at where the memory is: the address ranges the kernel lists for
the artifact in /proc/self/maps, and the address of the reader's own mmap buffer."""

import ctypes
import os
import pathlib
import sys

import pytest
import torch

from exporter import export_model, load, load_for_backend
from tools.corpus.zoo import make_case
from exporter.serialize import reader

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux") or not os.path.exists("/proc/self/maps"),
                                reason="reads the process's mappings from /proc/self/maps (Linux)")


def _mappings(path) -> list[tuple[int, int, int]]:
    """(start, end, file offset) of every mapping of ``path`` in this process."""
    real = os.path.realpath(path)
    out = []
    with open("/proc/self/maps") as f:
        for line in f:
            parts = line.split(None, 5)
            if len(parts) == 6 and parts[5].rstrip("\n") == real:
                start, end = (int(x, 16) for x in parts[0].split("-"))
                out.append((start, end, int(parts[2], 16)))
    return out


def _extent(t: torch.Tensor) -> tuple[int, int]:
    """[first byte, one past the last byte) of the memory ``t`` reads."""
    if t.numel() == 0:
        return t.data_ptr(), t.data_ptr()
    span = 1 + sum((s - 1) * st for s, st in zip(t.shape, t.stride()))
    return t.data_ptr(), t.data_ptr() + span * t.element_size()


def _file_offset(addr: int, end: int, maps) -> int | None:
    """The file offset that address range [addr, end) maps, or None when it lies outside every
    mapping of the file."""
    for start, stop, offset in maps:
        if start <= addr and end <= stop:
            return addr - start + offset
    return None


def assert_in_file_mapping(tensors: dict, path, where: str) -> int:
    """Every non-empty tensor in ``tensors`` reads memory inside a mapping of ``path`` whose file
    bytes are the tensor's bytes; returns how many were checked."""
    maps = _mappings(path)
    assert maps, f"{where}: {path} is not mapped into this process (no tensor references the mapping: were the weights copied?)"
    data = pathlib.Path(path).read_bytes()
    checked = 0
    for name, t in tensors.items():
        if not isinstance(t, torch.Tensor) or t.numel() == 0:
            continue
        lo, hi = _extent(t)
        off = _file_offset(lo, hi, maps)
        assert off is not None, (
            f"{where}: {name} ({t.dtype}{list(t.shape)}) at {lo:#x}-{hi:#x} lies outside the mappings of "
            f"{path} {[(hex(a), hex(b)) for a, b, _ in maps]}: its weights were copied")
        # the address names the place in the file that holds this tensor's bytes
        assert data[off:off + (hi - lo)] == ctypes.string_at(lo, hi - lo), f"{where}: {name}"
        checked += 1
    return checked


@pytest.fixture(scope="module", params=["dtypes", "tied_weights", "transformer_encoder"])
def artifact(request, tmp_path_factory):
    case = make_case(request.param)
    path = tmp_path_factory.mktemp("mapped") / f"{request.param}.pt2b"
    export_model(case.model, case.args, path, kwargs=case.kwargs, dynamic_shapes=case.dynamic_shapes,
                 strict=case.strict)
    return path, case


def test_loaded_weights_live_in_the_file_mapping(artifact):
    path, case = artifact
    prog = load(path)
    ep = prog.exported_program()
    n = assert_in_file_mapping(dict(ep.state_dict), path, "state_dict")
    n += assert_in_file_mapping(dict(ep.constants), path, "constants")
    assert n >= 2
    # what prog(x) runs: the unlifted module's parameters and buffers are the same mapped memory
    assert_in_file_mapping(dict(ep.module().state_dict(keep_vars=True)), path, "module")
    if case.name == "tied_weights":  # one segment, two names: both views of the same mapped bytes
        sd = ep.state_dict
        ptrs = {t.untyped_storage().data_ptr() for t in sd.values()}
        assert len(ptrs) < len(sd)


def test_reader_tensors_are_views_of_its_own_mmap(artifact):
    """The storage of every tensor is the reader's mmap buffer at the segment's offset (identity,
    not equality)."""
    path, _ = artifact
    art = reader.open_artifact(path)
    base = ctypes.addressof(ctypes.c_char.from_buffer(art.mm))  # the mapping pt2b made (ACCESS_COPY: writable)
    tensors = reader.load_tensors(art)
    starts = {int(s.offset) for s in art.program.segments if int(s.nbytes)}
    seen = set()
    for name, (_, t, _) in tensors.items():
        storage = t.untyped_storage()
        if storage.nbytes() == 0:
            continue
        rel = storage.data_ptr() - base - art.header.data_offset
        assert rel in starts, f"{name}: storage at {storage.data_ptr():#x} is not a segment of the mapping at {base:#x}"
        assert rel + storage.nbytes() <= art.header.data_size, name
        seen.add(rel)
    assert seen == starts  # every segment is used, and by views of the mapping
    assert_in_file_mapping({k: v[1] for k, v in tensors.items()}, path, "load_tensors")


def test_cache_hit_weights_live_in_the_cache_entry_mapping(artifact, tmp_path, monkeypatch):
    path, _ = artifact
    monkeypatch.setenv("PT2B_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("PT2B_CACHE", raising=False)
    load_for_backend(path, "core", cache=True)
    hit = load_for_backend(path, "core", cache=True)
    assert hit.from_cache
    (entry,) = (tmp_path / "cache").glob("lowered-*.pt2b")
    ep = hit.exported_program()
    assert assert_in_file_mapping(dict(ep.state_dict), entry, "cache hit") >= 1
