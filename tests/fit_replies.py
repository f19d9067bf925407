"""Hand-built legacy replies: a FitRes from arrays, and the little of a ClientProxy read."""

from __future__ import annotations

from flwr.common import Code, FitRes, NDArrays, Scalar, Status, ndarrays_to_parameters


def fit_res(arrays: NDArrays, n: int, metrics: dict[str, Scalar]) -> FitRes:
    """Return an OK FitRes carrying `arrays`, `n` examples and `metrics`."""
    return FitRes(Status(Code.OK, ""), ndarrays_to_parameters(arrays), n, metrics)


class Proxy:
    """The little of a ClientProxy that the strategies read."""

    def __init__(self, cid: str) -> None:
        self.cid = cid
