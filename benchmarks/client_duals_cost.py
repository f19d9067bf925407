"""Server cost of client-held duals: ``aggregate_fit`` of FedADMMClientDuals vs FedAvg.

FedADMMClientDuals keeps z, S = sum n_i c_i and two integers per client key, so its
state does not grow with N and every (P, N) fits. Both strategies aggregate the
IDENTICAL replies: 10 a round, each its own bytes (random model plus a distinct
shift), the timed rounds alternating between two reply sets (`benchmarks.server_setup`).
For FedADMMClientDuals a reply is a contribution change Delta_i with the protocol
metrics of a client that took part before.

N known clients: one real round with 10 first-time clients sets up z and S; the other
N - 10 clients enter the server's per-key records (n_i, last round) directly, which
is all the server would keep of them after N / 10 rounds. Before each timed call the
10 sampled clients' records are reset (untimed), so every call accepts all 10 replies.

- time: median of interleaved repeats (FedAvg, ClientDuals, ClientDuals, FedAvg, ...),
  CPU time of the process (the ratio reported), one BLAS thread, and wall time; also
  time per reply in "passes" (one pass = ``a += b`` over the model);
- memory: tracemalloc peak above the pre-call level during one call, in model copies
  (P * 8 bytes), and the server state between rounds.

    python -m benchmarks.client_duals_cost [--quick]
"""

from __future__ import annotations

import itertools
import time
import tracemalloc
from typing import Any

import numpy as np
from flwr.common import Code, FitRes, Parameters, Status, ndarrays_to_parameters
from flwr.server.client_proxy import ClientProxy
from flwr.server.strategy import FedAvg
from threadpoolctl import threadpool_limits

from benchmarks.common import (
    BLAS_THREADS,
    base_parser,
    format_table,
    interleaved_times,
    median,
    quiet_flower,
    settle_allocator,
    size_text,
    write_json,
)
from benchmarks.server_cost import pass_seconds, peak_extra_bytes
from benchmarks.server_setup import (
    FLOAT,
    SAMPLED,
    known_clients,
    layer_shapes,
    make_replies,
)
from flwr_admm.protocol import (
    DELAYED_SQ_RESIDUAL,
    EXAMPLES_CHANGE,
    PREVIOUS_ROUND,
    U_SQ_NORM,
    W_SQ_NORM,
)
from flwr_admm.rounds.client_duals_state import ClientEntry
from flwr_admm.server import FedADMMClientDuals

SETUP_ROUND = 1


def examples(proxy: ClientProxy) -> int:
    """N_i of a benchmark client (a few distinct values)."""
    return 100 + int(proxy.cid) % 7


def duals_results(
    proxies: list[ClientProxy], payloads: list[Parameters], previous_round: int
) -> list[tuple[ClientProxy, FitRes]]:
    """One protocol-conforming FitRes per proxy (first-time when previous_round is 0)."""
    results = []
    for proxy, payload in zip(proxies, payloads, strict=True):
        metrics: dict[str, Any] = {
            "partition-id": int(proxy.cid),
            "loss": 0.5,
            PREVIOUS_ROUND: previous_round,
            EXAMPLES_CHANGE: 0 if previous_round else examples(proxy),
            W_SQ_NORM: 1.0,
            U_SQ_NORM: 1.0,
        }
        if previous_round:
            metrics[DELAYED_SQ_RESIDUAL] = 1.0
        status = Status(Code.OK, "")
        results.append((proxy, FitRes(status, payload, examples(proxy), metrics)))
    return results


def prepared(
    num_parameters: int, num_clients: int, reply_sets: list[list[Parameters]]
) -> tuple[FedADMMClientDuals, list[list[tuple[ClientProxy, FitRes]]], list[ClientProxy]]:
    """Return a strategy that knows N clients, and the two timed reply lists of 10 of them."""
    strategy, proxies, manager = known_clients(num_clients, FedADMMClientDuals)
    parameters = ndarrays_to_parameters([np.zeros(s) for s in layer_shapes(num_parameters)])
    manager.next_sample = proxies[:SAMPLED]
    strategy.configure_fit(SETUP_ROUND, parameters, manager)
    first = duals_results(manager.next_sample, reply_sets[0], previous_round=0)
    aggregated, _ = strategy.aggregate_fit(SETUP_ROUND, first, [])
    assert aggregated is not None
    for proxy in proxies[SAMPLED:]:  # what N / 10 rounds would leave behind
        key = f"partition-id:{proxy.cid}"
        strategy.state.clients[key] = ClientEntry(examples(proxy), SETUP_ROUND, examples(proxy))
        strategy.state.total_examples += examples(proxy)
    sample = proxies[:: num_clients // SAMPLED][:SAMPLED]
    manager.next_sample = sample
    assert len(strategy.configure_fit(SETUP_ROUND + 1, aggregated, manager)) == SAMPLED
    timed = [duals_results(sample, replies, SETUP_ROUND) for replies in reply_sets]
    return strategy, timed, sample


def server_state_bytes(strategy: FedADMMClientDuals) -> int:
    """Z and S (float64), plus the per-key records (n_i, round, omega_i: 8 bytes each)."""
    arrays = [*(strategy.z or []), *(strategy.state.contribution_sum or [])]
    return int(sum(a.nbytes for a in arrays)) + 24 * len(strategy.state.clients)


def measure(
    num_parameters: int, num_clients: int, repeats: int, reply_sets: list[list[Parameters]]
) -> dict[str, Any]:
    """Time and memory of one configuration."""
    fedavg = FedAvg(fraction_evaluate=0.0)
    tracemalloc.start()
    strategy, timed, sample = prepared(num_parameters, num_clients, reply_sets)
    server_round = SETUP_ROUND + 1
    turns = {"FedAvg": itertools.count(), "ClientDuals": itertools.count()}

    def reset(name: str = "ClientDuals") -> None:
        for proxy in sample:  # the timed replies come from clients last seen at SETUP_ROUND
            strategy.state.clients[f"partition-id:{proxy.cid}"].last_round = SETUP_ROUND

    def run_fedavg() -> Any:
        return fedavg.aggregate_fit(server_round, timed[next(turns["FedAvg"]) % 2], [])

    def run_duals() -> Any:
        result = strategy.aggregate_fit(server_round, timed[next(turns["ClientDuals"]) % 2], [])
        assert result[1]["num_replies"] == SAMPLED, result[1]
        return result

    reset()
    memory = {"FedAvg": peak_extra_bytes(run_fedavg), "ClientDuals": peak_extra_bytes(run_duals)}
    tracemalloc.stop()
    wall, cpu = interleaved_times(
        {"FedAvg": run_fedavg, "ClientDuals": run_duals}, repeats, setup=reset
    )
    model_bytes = num_parameters * FLOAT
    one_pass = pass_seconds(num_parameters, max(5, repeats))
    fedavg_s, duals_s = median(cpu["FedAvg"]), median(cpu["ClientDuals"])
    return {
        "num_parameters": num_parameters,
        "num_clients": num_clients,
        "sampled": SAMPLED,
        "repeats": repeats,
        "fedavg_seconds": fedavg_s,
        "client_duals_seconds": duals_s,
        "time_ratio": duals_s / fedavg_s,
        "wall_time_ratio": median(wall["ClientDuals"]) / median(wall["FedAvg"]),
        "fedavg_cpu_times": cpu["FedAvg"],
        "client_duals_cpu_times": cpu["ClientDuals"],
        "pass_seconds": one_pass,
        "fedavg_passes_per_reply": fedavg_s / one_pass / SAMPLED,
        "client_duals_passes_per_reply": duals_s / one_pass / SAMPLED,
        "model_bytes": model_bytes,
        "server_state_bytes": server_state_bytes(strategy),
        "server_state_models": server_state_bytes(strategy) / model_bytes,
        "fedavg_peak_extra_models": memory["FedAvg"] / model_bytes,
        "client_duals_peak_extra_models": memory["ClientDuals"] / model_bytes,
    }


def repeats_for(num_parameters: int, quick: bool) -> int:
    """More repeats for the fast small models, an odd count for a clean median."""
    if quick:
        return 5
    return 31 if num_parameters <= 10**4 else 9 if num_parameters <= 10**6 else 5


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Run every configuration, print the table and write JSON."""
    args = base_parser(__doc__.splitlines()[0]).parse_args(argv)
    quiet_flower()
    sizes = (10**4, 10**5) if args.quick else (10**4, 10**6, 10**7)
    counts = (10, 100) if args.quick else (10, 100, 1000)
    started = time.perf_counter()
    rows = []
    settle_allocator()
    with threadpool_limits(BLAS_THREADS):
        for num_parameters in sizes:
            # The server keeps no view into a reply, so the sets can serve every N.
            reply_sets = [make_replies(num_parameters, seed=k) for k in range(2)]
            for num_clients in counts:
                repeats = repeats_for(num_parameters, args.quick)
                rows.append(measure(num_parameters, num_clients, repeats, reply_sets))
                row = rows[-1]
                print(
                    f"P={num_parameters:.0e} N={num_clients}: FedAvg "
                    f"{row['fedavg_seconds'] * 1e3:.2f} ms, ClientDuals "
                    f"{row['client_duals_seconds'] * 1e3:.2f} ms, ratio {row['time_ratio']:.2f}",
                    flush=True,
                )
            del reply_sets
    print_table(rows)
    payload = {
        "quick": args.quick,
        "blas_threads": BLAS_THREADS,
        "seconds": time.perf_counter() - started,
        "results": rows,
    }
    path = write_json("client_duals_cost", payload, args.output)
    print(f"\nwrote {path} ({payload['seconds']:.0f} s)")
    return payload


def print_table(rows: list[dict[str, Any]]) -> None:
    """Time and memory per configuration."""
    headers = [
        "params",
        "clients",
        "FedAvg ms",
        "ClientDuals ms",
        "time ratio (CPU)",
        "time ratio (wall)",
        "passes/reply FedAvg",
        "passes/reply ClientDuals",
        "server state",
        "FedAvg peak extra (models)",
        "ClientDuals peak extra (models)",
    ]
    table = [
        [
            f"{r['num_parameters']:.0e}",
            r["num_clients"],
            f"{r['fedavg_seconds'] * 1e3:.2f}",
            f"{r['client_duals_seconds'] * 1e3:.2f}",
            f"{r['time_ratio']:.2f}",
            f"{r['wall_time_ratio']:.2f}",
            f"{r['fedavg_passes_per_reply']:.1f}",
            f"{r['client_duals_passes_per_reply']:.1f}",
            size_text(r["server_state_bytes"]),
            f"{r['fedavg_peak_extra_models']:.1f}",
            f"{r['client_duals_peak_extra_models']:.1f}",
        ]
        for r in rows
    ]
    print("\n" + format_table(headers, table))


if __name__ == "__main__":
    main()
