"""Benchmarks of flwr-admm against Flower's own strategies, measured as ratios.

Run one with ``python -m benchmarks.<name> [--quick] [--output PATH]`` or all of them
with ``python -m benchmarks.all [--quick]``:

- `benchmarks.convergence`: rounds to a target (objective gap or test accuracy),
  FedAvg / FedProx / FedADMM each tuned over the same grid;
- `benchmarks.server_cost`: ``aggregate_fit`` time and peak memory, FedADMM vs FedAvg
  on identical replies;
- `benchmarks.engine`: seconds per round in Flower's Ray simulation engine;
- `benchmarks.client_loop`: the penalized local loop vs a bare gradient loop;

Every script prints a table and writes JSON (``benchmarks/results/<name>.json`` by
default). Times are only ever compared with a baseline measured in the same run,
interleaved and repeated (medians): the machines are shared and absolute times drift.
"""
