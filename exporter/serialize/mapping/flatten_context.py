"""A tensor subclass's flatten context (the second result of ``__tensor_flatten__``) as msgpack and
back: plain data with a tag for each type msgpack does not keep apart (tuple, dict, dtype, device,
size), so the reader rebuilds exactly what the writer saw and never constructs anything else."""

from __future__ import annotations

import msgpack
import torch

from ...errors import CorruptArtifactError, UnsupportedValueError
from ...util import nesting

MAX_DEPTH = 32
MAX_BYTES = 1 << 20
_SCALARS = (bool, int, float, str, type(None))
_DTYPES = {str(d).removeprefix("torch."): d for d in vars(torch).values() if isinstance(d, torch.dtype)}


def encode(ctx, what: str) -> bytes:
    """msgpack of ``ctx``; an UnsupportedValueError naming ``what`` and the value it cannot store."""
    if nesting.deeper_than(ctx, MAX_DEPTH):
        raise UnsupportedValueError(f"{what}: its flatten context nests more than {MAX_DEPTH} levels deep.")
    try:
        raw = msgpack.packb(_tagged(ctx, what), use_bin_type=True)
    except (TypeError, ValueError, OverflowError) as e:
        raise UnsupportedValueError(f"{what}: its flatten context cannot be stored: {e}") from None
    if len(raw) > MAX_BYTES:
        raise UnsupportedValueError(f"{what}: its flatten context is {len(raw)} bytes; the limit is {MAX_BYTES}.")
    return raw


def _tagged(v, what: str):
    if isinstance(v, torch.Size):
        return {"size": [int(x) for x in v]}
    if isinstance(v, _SCALARS):
        return v
    if isinstance(v, torch.dtype):
        return {"dtype": str(v).removeprefix("torch.")}
    if isinstance(v, torch.device):
        return {"device": str(v)}
    if isinstance(v, list):
        return {"list": [_tagged(x, what) for x in v]}
    if isinstance(v, tuple) and type(v) is tuple:
        return {"tuple": [_tagged(x, what) for x in v]}
    if isinstance(v, dict) and type(v) is dict and all(isinstance(k, str) for k in v):
        return {"dict": [[k, _tagged(x, what)] for k, x in v.items()]}
    raise UnsupportedValueError(
        f"{what}: its flatten context holds a {type(v).__module__}.{type(v).__qualname__}, which .pt2b does not "
        f"store (it stores None, bools, numbers, strings, lists, tuples, dicts with string keys, dtypes, devices "
        f"and sizes, and never pickles). Make __tensor_flatten__ return plain data in its context.")


def decode(raw: bytes, where: str):
    """The context ``encode`` wrote; CorruptArtifactError for anything else."""
    if len(raw) > MAX_BYTES:
        raise CorruptArtifactError(f"{where}: a flatten context of {len(raw)} bytes (at most {MAX_BYTES}).")
    try:
        value = msgpack.unpackb(raw, strict_map_key=True, raw=False, use_list=True)
    except Exception as e:  # noqa: BLE001 -- msgpack raises several types for a malformed buffer
        raise CorruptArtifactError(f"{where}: a malformed flatten context ({type(e).__name__}).") from None
    nesting.check_value(value, 2 * MAX_DEPTH + 2, where, "a flatten context")
    return _untagged(value, where)


def _untagged(v, where: str):
    if isinstance(v, _SCALARS):
        return v
    if isinstance(v, dict) and len(v) == 1:
        (tag, body), = v.items()
        if tag in ("list", "tuple") and isinstance(body, list):
            items = [_untagged(x, where) for x in body]
            return items if tag == "list" else tuple(items)
        if tag == "dict" and isinstance(body, list) and all(isinstance(e, list) and len(e) == 2
                                                             and isinstance(e[0], str) for e in body):
            return {k: _untagged(x, where) for k, x in body}
        if tag == "size" and isinstance(body, list) and all(type(x) is int for x in body):
            return torch.Size(body)
        if tag == "dtype" and body in _DTYPES:
            return _DTYPES[body]
        if tag == "device" and isinstance(body, str) and len(body) < 64:
            try:
                return torch.device(body)
            except (RuntimeError, ValueError):
                pass
    raise CorruptArtifactError(f"{where}: a flatten context holds a value pt2b does not write ({str(v)[:80]}).")
