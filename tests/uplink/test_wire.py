"""Zero-copy decoding of Flower's numpy wire format against `parameters_to_ndarrays`."""

from __future__ import annotations

import io

import numpy as np
import pytest
from flwr.common import Parameters, ndarrays_to_parameters, parameters_to_ndarrays

from flwr_admm.uplink.wire import ndarray_view, parameters_to_views, to_parameters

ARRAYS = [
    np.arange(12.0).reshape(3, 4),
    np.asfortranarray(np.arange(6.0).reshape(2, 3)),
    np.linspace(0, 1, 5, dtype=np.float32),
    np.array(2.5),
    np.zeros((0, 3)),
    np.arange(4, dtype=">f8"),
    np.arange(7, dtype=np.int64),
    np.arange(24.0).reshape(2, 3, 4)[:, ::2, :],  # non-contiguous source
]


def test_views_equal_flowers_decoding_and_share_the_reply_bytes() -> None:
    parameters = ndarrays_to_parameters(ARRAYS)
    views = parameters_to_views(parameters)
    for view, ref, tensor in zip(
        views, parameters_to_ndarrays(parameters), parameters.tensors, strict=True
    ):
        assert view.shape == ref.shape and view.dtype == ref.dtype
        np.testing.assert_array_equal(view, ref)
        assert not view.flags.writeable
        if view.size:  # no copy: the view's memory lies inside the reply's bytes
            backing = np.frombuffer(tensor, dtype=np.uint8)
            assert np.shares_memory(view, backing)


def test_version_2_header_and_repeated_headers() -> None:
    stream = io.BytesIO()
    np.lib.format.write_array(stream, np.arange(3.0), version=(2, 0))
    np.testing.assert_array_equal(ndarray_view(stream.getvalue()), [0.0, 1.0, 2.0])
    # The header cache must not mix up payloads that share a header.
    first, second = (ndarrays_to_parameters([np.full(4, v)]).tensors[0] for v in (1.0, 2.0))
    assert ndarray_view(first)[0] == 1.0 and ndarray_view(second)[0] == 2.0


def _object_array() -> bytes:
    stream = io.BytesIO()
    np.save(stream, np.array([1, "a"], dtype=object), allow_pickle=True)
    return stream.getvalue()


GOOD = ndarrays_to_parameters([np.arange(12.0).reshape(3, 4)]).tensors[0]


@pytest.mark.parametrize(
    ("tensor", "pattern"),
    [
        (b"", "too short"),
        (b"not numpy at all", "magic"),
        (GOOD[:-1], "payload holds 95 bytes"),
        (GOOD + b"\0", "payload holds 97 bytes"),
        (GOOD[:9], "too short"),
        (_object_array(), "object arrays"),
    ],
)
def test_malformed_buffers_raise_value_error(tensor: bytes, pattern: str) -> None:
    with pytest.raises(ValueError, match=pattern):
        ndarray_view(tensor)


def test_tensor_type_is_checked_unless_told_otherwise() -> None:
    parameters = Parameters(tensors=[GOOD], tensor_type="something.else")
    with pytest.raises(ValueError, match=r"^tensor_type: must be 'numpy\.ndarray'"):
        parameters_to_views(parameters)
    assert parameters_to_views(parameters, check_type=False)[0].shape == (3, 4)


def test_to_parameters_writes_flowers_numpy_bytes() -> None:
    arrays = [np.random.default_rng(0).standard_normal((5, 3)), np.array(2.5), np.zeros(0)]
    arrays.append(np.arange(7.0)[::2])  # not contiguous: asarray(order="C") copies
    for dtype in (np.float64, np.float32):
        ours = to_parameters(arrays, [np.dtype(dtype)] * len(arrays))
        theirs = ndarrays_to_parameters([a.astype(dtype) for a in arrays])
        assert ours.tensors == theirs.tensors and ours.tensor_type == theirs.tensor_type
