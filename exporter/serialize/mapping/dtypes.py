"""The one mapping between torch dtypes and the ScalarType enum of schemas/pt2b.fbs (pt2b's own
codes, from the flatc code: they equal torch's export-schema codes, but an older torch's schema may
lack some members, see exporter/_torch/compat.py)."""

from __future__ import annotations

import torch

from ...errors import CorruptArtifactError, UnsupportedValueError
from ...layout.generated.pt2b_generated import ScalarType

_TO_ENUM = {
    torch.uint8: ScalarType.BYTE,
    torch.int8: ScalarType.CHAR,
    torch.int16: ScalarType.SHORT,
    torch.int32: ScalarType.INT,
    torch.int64: ScalarType.LONG,
    torch.float16: ScalarType.HALF,
    torch.float32: ScalarType.FLOAT,
    torch.float64: ScalarType.DOUBLE,
    torch.complex32: ScalarType.COMPLEXHALF,
    torch.complex64: ScalarType.COMPLEXFLOAT,
    torch.complex128: ScalarType.COMPLEXDOUBLE,
    torch.bool: ScalarType.BOOL,
    torch.bfloat16: ScalarType.BFLOAT16,
    torch.uint16: ScalarType.UINT16,
    torch.uint32: ScalarType.UINT32,
    torch.uint64: ScalarType.UINT64,
    torch.float8_e4m3fn: ScalarType.FLOAT8E4M3FN,
    torch.float8_e5m2: ScalarType.FLOAT8E5M2,
    torch.float8_e4m3fnuz: ScalarType.FLOAT8E4M3FNUZ,
    torch.float8_e5m2fnuz: ScalarType.FLOAT8E5M2FNUZ,
    torch.float8_e8m0fnu: ScalarType.FLOAT8E8M0FNU,
}
_FROM_ENUM = {int(v): k for k, v in _TO_ENUM.items()}


def itemsize_of(code) -> int | None:
    """The element size in bytes of ScalarType ``code`` (pt2b's, equal to torch's export-schema codes),
    or None for a code this mapping does not hold."""
    dtype = _FROM_ENUM.get(int(code)) if isinstance(code, int) else None
    return None if dtype is None else dtype.itemsize


def dtype_to_enum(dtype: torch.dtype, where: str) -> int:
    try:
        return int(_TO_ENUM[dtype])
    except KeyError:
        raise UnsupportedValueError(
            f"{where}: dtype {dtype} cannot be stored in a .pt2b artifact (supported: "
            f"{', '.join(str(d).removeprefix('torch.') for d in _TO_ENUM)}). Cast it first."
        ) from None


def enum_to_dtype(value: int, where: str) -> torch.dtype:
    try:
        return _FROM_ENUM[value]
    except KeyError:
        raise CorruptArtifactError(f"{where}: unknown dtype code {value}.") from None
