"""The IDX file format MNIST ships in: numpy arrays read from and written to its bytes (no TensorFlow)."""

from __future__ import annotations

import os
import pathlib

import numpy as np

from runner.data_pipelines import DataError

PathLike = str | os.PathLike[str]

# IDX type byte -> big-endian numpy dtype (per the IDX format spec)
_IDX_DTYPES: dict[int, np.dtype] = {0x08: np.dtype(">u1"), 0x09: np.dtype(">i1"), 0x0B: np.dtype(">i2"),
                                    0x0C: np.dtype(">i4"), 0x0D: np.dtype(">f4"), 0x0E: np.dtype(">f8")}


def _parse_idx(buf: bytes | bytearray, name: str) -> np.ndarray:
    """Decode IDX bytes; a bytearray yields a writable array without copying."""
    if len(buf) < 4 or buf[0] != 0 or buf[1] != 0 or buf[2] not in _IDX_DTYPES:
        raise DataError(f"{name}: not an IDX file (bad magic number); replace it")
    dtype, ndim = _IDX_DTYPES[buf[2]], buf[3]
    header = 4 + 4 * ndim
    if len(buf) < header:
        raise DataError(f"{name}: truncated IDX header; replace the file")
    shape = tuple(int(d) for d in np.frombuffer(buf, dtype=">u4", count=ndim, offset=4))
    expected = header + int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    if len(buf) != expected:
        raise DataError(f"{name}: IDX size mismatch ({len(buf)} bytes, header implies {expected}); replace the file")
    array = np.frombuffer(buf, dtype=dtype, offset=header).reshape(shape)
    # Multi-byte IDX data is big-endian; hand callers native byte order.
    return array if dtype.itemsize == 1 else array.astype(dtype.newbyteorder("="))


def _encode_idx(array: np.ndarray) -> bytes:
    """Encode an array as canonical IDX bytes (magic, big-endian dims, data)."""
    array = np.asarray(array)
    native = array.dtype.newbyteorder("=")
    code = next((c for c, dt in _IDX_DTYPES.items() if dt.newbyteorder("=") == native), None)
    if code is None:
        raise ValueError(f"dtype {array.dtype} cannot be stored in an IDX file")
    header = bytes([0, 0, code, array.ndim]) + np.asarray(array.shape, dtype=">u4").tobytes()
    return header + array.astype(_IDX_DTYPES[code], copy=False).tobytes()


def _read_bytes(path: pathlib.Path) -> bytearray:
    """Read a whole file into a bytearray (mutable, so arrays over it are writable)."""
    with open(path, "rb") as f:
        buf = bytearray(os.fstat(f.fileno()).st_size)
        n = f.readinto(buf)
    return buf[:n] if n != len(buf) else buf

