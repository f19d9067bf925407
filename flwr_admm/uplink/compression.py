"""Uplink compression of client updates: stochastic quantization and top-k.

Payloads are real bit strings, one ``bytes`` tensor per model array inside a
`Parameters` whose ``tensor_type`` names the scheme (`SQ_TENSOR_TYPE`,
`TOPK_TENSOR_TYPE`). Every tensor starts with a header (magic, version, the scheme's
parameters, entry count, CRC-32 of the body), so a truncated, corrupted or mismatched
payload is a `ValueError` at decode time rather than a silently wrong model.

`StochasticQuantizer` (QSGD-style, unbiased): per tensor or per block of ``block_size``
entries, levels lo + j s, j = 0..2^b - 1, with lo = min, s = (max - min) / (2^b - 1);
x is rounded to j = floor(t) + Bernoulli(t - floor(t)), t = (x - lo) / s, so
E[decode(encode(x))] = x.

`TopK`: the ceil(fraction n) entries of largest magnitude, indices bit-packed with
ceil(log2 n) bits and values as float32.

Both default to error feedback (Seide et al. 2014; Karimireddy et al. 2019): the
client adds what it could not send last time to the next update
(`flwr_admm.uplink.channel`).
"""

from __future__ import annotations

import math
import struct
import zlib
from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any

import numpy as np
from flwr.common import Parameters, Scalar
from numpy.typing import NDArray

from flwr_admm.protocol import (
    UPLINK,
    UPLINK_BITS,
    UPLINK_BLOCK,
    UPLINK_ERROR_FEEDBACK,
    UPLINK_FRACTION,
)

Arrays = list[NDArray[np.float64]]
SQ_TENSOR_TYPE = "flwr_admm.sq/v1"
TOPK_TENSOR_TYPE = "flwr_admm.topk/v1"
_SQ_HEADER = struct.Struct("<2sBBIII")  # magic, version, bits, count, block, crc32
_TOPK_HEADER = struct.Struct("<2sBBIII")  # magic, version, index bits, count, k, crc32
_VERSION = 1


# --------------------------------------------------------------------- bit packing
def pack_bits(values: NDArray[np.integer[Any]], bits: int) -> bytes:
    """Pack unsigned integers < 2^bits, least significant bit first."""
    shifts = np.arange(bits, dtype=np.uint32)
    matrix = (np.asarray(values, dtype=np.uint32)[:, None] >> shifts) & 1
    return np.packbits(matrix.astype(np.uint8).ravel(), bitorder="little").tobytes()


def unpack_bits(data: bytes, bits: int, count: int) -> NDArray[np.uint32]:
    """Inverse of `pack_bits`; the length and the zero padding are checked."""
    expected = math.ceil(count * bits / 8)
    if len(data) != expected:
        raise ValueError(f"packed bits: expected {expected} bytes, got {len(data)}")
    flat = np.unpackbits(np.frombuffer(data, dtype=np.uint8), bitorder="little")
    if flat[count * bits :].any():
        raise ValueError("packed bits: nonzero padding")
    matrix = flat[: count * bits].reshape(count, bits).astype(np.uint32)
    levels: NDArray[np.uint32] = (matrix << np.arange(bits, dtype=np.uint32)).sum(
        axis=1, dtype=np.uint32
    )
    return levels


def _check_body(body: bytes, crc: int, what: str) -> None:
    if zlib.crc32(body) != crc:
        raise ValueError(f"{what}: checksum mismatch (corrupted payload)")


def _float32(values: NDArray[np.float64], what: str) -> bytes:
    out = np.asarray(values, dtype="<f4")
    if not np.all(np.isfinite(out)):
        raise ValueError(f"{what}: values must be finite in float32")
    return out.tobytes()


# ------------------------------------------------------------------- compressors
class Compressor(ABC):
    """An uplink scheme: `encode` a list of float arrays to bytes tensors, `decode` back.

    ``config()`` is what the server puts in the fit config; `compressor_from_config`
    is its inverse on the client.
    """

    tensor_type: str
    error_feedback: bool

    @abstractmethod
    def encode_array(self, x: NDArray[np.float64], rng: np.random.Generator) -> bytes:
        """Encode one flat float64 array."""

    @abstractmethod
    def decode_array(self, data: bytes, count: int) -> NDArray[np.float64]:
        """Decode one tensor holding `count` entries; ValueError if inconsistent."""

    @abstractmethod
    def config(self) -> dict[str, Scalar]:
        """Fit-config entries that make a client use this scheme."""

    def encode(self, delta: Sequence[NDArray[np.generic]], rng: np.random.Generator) -> Parameters:
        """Encode every array of `delta` into one `Parameters`."""
        tensors = []
        for array in delta:
            flat = np.asarray(array, dtype=np.float64).ravel()
            if not np.all(np.isfinite(flat)):
                raise ValueError("update: contains NaN or inf; cannot compress")
            tensors.append(self.encode_array(flat, rng))
        return Parameters(tensors=tensors, tensor_type=self.tensor_type)

    def decode(self, parameters: Parameters, shapes: Sequence[tuple[int, ...]]) -> Arrays:
        """Decode `parameters` into arrays of `shapes`; ValueError if inconsistent."""
        if parameters.tensor_type != self.tensor_type:
            raise ValueError(
                f"payload: tensor_type {parameters.tensor_type!r}, expected {self.tensor_type!r}"
            )
        if len(parameters.tensors) != len(shapes):
            raise ValueError(
                f"payload: expected {len(shapes)} tensors, got {len(parameters.tensors)}"
            )
        for i, (data, shape) in enumerate(zip(parameters.tensors, shapes, strict=True)):
            limit = 16 * math.prod(shape) + 64  # = flwr_admm.uplink.wire.max_payload_bytes
            if len(data) > limit:  # checked before anything is copied or decoded
                raise ValueError(f"payload: tensor {i} holds {len(data)} bytes, at most {limit}")
        return [
            self.decode_array(bytes(data), math.prod(shape)).reshape(shape)
            for data, shape in zip(parameters.tensors, shapes, strict=True)
        ]


class StochasticQuantizer(Compressor):
    """Unbiased b-bit stochastic quantization with per-tensor or per-block min/max.

    Parameters
    ----------
    bits : int
        Bits per entry, 1..16.
    block_size : int, optional
        Entries sharing one (lo, scale) pair; None = one pair per tensor.
    error_feedback : bool
        Keep the residual on the client and add it to the next update.

    """

    tensor_type = SQ_TENSOR_TYPE

    def __init__(
        self, *, bits: int = 8, block_size: int | None = None, error_feedback: bool = True
    ) -> None:
        if isinstance(bits, bool) or not isinstance(bits, int) or not 1 <= bits <= 16:
            raise ValueError(f"bits: must be an integer in 1..16, got {bits!r}")
        if block_size is not None and (
            isinstance(block_size, bool) or not isinstance(block_size, int) or block_size < 1
        ):
            raise ValueError(f"block_size: must be None or an integer >= 1, got {block_size!r}")
        if not isinstance(error_feedback, bool):
            raise ValueError(f"error_feedback: must be True or False, got {error_feedback!r}")
        self.bits, self.block_size, self.error_feedback = bits, block_size, error_feedback

    def __repr__(self) -> str:
        return (
            f"StochasticQuantizer(bits={self.bits}, block_size={self.block_size}, "
            f"error_feedback={self.error_feedback})"
        )

    def config(self) -> dict[str, Scalar]:
        """``uplink`` = "sq", ``uplink-bits``, ``uplink-block`` (0 = per tensor)."""
        return {
            UPLINK: "sq",
            UPLINK_BITS: self.bits,
            UPLINK_BLOCK: self.block_size or 0,
            UPLINK_ERROR_FEEDBACK: self.error_feedback,
        }

    def _block(self, count: int) -> int:
        return max(1, count if self.block_size is None else min(self.block_size, count))

    def encode_array(self, x: NDArray[np.float64], rng: np.random.Generator) -> bytes:
        """Header, float32 lo[], float32 scale[], packed levels."""
        count, block = x.size, self._block(x.size)
        top = (1 << self.bits) - 1
        lo_list, scale_list, levels = [], [], np.empty(count, dtype=np.uint32)
        for start in range(0, count, block):
            part = x[start : start + block]
            lo, scale = _grid(float(part.min()), float(part.max()), top)
            t = (part - lo) / scale if scale > 0 else np.zeros_like(part)
            floor = np.floor(t)
            up = rng.random(part.size) < (t - floor)
            levels[start : start + block] = np.clip(floor + up, 0, top).astype(np.uint32)
            lo_list.append(lo)
            scale_list.append(scale)
        body = (
            np.asarray(lo_list, dtype="<f4").tobytes()
            + np.asarray(scale_list, dtype="<f4").tobytes()
            + pack_bits(levels, self.bits)
        )
        return _SQ_HEADER.pack(b"SQ", _VERSION, self.bits, count, block, zlib.crc32(body)) + body

    def decode_array(self, data: bytes, count: int) -> NDArray[np.float64]:
        """Decode to lo + level * scale, after checking header, sizes and checksum."""
        if len(data) < _SQ_HEADER.size:
            raise ValueError("sq payload: shorter than its header")
        magic, version, bits, n, block, crc = _SQ_HEADER.unpack_from(data)
        if magic != b"SQ" or version != _VERSION:
            raise ValueError(f"sq payload: bad magic/version {magic!r}/{version}")
        if bits != self.bits:
            raise ValueError(f"sq payload: {bits} bits, expected {self.bits}")
        if n != count:
            raise ValueError(f"sq payload: {n} entries, expected {count}")
        if block != self._block(count):
            raise ValueError(f"sq payload: block {block}, expected {self._block(count)}")
        body = data[_SQ_HEADER.size :]
        _check_body(body, crc, "sq payload")
        blocks = math.ceil(count / block) if count else 0
        params = np.frombuffer(body[: 8 * blocks], dtype="<f4").astype(np.float64)
        lo, scale = params[:blocks], params[blocks:]
        if not (np.all(np.isfinite(params)) and np.all(scale >= 0)):
            raise ValueError("sq payload: non-finite or negative block parameters")
        levels = unpack_bits(body[8 * blocks :], bits, count).astype(np.float64)
        return np.repeat(lo, block)[:count] + levels * np.repeat(scale, block)[:count]


def _grid(lo: float, hi: float, top: int) -> tuple[float, float]:
    """Float32 (lo, scale) whose grid lo + j scale, j = 0..top, covers [lo, hi]."""
    lo32 = np.float32(lo)
    if float(lo32) > lo:
        lo32 = np.nextafter(lo32, np.float32(-np.inf))
    if hi <= float(lo32):
        return float(lo32), 0.0
    scale32 = np.float32((hi - float(lo32)) / top)
    while float(lo32) + top * float(scale32) < hi:
        scale32 = np.nextafter(scale32, np.float32(np.inf))
    return float(lo32), float(scale32)


class TopK(Compressor):
    """Keep the ceil(fraction n) largest-magnitude entries of each tensor.

    Parameters
    ----------
    fraction : float
        Share of entries sent, in (0, 1].
    error_feedback : bool
        Keep the unsent entries on the client and add them to the next update.

    """

    tensor_type = TOPK_TENSOR_TYPE

    def __init__(self, *, fraction: float = 0.1, error_feedback: bool = True) -> None:
        if not (
            isinstance(fraction, int | float)
            and not isinstance(fraction, bool)
            and 0 < fraction <= 1
        ):
            raise ValueError(f"fraction: must be a number in (0, 1], got {fraction!r}")
        if not isinstance(error_feedback, bool):
            raise ValueError(f"error_feedback: must be True or False, got {error_feedback!r}")
        self.fraction, self.error_feedback = float(fraction), error_feedback

    def __repr__(self) -> str:
        return f"TopK(fraction={self.fraction}, error_feedback={self.error_feedback})"

    def config(self) -> dict[str, Scalar]:
        """``uplink`` = "topk", ``uplink-fraction``."""
        return {
            UPLINK: "topk",
            UPLINK_FRACTION: self.fraction,
            UPLINK_ERROR_FEEDBACK: self.error_feedback,
        }

    def k_of(self, count: int) -> int:
        """Entries kept out of `count`."""
        return min(count, max(1, math.ceil(self.fraction * count))) if count else 0

    @staticmethod
    def _index_bits(count: int) -> int:
        return max(1, (count - 1).bit_length())

    def encode_array(self, x: NDArray[np.float64], rng: np.random.Generator) -> bytes:
        """Header, packed sorted indices, float32 values."""
        count, k = x.size, self.k_of(x.size)
        # Stable order: ties go to the lower index, so encoding is deterministic.
        order = np.argsort(-np.abs(x), kind="stable")[:k]
        index = np.sort(order)
        body = pack_bits(index, self._index_bits(count)) + _float32(x[index], "topk values")
        header = _TOPK_HEADER.pack(
            b"TK", _VERSION, self._index_bits(count), count, k, zlib.crc32(body)
        )
        return header + body

    def decode_array(self, data: bytes, count: int) -> NDArray[np.float64]:
        """Zeros with the sent values scattered back, after all consistency checks."""
        if len(data) < _TOPK_HEADER.size:
            raise ValueError("topk payload: shorter than its header")
        magic, version, index_bits, n, k, crc = _TOPK_HEADER.unpack_from(data)
        if magic != b"TK" or version != _VERSION:
            raise ValueError(f"topk payload: bad magic/version {magic!r}/{version}")
        if n != count or k != self.k_of(count) or index_bits != self._index_bits(count):
            raise ValueError(
                f"topk payload: (n, k, index bits) = ({n}, {k}, {index_bits}), expected "
                f"({count}, {self.k_of(count)}, {self._index_bits(count)})"
            )
        body = data[_TOPK_HEADER.size :]
        _check_body(body, crc, "topk payload")
        index_bytes = math.ceil(k * index_bits / 8)
        if len(body) != index_bytes + 4 * k:
            raise ValueError("topk payload: wrong length")
        index = unpack_bits(body[:index_bytes], index_bits, k)
        if k and (index[-1] >= count or np.any(np.diff(index.astype(np.int64)) <= 0)):
            raise ValueError("topk payload: indices out of range or not strictly increasing")
        values = np.frombuffer(body[index_bytes:], dtype="<f4").astype(np.float64)
        if not np.all(np.isfinite(values)):
            raise ValueError("topk payload: non-finite values")
        out = np.zeros(count, dtype=np.float64)
        out[index] = values
        return out


def compressor_from_config(config: dict[str, Scalar]) -> Compressor | None:
    """Return the scheme a fit config asks for (None without ``uplink``); ValueError if bad."""
    scheme = config.get(UPLINK)
    if scheme is None or scheme == "none":
        return None
    feedback = config.get(UPLINK_ERROR_FEEDBACK, True)
    if not isinstance(feedback, bool | int) or feedback not in (0, 1):
        raise ValueError(f"{UPLINK_ERROR_FEEDBACK}: must be true or false, got {feedback!r}")
    if scheme == "sq":
        bits, block = config.get(UPLINK_BITS, 8), config.get(UPLINK_BLOCK, 0)
        if not isinstance(bits, int) or not isinstance(block, int):
            raise ValueError(
                f"{UPLINK_BITS} / {UPLINK_BLOCK}: must be integers, got {bits!r}, {block!r}"
            )
        return StochasticQuantizer(
            bits=bits, block_size=block or None, error_feedback=bool(feedback)
        )
    if scheme == "topk":
        fraction = config.get(UPLINK_FRACTION, 0.1)
        if not isinstance(fraction, int | float):
            raise ValueError(f"{UPLINK_FRACTION}: must be a number, got {fraction!r}")
        return TopK(fraction=float(fraction), error_feedback=bool(feedback))
    raise ValueError(f"{UPLINK}: must be 'sq', 'topk' or 'none', got {scheme!r}")


def checked_uplink(uplink: Any) -> Compressor | None:
    """Return `uplink` if it is None or a `Compressor` with error feedback; else raise."""
    if uplink is not None and not isinstance(uplink, Compressor):
        raise ValueError(f"uplink: must be a Compressor or None, got {uplink!r}")
    if uplink is not None and not uplink.error_feedback:
        raise ValueError(
            "uplink: client-held duals need error_feedback=True (S would keep every "
            f"compression error), got {uplink!r}"
        )
    return uplink
