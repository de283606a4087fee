"""Arrow arrays built from buffers, for the columns an audit writes on every batch.

``pa.array`` first asks whether its input is a pandas object, and asking imports pandas (0.2 s on
a quiet machine, more on a busy one) even for a plain list. An audit never uses pandas, so its
hot path (``lengths.parquet``, the length cache, the row positions a scan takes) builds its
arrays here instead: the same arrays, with no per-call import.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

_NUMPY = {pa.int64(): np.int64, pa.int32(): np.int32, pa.int8(): np.int8, pa.float64(): np.float64}
#: Above this many bytes of text a string array would overflow int32 offsets: left to ``pa.array``.
_MAX_STRING_BYTES = 2**31 - 1


def numeric(values, type: pa.DataType, mask=None) -> pa.Array:
    """``pa.array(values, type, mask=mask)`` for a numpy array of numbers (``mask`` True: null)."""
    data = np.ascontiguousarray(values, dtype=_NUMPY[type])
    validity, nulls = _validity(mask, data.size)
    return pa.Array.from_buffers(type, data.size, [validity, pa.py_buffer(data)], null_count=nulls)


def booleans(values) -> pa.Array:
    """``pa.array(values, pa.bool_())`` for a numpy array of bools (no nulls)."""
    data = np.asarray(values, bool)
    return pa.Array.from_buffers(pa.bool_(), data.size, [None, pa.py_buffer(np.packbits(data, bitorder="little"))])


def strings(values) -> pa.Array:
    """``pa.array(values, pa.string())`` for a sequence of ``str`` or ``None``."""
    n = len(values)
    missing = np.fromiter((v is None for v in values), bool, n)
    if missing.all():
        return pa.nulls(n, pa.string())
    encoded = [b"" if v is None else v.encode("utf-8") for v in values]
    offsets = np.zeros(n + 1, np.int64)
    np.cumsum([len(b) for b in encoded], out=offsets[1:])
    if offsets[-1] > _MAX_STRING_BYTES:
        return pa.array(list(values), pa.string())
    validity, nulls = _validity(missing, n)
    return pa.StringArray.from_buffers(n, pa.py_buffer(offsets.astype(np.int32)), pa.py_buffer(b"".join(encoded)),
                                       validity, nulls)


def _validity(mask, n: int) -> tuple[pa.Buffer | None, int]:
    """Arrow's validity bitmap (1: valid, least significant bit first) and the null count."""
    if mask is None:
        return None, 0
    mask = np.asarray(mask, bool)
    nulls = int(mask.sum())
    if not nulls:
        return None, 0
    return pa.py_buffer(np.packbits(~mask, bitorder="little")), nulls


def to_numpy(array: pa.Array) -> np.ndarray:
    """``array.to_numpy()`` of a numeric array without nulls (a read-only view of its buffer)."""
    if array.null_count:
        raise ValueError("to_numpy: the array has nulls")
    dtype = np.dtype(_NUMPY[array.type])
    return np.frombuffer(array.buffers()[1], dtype, count=len(array), offset=array.offset * dtype.itemsize)
