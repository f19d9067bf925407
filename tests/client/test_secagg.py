"""ADMMClient's SecAgg+ replies (``admm-secagg-*`` in the fit config)."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import pytest
from flower_run import admm_client_fn
from flwr.common import Context, RecordDict

from flwr_admm.client import admm_client
from flwr_admm.client.secagg import NUM_STATS
from flwr_admm.core.local_solver import penalized_local_solve
from flwr_admm.core.secure_sum import SecureGrid, decode_stats
from flwr_admm.node.records import load_states
from flwr_admm.protocol import (
    DELAYED_SQ_RESIDUAL,
    LOSS,
    SECAGG_EXAMPLES,
    U_SQ_NORM,
    W_SQ_NORM,
)

GRID = SecureGrid(8.0, 1 << 22, scale=125.0)


def config(server_round: int, ack: int, **extra: Any) -> dict[str, Any]:
    return {
        "rho": 0.1,
        "admm-duals": "client",
        "server_round": server_round,
        "admm-ack-round": ack,
        "local_steps": 20,
        "learning_rate": 1.0,
        "admm-secagg-scale": GRID.scale,
        "admm-secagg-clip": GRID.clipping_range,
        "admm-secagg-levels": GRID.quantization_range,
        "admm-secagg-weight": 1000,
        **extra,
    }


def client_and_context() -> tuple[Any, Context]:
    context = Context(0, 1, {"partition-id": 3, "num-partitions": 10}, RecordDict(), {})
    return admm_client_fn()(context), context


def test_reply_carries_grid_values_weight_and_only_metadata_in_the_clear() -> None:
    client, context = client_and_context()
    z = [np.zeros(20)]
    _arrays, weight, _metrics = client.fit(z, config(1, 0))
    arrays2, _, metrics2 = client.fit(z, config(2, 1))
    assert weight == 1000  # SecAgg+'s max_weight: the client weighs exactly 1
    assert [a.shape for a in arrays2] == [(20,), (NUM_STATS * GRID.num_limbs,)]
    for name in (W_SQ_NORM, U_SQ_NORM, DELAYED_SQ_RESIDUAL, LOSS):
        assert name not in metrics2  # these travel inside the masked sum
    assert metrics2[SECAGG_EXAMPLES] == 500
    levels = arrays2[0] / GRID.step
    np.testing.assert_array_equal(levels, np.rint(levels))  # on the grid
    kept = load_states(context.state, [(20,)])
    # s x + e' = Delta + e: the residual is exactly what was not sent.
    first, second = kept.committed, kept.pending
    change = second.num_examples * (second.w[0] + second.u[0]) - 500 * (first.w[0] + first.u[0])
    np.testing.assert_allclose(
        GRID.scale * arrays2[0] + second.residual[0], change + first.residual[0], atol=1e-10
    )
    stats = decode_stats(GRID, np.rint(arrays2[1] / GRID.step), NUM_STATS)
    assert stats[0] == pytest.approx(500 * float(second.w[0] @ second.w[0]), rel=1e-9)
    assert stats[2] > 0 and stats[4] == 0  # a delayed residual; the loss is usable


def test_rebuild_block_is_the_share_and_its_error_joins_the_residual() -> None:
    client, context = client_and_context()
    z = [np.zeros(20)]
    client.fit(z, config(1, 0))
    arrays, _, _ = client.fit(z, config(2, 1, **{"admm-secagg-sweep": 1, "admm-rebuild": 1}))
    assert len(arrays) == 3
    pending = load_states(context.state, [(20,)]).pending
    # S_new receives s b = n c' - e'' with e'' the residual the client keeps.
    np.testing.assert_allclose(GRID.scale * arrays[1], pending.share[0], atol=1e-10)
    other, _ = client_and_context()
    other.fit(z, config(1, 0))
    plain, _, _ = other.fit(z, config(2, 1, **{"admm-secagg-sweep": 1}))
    np.testing.assert_array_equal(plain[1], plain[0])  # not rebuilding: S_new gets x again


@pytest.mark.parametrize(
    ("extra", "field"),
    [
        ({"admm-secagg-weight": 0}, "admm-secagg-weight"),
        ({"admm-secagg-sweep": 2}, "admm-secagg-sweep"),
        ({"admm-secagg-clip": 5.0}, "clipping_range"),
        ({"uplink": "quantize", "uplink-bits": 8}, "uplink"),
    ],
)
def test_bad_secure_config_names_the_field(extra: dict[str, Any], field: str) -> None:
    client, _ = client_and_context()
    with pytest.raises(ValueError, match=field):
        client.fit([np.zeros(20)], config(1, 0, **extra))


def test_missing_secure_setting_is_named() -> None:
    client, _ = client_and_context()
    cfg = config(1, 0)
    del cfg["admm-secagg-levels"]
    with pytest.raises(ValueError, match="admm-secagg-levels"):
        client.fit([np.zeros(20)], cfg)


def test_a_diverged_client_fails_instead_of_sending_and_keeps_its_state(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    client, context = client_and_context()
    z = [np.zeros(20)]
    client.fit(z, config(1, 0))
    kept = load_states(context.state, [(20,)])

    def diverged(*args: Any, **kwargs: Any) -> Any:
        result = penalized_local_solve(*args, **kwargs)
        return dataclasses.replace(result, params=[np.full(20, np.nan)])

    monkeypatch.setattr(admm_client, "penalized_local_solve", diverged)
    with pytest.raises(ValueError, match="finite"):
        client.fit(z, config(2, 1))
    after = load_states(context.state, [(20,)])
    np.testing.assert_array_equal(after.pending.w[0], kept.pending.w[0])
    assert after.pending.server_round == 1
