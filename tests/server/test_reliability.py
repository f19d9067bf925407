"""Issue 4: bad replies and failing clients never poison z or the duals; resume is exact."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from centralized import Pooled, ridge_optimum
from flower_run import C, admm_client_fn, seed_data, zeros_parameters
from flwr.client import NumPyClient
from flwr.common import Context, NDArrays, Scalar, ndarrays_to_parameters, parameters_to_ndarrays
from flwr.server.client_manager import SimpleClientManager

from flwr_admm import Checkpointing
from flwr_admm.core import ResidualBalancing
from flwr_admm.rounds.checkpoint import CheckpointError
from flwr_admm.server import FedADMM
from flwr_admm.testing import make_proxies, run_rounds


class FaultyClient(NumPyClient):
    """Wraps a client and corrupts its reply in chosen (partition, round) slots."""

    def __init__(self, inner: NumPyClient, partition: int, faults: dict[tuple[int, int], str]):
        self.inner, self.partition, self.faults = inner, partition, faults

    def fit(self, parameters: NDArrays, config: dict[str, Scalar]):  # type: ignore[no-untyped-def]
        fault = self.faults.get((self.partition, int(config["server_round"])))
        if fault == "raise":
            raise RuntimeError("client crashed")
        arrays, n, metrics = self.inner.fit(parameters, config)
        if fault == "nan":
            arrays = [np.full_like(a, np.nan) for a in arrays]
        elif fault == "shape":
            arrays = [np.zeros(a.size + 1) for a in arrays]
        elif fault == "count":
            arrays = [*arrays, np.zeros(3)]
        elif fault == "zero-n":
            n = 0
        elif fault == "dtype":
            arrays = [np.array(["x"] * a.size) for a in arrays]
        return arrays, n, metrics


def faulty_fn(faults: dict[tuple[int, int], str], **client_kwargs):  # type: ignore[no-untyped-def]
    inner = admm_client_fn(**client_kwargs)

    def client_fn(context: Context) -> NumPyClient:
        partition = int(context.node_config["partition-id"])
        return FaultyClient(inner(context), partition, faults)

    return client_fn


def _gap(z: np.ndarray) -> float:
    data = seed_data()
    pooled = Pooled.of(data.X, data.y, C)
    f_star = pooled.objective(ridge_optimum(pooled))
    return (pooled.objective(z) - f_star) / abs(f_star)


FAST = {"local_steps": 20, "learning_rate": 1.0}


def test_faults_do_not_stop_convergence() -> None:
    """NaN in round 3, wrong shape in round 5, a client raising in rounds 2-6: gap <= 1e-6."""
    faults = {(1, 3): "nan", (4, 5): "shape"}
    faults.update({(7, r): "raise" for r in range(2, 7)})
    strategy = FedADMM(rho=0.1, initial_parameters=zeros_parameters())
    zs: list[np.ndarray] = []
    strategy.evaluate_fn = lambda rnd, params, cfg: zs.append(np.array(params[0])) or None
    proxies = make_proxies(faulty_fn(faults, **FAST), 10)
    result = run_rounds(strategy, proxies, 60)
    assert all(np.all(np.isfinite(z)) for z in zs)
    metrics = result.fit_metrics
    assert metrics[2]["num_rejected"] == 1  # round 3: NaN
    assert metrics[4]["num_rejected"] == 1  # round 5: shape
    assert [m["num_failures"] for m in metrics[1:6]] == [1] * 5
    assert metrics[6]["num_failures"] == 0 and metrics[6]["num_rejected"] == 0
    gap = _gap(parameters_to_ndarrays(result.parameters)[0])
    assert gap <= 1e-6, gap


@pytest.mark.parametrize("fault", ["nan", "shape", "count", "zero-n", "dtype", "raise"])
def test_bad_reply_leaves_its_state_untouched(fault: str) -> None:
    """A rejected or failed reply changes neither the client's dual nor its cached w_i.

    Run A has client 2 misbehave in round 3; run B is clean and stops after round 2.
    Client 2's (w_2, y_2) after A's round 3 must equal B's after round 2, bit for bit,
    while z moved on with the other nine clients.
    """
    faulty_run = FedADMM(rho=0.1, initial_parameters=zeros_parameters())
    result = run_rounds(faulty_run, make_proxies(faulty_fn({(2, 3): fault}, **FAST), 10), 3)
    clean_run = FedADMM(rho=0.1, initial_parameters=zeros_parameters())
    run_rounds(clean_run, make_proxies(faulty_fn({}, **FAST), 10), 2)
    counter = "num_failures" if fault == "raise" else "num_rejected"
    assert result.fit_metrics[2][counter] == 1
    assert result.fit_metrics[2]["num_replies"] == 9
    assert faulty_run.admm is not None and clean_run.admm is not None
    faulty = faulty_run.admm.records["partition-id:2"]
    clean = clean_run.admm.records["partition-id:2"]
    for a, b in zip(faulty.y + faulty.w, clean.y + clean.w, strict=True):
        np.testing.assert_array_equal(a, b)
    assert not np.array_equal(faulty_run.admm.z[0], clean_run.admm.z[0])


def test_round_with_only_bad_replies_changes_nothing() -> None:
    """Every reply rejected or failed: z, duals and rho stay; the run goes on."""
    faults = {(i, 2): ("raise" if i % 2 else "nan") for i in range(10)}
    strategy = FedADMM(
        rho=0.1, initial_parameters=zeros_parameters(), rho_schedule=ResidualBalancing()
    )
    history: list[tuple[np.ndarray, float]] = []

    def snapshot(rnd: int, params: NDArrays, cfg: dict[str, Scalar]) -> None:
        assert strategy.admm is not None
        history.append((np.array(params[0]), strategy.admm.rho))

    strategy.evaluate_fn = snapshot  # type: ignore[assignment]
    result = run_rounds(strategy, make_proxies(faulty_fn(faults, **FAST), 10), 4)
    assert result.fit_metrics[1]["num_failures"] == 5
    assert result.fit_metrics[1]["num_rejected"] == 5
    np.testing.assert_array_equal(history[0][0], history[1][0])
    assert history[0][1] == history[1][1]
    assert not np.array_equal(history[1][0], history[2][0])


def test_resume_is_bit_identical(tmp_path: Path) -> None:
    """20 rounds straight == 10 rounds + checkpoint + a new strategy object + 10 rounds."""
    kwargs = {
        "rho": 0.1,
        "rho_schedule": ResidualBalancing(),
        "fraction_fit": 0.5,
        "min_fit_clients": 3,
        "min_available_clients": 10,
    }
    client = {"local_steps": 5, "learning_rate": 0.5, "batch_size": 64, "local_init": "center"}
    straight = FedADMM(initial_parameters=zeros_parameters(), **kwargs)
    expected = run_rounds(straight, make_proxies(faulty_fn({}, **client), 10), 20)

    first = FedADMM(
        initial_parameters=zeros_parameters(), checkpoint=Checkpointing(tmp_path), **kwargs
    )
    run_rounds(first, make_proxies(faulty_fn({}, **client), 10), 10)
    manifest = json.loads((tmp_path / "checkpoint.json").read_text())
    assert manifest["round"] == 10
    second = FedADMM(
        initial_parameters=zeros_parameters(), checkpoint=Checkpointing(tmp_path), **kwargs
    )
    resumed = run_rounds(second, make_proxies(faulty_fn({}, **client), 10), 10)

    z_expected = parameters_to_ndarrays(expected.parameters)[0]
    z_resumed = parameters_to_ndarrays(resumed.parameters)[0]
    np.testing.assert_array_equal(z_resumed, z_expected)
    assert second.history[-1]["round"] == 20
    assert second.admm is not None and straight.admm is not None
    assert second.admm.rho == straight.admm.rho


def test_mismatched_or_damaged_checkpoint_is_an_error(tmp_path: Path) -> None:
    strategy = FedADMM(
        rho=0.1, initial_parameters=zeros_parameters(), checkpoint=Checkpointing(tmp_path)
    )
    run_rounds(strategy, make_proxies(faulty_fn({}, **FAST), 10), 2)
    with pytest.raises(CheckpointError, match="another configuration"):
        FedADMM(rho=0.2, initial_parameters=zeros_parameters(), checkpoint=Checkpointing(tmp_path))
    other_shape = FedADMM(
        rho=0.1, checkpoint=Checkpointing(tmp_path), initial_parameters=zeros_parameters()
    )
    assert other_shape.admm is not None
    wrong = FedADMM(
        rho=0.1,
        checkpoint=Checkpointing(tmp_path),
        initial_parameters=ndarrays_to_parameters([np.zeros(21)]),
    )
    with pytest.raises(ValueError, match="initial_parameters"):
        wrong.initialize_parameters(SimpleClientManager())
    arrays = next(tmp_path.glob("state-r*.npz"))
    arrays.write_bytes(arrays.read_bytes()[:-10])
    with pytest.raises(CheckpointError, match="truncated"):
        FedADMM(rho=0.1, initial_parameters=zeros_parameters(), checkpoint=Checkpointing(tmp_path))
    (tmp_path / "checkpoint.json").write_text("{not json")
    with pytest.raises(CheckpointError, match="JSON"):
        FedADMM(rho=0.1, initial_parameters=zeros_parameters(), checkpoint=Checkpointing(tmp_path))
