"""What FedADMMClientDuals' server retains per client key, by allocation site.

Runs `benchmarks.scale`'s driver setup (N in-process clients, 10% a round, 6 rounds,
a 6-parameter model) under tracemalloc and prints the retained bytes of the
strategy's frames by source line, the keys held and the bytes per key:

    PYTHONPATH=. python scripts/client_duals_memory.py [--clients 10000]
"""

from __future__ import annotations

import argparse
import tracemalloc

from benchmarks.scale import STATE_FILES, client_fn, make_strategy
from flwr_admm.testing import make_proxies, run_rounds


def main() -> None:
    """Print the retained bytes by source line, the keys held and the bytes per key."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--clients", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--top", type=int, default=10)
    args = parser.parse_args()
    proxies = make_proxies(client_fn, args.clients)
    strategy = make_strategy("FedADMMClientDuals", args.clients, 0.1)
    strategy.evaluate = lambda server_round, parameters: None  # type: ignore[assignment,method-assign]
    tracemalloc.start(40)
    before = tracemalloc.take_snapshot()
    run_rounds(strategy, proxies, args.rounds)
    after = tracemalloc.take_snapshot()
    tracemalloc.stop()
    filters = [tracemalloc.Filter(True, p, all_frames=True) for p in STATE_FILES]
    diff = after.filter_traces(filters).compare_to(before.filter_traces(filters), "lineno")
    total = sum(s.size_diff for s in diff)
    keys = len(strategy.state.clients)
    for stat in diff[: args.top]:
        frame = stat.traceback[0]
        print(
            f"{stat.size_diff / 1024:9.1f} KiB  {stat.count_diff:7d} blocks  "
            f"{frame.filename.split('flwr_admm/')[-1]}:{frame.lineno}"
        )
    print(
        f"total {total / 2**20:.2f} MiB retained, {keys} keys held, "
        f"{total / keys:.0f} B per key ({args.clients} clients, {args.rounds} rounds)"
    )


if __name__ == "__main__":
    main()
