"""Weights go to the file in pieces, and the disk syncs what is written as they go
(serialize/write/weights.write_segments, writer.SYNC_BEHIND): the same bytes as one write per
segment, and a sync started before the last weight is written."""

from __future__ import annotations

import hashlib
import os
import threading
import zlib

import pytest
import torch

from exporter import export_model, load
from exporter.serialize import reader
from exporter.serialize.write import weights, writer


class Stack(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = torch.nn.ModuleList(torch.nn.Linear(256, 256) for _ in range(6))  # 6 x 257 KiB

    def forward(self, x):
        for layer in self.layers:
            x = layer(x).relu()
        return x


def test_weights_written_in_pieces_are_the_same_bytes_synced_as_they_go(tmp_path, monkeypatch):
    torch.manual_seed(0)
    m = Stack().eval()
    x = torch.randn(3, 256)
    whole, pieces = str(tmp_path / "whole.pt2b"), str(tmp_path / "pieces.pt2b")
    export_model(m, (x,), path=whole)

    sizes, synced = [], threading.Event()  # the file's size at each sync of the weights

    def datasync(fd):
        sizes.append(os.fstat(fd).st_size)
        synced.set()
        os.fsync(fd)

    real_write = weights._write_views

    def write_waiting_for_the_first_sync(f, wp, views, data_start, progress):
        done = [0]

        def step(n):
            progress(n)
            done[0] += n
            if done[0] >= writer.SYNC_BEHIND:  # the sync thread's turn, so that the test does not race it
                assert synced.wait(30)
        return real_write(f, wp, views, data_start, step)

    monkeypatch.setattr(weights, "WRITE_PIECE", 40 << 10)  # 257 KiB weights: 7 pieces each
    monkeypatch.setattr(writer, "SYNC_BEHIND", 300 << 10)
    monkeypatch.setattr(writer, "_DATASYNC", datasync)
    monkeypatch.setattr(weights, "_write_views", write_waiting_for_the_first_sync)
    export_model(m, (x,), path=pieces)

    with open(whole, "rb") as a, open(pieces, "rb") as b:
        assert a.read() == b.read()
    final = os.path.getsize(pieces)
    weights_bytes = sum(p.numel() * p.element_size() for p in m.parameters())
    assert len(sizes) >= 2, sizes  # a sync behind the writes (one at a time), then the one after the weights
    assert sizes == sorted(sizes) and sizes[0] < weights_bytes // 2 < final, (sizes, weights_bytes)
    got = load(pieces).module()(x)
    assert torch.equal(got, m(x))


def test_written_checksums_are_zlibs_crc32_and_sha256_of_the_bytes(tmp_path):
    """The writer's CRC32 (zlib-ng's where installed) is the standard one: what zlib, and so any
    reader of an older format, computes over the segment's bytes in the file."""
    torch.manual_seed(0)
    path = str(tmp_path / "m.pt2b")
    export_model(Stack().eval(), (torch.randn(3, 256),), path=path)
    art = reader.open_artifact(path)
    try:
        data = open(path, "rb").read()
        segments = list(art.program.segments)
        digests = bytes(art.program.weightDigests)
        assert len(segments) == 13 and len(digests) == 32 * 13  # 12 weights, the example input
        for i, seg in enumerate(segments):
            start = art.header.data_offset + int(seg.offset)
            body = data[start:start + int(seg.nbytes)]
            assert int(seg.checksum) == zlib.crc32(body)
            assert digests[32 * i:32 * (i + 1)] == hashlib.sha256(body).digest()
    finally:
        art.mm.close()


def test_a_graph_that_fails_to_serialize_stops_the_weights_and_leaves_no_file(tmp_path, monkeypatch):
    """The weights go out on their own thread while the graph is serialized: when serializing fails,
    the weights' write gives up at its next piece, the error is the serializer's, and neither the
    file nor its temporary is left."""
    import time

    from exporter.errors import UnsupportedValueError

    torch.manual_seed(0)
    m = Stack().eval()
    pieces_written, started = [], threading.Event()
    real_write = weights._write_views

    released = threading.Event()

    def counting_write(f, wp, views, data_start, progress):
        def count(n):
            pieces_written.append(n)
            started.set()
            if len(pieces_written) == 1:  # the first piece waits for the failure, then for the give-up
                released.wait(30)
                for _ in range(1000):
                    progress(0)  # raises once the writer has given up
                    time.sleep(0.01)
            progress(n)
        return real_write(f, wp, views, data_start, count)

    def failing_serialize(ep):
        assert started.wait(30), "the weights did not start before the graph was serialized"
        released.set()
        raise UnsupportedValueError("a value this test refuses")

    monkeypatch.setattr(weights, "WRITE_PIECE", 4 << 10)  # 6 x 257 KiB weights: 390 pieces
    monkeypatch.setattr(weights, "_write_views", counting_write)
    monkeypatch.setattr(writer, "serialize_graph", failing_serialize)
    path = tmp_path / "m.pt2b"
    with pytest.raises(UnsupportedValueError, match="a value this test refuses"):
        export_model(m, (torch.randn(3, 256),), path=str(path))
    assert not path.exists() and list(tmp_path.iterdir()) == []
    assert pieces_written == [4 << 10]  # given up after the first piece
