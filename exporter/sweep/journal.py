"""A sweep's records file: one JSON line per finished case, appended and synced as it finishes, read
back for resume (the last record of a case counts; a half-written last line is dropped)."""

from __future__ import annotations

import json
import os

from ..errors import SweepError
from .isolate import FINAL

# what differs between two runs of the same case however it ran: the others are the same records
# whichever executor ran them
RUN_KEYS = ("seconds", "cpu_seconds", "peak_rss_mb", "host", "node", "python", "executor", "attempts", "log_tail",
            "traceback")


def comparable(record: dict) -> dict:
    """The record without what differs from run to run (timings, host, executor, attempts)."""
    return {k: v for k, v in record.items() if k not in RUN_KEYS}


def read(path: str) -> dict[str, dict]:
    """Case id -> its last record in ``path`` (none when the file is not there)."""
    records = {}
    if not os.path.exists(path):
        return records
    with open(path, "rb") as f:
        data = f.read()
    for n, line in enumerate(data.split(b"\n")):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except ValueError:
            if data.endswith(line):  # the last line, cut short when the sweep was killed
                break
            raise SweepError(f"{path}, line {n + 1}, is not a sweep record: give the records file of a sweep "
                             f"(JSON lines) or a new path.") from None
        if not isinstance(rec, dict) or "id" not in rec or "outcome" not in rec:
            raise SweepError(f"{path}, line {n + 1}, is not a sweep record (no id and outcome): give the records "
                             f"file of a sweep or a new path.")
        records[rec["id"]] = rec
    return records


def done(records: dict[str, dict]) -> set[str]:
    """The ids whose last record is a final outcome (not run again on resume)."""
    return {i for i, r in records.items() if r["outcome"] in FINAL}


class Journal:
    """The records file, open for appending: a half-written last line is cut off first."""

    def __init__(self, path: str):
        self.path = path
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        if os.path.exists(path):
            with open(path, "rb+") as f:
                data = f.read()
                keep = data.rfind(b"\n") + 1
                if keep != len(data):
                    f.truncate(keep)
        self.f = open(path, "ab")

    def append(self, record: dict) -> None:
        self.f.write((json.dumps(record, allow_nan=True) + "\n").encode())
        self.f.flush()
        os.fsync(self.f.fileno())

    def close(self) -> None:
        self.f.close()
