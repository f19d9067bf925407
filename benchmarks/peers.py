"""The peer baselines SCAFFOLD and FedDyn in `benchmarks.convergence`, and bytes on the wire.

SCAFFOLD runs the learning rate x local steps grid with the server step eta_g in
SERVER_STEPS (the paper's 1, and 1.6: eta_g is a knob of its paper), no penalty
axis, like FedAvg; FedDyn (no server step in its paper) runs the full grid with alpha
on the penalty axis (the values rho and mu take). Every run counts the bytes that
cross the wire, both ways: the serialized tensors of each sampled client's FitIns and
of its FitRes (`CountingProxy`), so SCAFFOLD's control variate (x and c down, y_i and
c_i+ - c_i up) costs what it costs. The peers table gives, per algorithm, the fewest
rounds to the tightest target (with the bytes that run needed) and the fewest bytes
to it (over the same grid, possibly another configuration).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from flwr.common import FitIns, FitRes, Parameters
from flwr.server.strategy import Strategy

from flwr_admm.server import SCAFFOLD, FedDyn
from flwr_admm.testing import InProcessClientProxy

PEERS = ("SCAFFOLD", "FedDyn")
SERVER_STEPS = (1.0, 1.6)  # SCAFFOLD's eta_g grid


@dataclass
class ByteCounter:
    """Bytes sent to and received from the clients so far in one run."""

    total: int = 0


def tensor_bytes(parameters: Parameters) -> int:
    """Return the serialized size of `parameters`' tensors (what the transport carries)."""
    return sum(len(tensor) for tensor in parameters.tensors)


class CountingProxy(InProcessClientProxy):
    """An in-process proxy that adds each FitIns' and FitRes' tensor bytes to a counter."""

    def __init__(self, proxy: InProcessClientProxy, counter: ByteCounter) -> None:
        super().__init__(proxy.cid, proxy.client_fn, proxy.context)
        self.counter = counter

    def fit(self, ins: FitIns, timeout: float | None, group_id: int | None) -> FitRes:
        """Count the bytes down, forward to the client, count the bytes up."""
        self.counter.total += tensor_bytes(ins.parameters)
        res = super().fit(ins, timeout, group_id)
        self.counter.total += tensor_bytes(res.parameters)
        return res


def counting(proxies: list[InProcessClientProxy], counter: ByteCounter) -> list[CountingProxy]:
    """Return `proxies` wrapped so that every fit's bytes land in `counter`."""
    return [CountingProxy(proxy, counter) for proxy in proxies]


def peer_configs(algorithm: str, grid: Any) -> list[dict[str, float]]:
    """SCAFFOLD: lr x steps x eta_g (SERVER_STEPS); FedDyn: lr x steps x alpha (penalty)."""
    if algorithm == "SCAFFOLD":
        local = grid.configs(penalized=False)
        return [{**config, "server_step": eta} for config in local for eta in SERVER_STEPS]
    return list(grid.configs(penalized=True))


def make_peer(algorithm: str, config: dict[str, float], common: dict[str, Any]) -> Strategy:
    """SCAFFOLD with eta_g = the configuration's server step, or FedDyn with alpha.

    sampling_seed=None: Flower's ClientManager.sample, the baselines' and FedADMM's draw.
    """
    if algorithm == "SCAFFOLD":
        eta = float(config.get("server_step", 1.0))
        return SCAFFOLD(server_learning_rate=eta, sampling_seed=None, **common)
    if algorithm == "FedDyn":
        return FedDyn(alpha=float(config["penalty"]), sampling_seed=None, **common)
    raise ValueError(f"algorithm: must be one of {list(PEERS)}, got {algorithm!r}")


def penalty_name(algorithm: str, schedule: object) -> str | None:
    """Return the name of a run's penalty in the tables (None: it has none)."""
    names = {"FedAvg": None, "SCAFFOLD": None, "FedProx": "mu", "FedDyn": "alpha"}
    if algorithm in names:
        return names[algorithm]
    # the linearized form (rho_i = 1 / (K_i lr)) and the prox form's defaults: no knob
    if algorithm.startswith(("FedADMM linearized", "FedADMM prox form", "FedADMM (defaults)")):
        return None
    return "rho0" if schedule else "rho"


def peers_summary(result: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Per label: fewest rounds to the tightest target and fewest bytes to it."""
    final = str(result["targets"][-1])
    groups: dict[str, list[dict[str, Any]]] = {}
    for run in result["runs"]:
        groups.setdefault(run["label"], []).append(run)
    out = {}
    for label, group in groups.items():
        hits = [r for r in group if r["rounds_to"][final] is not None]
        fastest = min(hits, key=lambda r: r["rounds_to"][final], default=None)
        leanest = min(hits, key=lambda r: r["bytes_to"][final], default=None)
        out[label] = {
            "configs": len(group),
            "rounds": None if fastest is None else fastest["rounds_to"][final],
            "bytes_of_fastest": None if fastest is None else fastest["bytes_to"][final],
            "fastest": _config(fastest),
            "bytes": None if leanest is None else leanest["bytes_to"][final],
            "rounds_of_leanest": None if leanest is None else leanest["rounds_to"][final],
            "leanest": _config(leanest),
        }
    return out


def _config(run: dict[str, Any] | None) -> dict[str, Any] | None:
    if run is None:
        return None
    keys = ("lr", "steps", "penalty", "relaxation", "schedule", "server_step")
    return {key: run[key] for key in keys if key in run}


def peers_rows(result: dict[str, Any], steps_key: str) -> tuple[list[str], list[list[object]]]:
    """Headers and rows of the peers table: rounds and bytes to the tightest target.

    The last columns give, for an algorithm that missed the target, the best metric
    value any of its configurations reached ("-" for the others: their runs stopped
    at the target).
    """
    final = result["targets"][-1]
    metric = "gap <=" if result["metric"] == "gap" else "accuracy >="
    headers = [
        "algorithm",
        f"rounds to {metric} {final:g}",
        "its MB",
        "config",
        "fewest MB",
        "its rounds",
        "config",
        f"{'lowest gap' if result['metric'] == 'gap' else 'best accuracy'} seen",
        "config",
    ]
    rows: list[list[object]] = []
    over = f"> {result['max_rounds']}"
    for label, entry in result["peers"].items():
        # runs stop once every target is met: the best value ranks only the misses
        top = None if entry["rounds"] is not None else result["summary"]["best_value"].get(label)
        rows.append(
            [
                label,
                over if entry["rounds"] is None else entry["rounds"],
                _megabytes(entry["bytes_of_fastest"]),
                _config_text(entry["fastest"], label, steps_key),
                _megabytes(entry["bytes"]),
                "-" if entry["rounds_of_leanest"] is None else entry["rounds_of_leanest"],
                _config_text(entry["leanest"], label, steps_key),
                "-" if top is None else f"{top['best']:.3g}",
                _config_text(_config(top), label, steps_key),
            ]
        )
    return headers, rows


def _megabytes(count: int | None) -> str:
    return "-" if count is None else f"{count / 1e6:.3f}"


def _config_text(config: dict[str, Any] | None, label: str, steps_key: str) -> str:
    if config is None:
        return "-"
    steps = "epochs" if steps_key == "local_epochs" else "steps"
    text = f"lr={config['lr']:g} {steps}={config['steps']:g}"
    name = penalty_name(label, config.get("schedule"))
    if name is not None and "penalty" in config:
        text += f" {name}={config['penalty']:g}"
    if "server_step" in config:
        text += f" eta_g={config['server_step']:g}"
    return text
