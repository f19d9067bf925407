"""Zero-copy reading of Flower's numpy wire format (one ``.npy`` file per tensor).

Flower's `parameters_to_ndarrays` copies each payload with `np.load`; the server only
reads a reply, so a read-only view into the received bytes does without the copy. A
view keeps its bytes object alive: that memory is the reply itself.
"""

from __future__ import annotations

import io
import math
from collections.abc import Sequence
from functools import lru_cache
from typing import Any

import numpy as np
from flwr.common import Parameters
from numpy.typing import NDArray

NUMPY_TENSOR_TYPE = "numpy.ndarray"
MAGIC = b"\x93NUMPY"
# np.save writes a header of 128 bytes for any model tensor; format 1.0 caps it at 65535.
MAX_HEADER = 1 << 16
REAL_KINDS = "fiu"  # the dtype kinds a reply may use (core.types.check_reply)


def max_payload_bytes(count: int) -> int:
    """Upper bound on a compressed tensor of `count` entries (`flwr_admm.uplink.compression`).

    b-bit quantization needs 16 + 8 blocks + ceil(b count / 8) <= 16 + 10 count bytes,
    top-k 16 + ceil(k index_bits / 8) + 4 k <= 16 + 8 count; 16 count + 64 bounds both.
    """
    return 16 * count + 64


def tensor_problem(tensor: bytes | bytearray | memoryview, shape: Sequence[int]) -> str | None:
    """Why one ``.npy`` buffer cannot be a tensor of `shape`, read from its header alone.

    Checked before anything is deserialized: the header's shape must be `shape`, its
    dtype a real number type, and the buffer exactly header + prod(shape) * itemsize
    bytes long. A reply a thousand times the model's size is refused without a copy.
    """
    try:
        buffer = memoryview(tensor).cast("B")
        end = _header_end(buffer)
        if end > MAX_HEADER:
            return f".npy header of {end} bytes (at most {MAX_HEADER})"
        declared, _, dtype, offset = _header(bytes(buffer[:end]))
    except (TypeError, ValueError, SyntaxError) as error:
        return f"unreadable .npy header ({error})"
    if declared != tuple(shape):
        return f"tensor of shape {declared}, expected {tuple(shape)}"
    if dtype.kind not in REAL_KINDS:
        return f"tensor of dtype {dtype}, expected a real number type"
    need = offset + math.prod(declared) * dtype.itemsize
    if len(buffer) != need:
        return f"tensor of {len(buffer)} bytes, its shape {declared} and dtype {dtype} need {need}"
    return None


def parameters_problem(parameters: Parameters, shapes: Sequence[Sequence[int]]) -> str | None:
    """Why a reply's `Parameters` cannot hold tensors of `shapes`, from their sizes alone.

    Numpy tensors: `tensor_problem` each. Compressed ones (another ``tensor_type``):
    at most `max_payload_bytes` each. Either way the count must match `shapes`.
    """
    tensors = parameters.tensors
    if len(tensors) != len(shapes):
        return f"expected {len(shapes)} tensors, got {len(tensors)}"
    for i, (tensor, shape) in enumerate(zip(tensors, shapes, strict=True)):
        if parameters.tensor_type == NUMPY_TENSOR_TYPE:
            problem = tensor_problem(tensor, shape)
        else:
            limit = max_payload_bytes(math.prod(shape))
            problem = None if len(tensor) <= limit else f"{len(tensor)} bytes (at most {limit})"
        if problem is not None:
            return f"tensor {i}: {problem}"
    return None


def ndarray_view(tensor: bytes | bytearray | memoryview) -> NDArray[np.generic]:
    """Read-only array viewing the payload of one ``.npy`` buffer (no copy).

    Raises ValueError for anything `np.load(..., allow_pickle=False)` would refuse:
    a bad magic string or header, object dtypes, or a payload whose length does not
    match the header's shape.
    """
    buffer = memoryview(tensor).cast("B")
    end = _header_end(buffer)
    if end > MAX_HEADER:  # a forged length field must not copy the payload
        raise ValueError(f".npy header of {end} bytes (at most {MAX_HEADER})")
    shape, fortran_order, dtype, offset = _header(bytes(buffer[:end]))
    count = math.prod(shape)
    if len(buffer) - offset != count * dtype.itemsize:
        raise ValueError(
            f"payload holds {len(buffer) - offset} bytes, the header's shape {shape} "
            f"and dtype {dtype} need {count * dtype.itemsize}"
        )
    flat = np.frombuffer(buffer, dtype=dtype, count=count, offset=offset)
    view = flat.reshape(shape[::-1]).transpose() if fortran_order else flat.reshape(shape)
    view.flags.writeable = False
    return view


def _header_end(buffer: memoryview) -> int:
    """Length of the magic string, version, length field and header of a ``.npy``."""
    if len(buffer) < 10 or bytes(buffer[:6]) != MAGIC:
        raise ValueError("not a .npy buffer (too short, or a bad magic string)")
    if buffer[6] == 1:
        return 10 + int.from_bytes(buffer[8:10], "little")
    if len(buffer) < 12:
        raise ValueError("truncated .npy header")
    return 12 + int.from_bytes(buffer[8:12], "little")


@lru_cache(maxsize=256)
def _header(header: bytes) -> tuple[tuple[int, ...], bool, np.dtype[Any], int]:
    """Shape, Fortran order, dtype and payload offset of a ``.npy`` header.

    Cached: a server sees the same few headers (one per tensor shape) every round.
    """
    stream = io.BytesIO(header)
    version = np.lib.format.read_magic(stream)
    if version == (1, 0):
        shape, fortran_order, dtype = np.lib.format.read_array_header_1_0(stream)
    elif version == (2, 0):
        shape, fortran_order, dtype = np.lib.format.read_array_header_2_0(stream)
    else:
        raise ValueError(f"unsupported .npy format version {version}")
    if dtype.hasobject:
        raise ValueError("object arrays are not allowed (they would need pickle)")
    return tuple(int(d) for d in shape), bool(fortran_order), dtype, len(header)


def parameters_to_views(
    parameters: Parameters, check_type: bool = True
) -> list[NDArray[np.generic]]:
    """`flwr.common.parameters_to_ndarrays` without copies: read-only views.

    Raises ValueError if a tensor is not a valid ``.npy`` buffer, and (with
    `check_type`) unless `parameters.tensor_type` is Flower's numpy format.
    """
    if check_type and parameters.tensor_type != NUMPY_TENSOR_TYPE:
        raise ValueError(
            f"tensor_type: must be {NUMPY_TENSOR_TYPE!r}, got {parameters.tensor_type!r}"
        )
    return [ndarray_view(t) for t in parameters.tensors]


def to_parameters(arrays: Sequence[NDArray[Any]], dtypes: Sequence[np.dtype[Any]]) -> Parameters:
    """`ndarrays_to_parameters` of the arrays cast to `dtypes`, with one copy per tensor.

    The same bytes as Flower's `np.save`, which copies each tensor about three times.
    """
    tensors = []
    for array, dtype in zip(arrays, dtypes, strict=True):
        array = np.asarray(array, dtype=dtype, order="C")  # keeps 0-d arrays 0-d
        header = io.BytesIO()
        np.lib.format.write_array_header_1_0(
            header, np.lib.format.header_data_from_array_1_0(array)
        )
        tensors.append(b"".join([header.getvalue(), array.reshape(-1).view(np.uint8).data]))
    return Parameters(tensors=tensors, tensor_type=NUMPY_TENSOR_TYPE)
