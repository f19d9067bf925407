"""A real Flower deployment: one SuperLink, N SuperNodes, `flwr run` (the CLI).

    python -m simulations.deployment --supernodes 3 --rounds 10 [--strategy fedadmm] \
        [--task seed-logreg] [--run-config 'api=message rho=0.5 ...'] \
        [--kill-node 2 --kill-round 3] [--tls] [--auth --unregistered 1] \
        [--network auto|netns|loopback]

The deployment itself is `simulations.federation.LoopbackDeployment` (processes in
`simulations.deploy_process`, certificates and keys in `simulations.credentials`,
network namespaces in `simulations.netns`). This module parses the command line,
validates the run config, deploys, optionally kills and restarts one SuperNode
mid-run, and prints one line per round from the results JSON.

SIGTERM is the default kill: the SuperNode then deactivates itself and the SuperLink
answers its pending messages with NODE_UNAVAILABLE at once. After SIGKILL the
SuperLink notices only when two heartbeats are missed (60 s in Flower 1.42).
"""

from __future__ import annotations

import argparse
import math
import signal
import sys
import time
from pathlib import Path
from typing import Any

from .admm_app.evaluation import get_task
from .admm_app.run_config import accepted_options, parse_run_config
from .compare import parse_overrides
from .deploy_process import CONNECTION, SubmittedRun, SuperNode, read_log, wait_for_log
from .federation import NETWORKS, LoopbackDeployment
from .report import check_result

__all__ = [
    "CONNECTION",
    "LoopbackDeployment",
    "SubmittedRun",
    "SuperNode",
    "build_parser",
    "main",
    "print_rounds",
    "restart_may_hang",
    "run_config_of",
    "wait_for_log",
]


# ----------------------------------------------------------------------- CLI
RESTART_RETRY_SECONDS = 180.0  # two missed heartbeats (about 60 s) and then some


def build_parser() -> argparse.ArgumentParser:
    """The command line."""
    parser = argparse.ArgumentParser(
        prog="python -m simulations.deployment", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--supernodes", type=int, default=3, help="one per partition")
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--strategy", default="fedadmm")
    parser.add_argument("--task", default="seed-logreg")
    parser.add_argument("--run-config", default="", help="app run-config overrides: 'k=v ...'")
    parser.add_argument("--output-dir", default="outputs")
    parser.add_argument(
        "--kill-node", type=int, default=None, help="partition-id of a SuperNode to kill mid-run"
    )
    parser.add_argument(
        "--kill-round", type=int, default=2, help="kill it while it trains this round"
    )
    parser.add_argument(
        "--kill-signal",
        choices=("TERM", "KILL"),
        default="TERM",
        help="TERM: the node deactivates itself; KILL: a crash (the SuperLink notices "
        "after two missed heartbeats unless the run config sets round-timeout)",
    )
    parser.add_argument(
        "--restart-after",
        type=float,
        default=5.0,
        help="seconds between the kill and the restart (negative: no restart)",
    )
    parser.add_argument(
        "--home", default=None, help="FLWR_HOME and logs (kept); default: temporary, removed"
    )
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds for the run")
    parser.add_argument(
        "--tls", action="store_true", help="TLS with a CA and certificate made for the run"
    )
    parser.add_argument(
        "--auth",
        action="store_true",
        help="SuperNode authentication (implies --tls): a registered EC key per SuperNode",
    )
    parser.add_argument(
        "--unregistered",
        type=int,
        default=0,
        help="with --auth: extra SuperNodes whose keys are not registered (must be refused)",
    )
    parser.add_argument(
        "--network",
        choices=NETWORKS,
        default="auto",
        help="netns: SuperLink and SuperNodes in their own network namespaces joined by "
        "veth pairs (needs root); auto: netns where possible, else loopback",
    )
    return parser


def run_config_of(args: argparse.Namespace) -> dict[str, Any]:
    """The app run config of the command line, validated (ValueError names the field)."""
    if args.supernodes < 1:
        raise ValueError(f"--supernodes: must be >= 1, got {args.supernodes}")
    config = {
        **parse_overrides(args.run_config),
        "strategy": args.strategy,
        "task": args.task,
        "num-server-rounds": args.rounds,
        "output-dir": str(Path(args.output_dir).expanduser().resolve()),
    }
    if args.auth and "key-binding" not in config and config.get("api", "legacy") == "legacy":
        config["key-binding"] = "authenticated"  # node ids are fixed by registered keys
    settings = parse_run_config(config)
    if "num-clients" not in config and accepted_options(args.task, {"num_clients": 1}):
        config["num-clients"] = args.supernodes
        settings = parse_run_config(config)
    clients = get_task(settings.task, settings.seed, settings.task_options()).data.num_clients
    if clients != args.supernodes:
        raise ValueError(
            f"--supernodes: task {args.task!r} has {clients} clients here; "
            f"run with --supernodes {clients}"
        )
    if args.unregistered < 0 or (args.unregistered and not args.auth):
        raise ValueError(f"--unregistered: must be >= 0 and needs --auth, got {args.unregistered}")
    if args.kill_node is not None:
        if not 0 <= args.kill_node < args.supernodes:
            raise ValueError(
                f"--kill-node: must be a partition-id in [0, {args.supernodes - 1}], "
                f"got {args.kill_node}"
            )
        if not 1 <= args.kill_round <= args.rounds:
            raise ValueError(f"--kill-round: must be in [1, {args.rounds}], got {args.kill_round}")
    return config


ROUND_COLUMNS = ("num_evicted", "num_key_conflicts", "num_resynced")  # of fit_metrics


def print_rounds(document: dict[str, Any] | None) -> None:
    """Print one line per round: results, failures, the identity counters, time, F, gap.

    ``evicted``: client keys dropped (under key-binding=node a restarted SuperNode's
    key, its old node gone, rejoins fresh); ``conflicts``: replies claiming a key
    bound to a node still connected; ``resynced``: key-binding=reported only.
    """
    print(
        "round  results  failures  evicted  conflicts  resynced  seconds  objective   relative_gap"
    )
    for record in (document or {}).get("rounds", [])[1:]:
        fit = record.get("fit_metrics", {})
        evicted, conflicts, resynced = (fit.get(name, "-") for name in ROUND_COLUMNS)
        print(
            f"{record['round']:5d}  {record.get('num_results', '-'):>7}  "
            f"{record.get('num_failures', '-'):>8}  {evicted:>7}  {conflicts:>9}  "
            f"{resynced:>8}  {record.get('round_seconds', math.nan):7.1f}  "
            f"{record.get('objective', math.nan):<10.6g}  "
            f"{record.get('relative_gap', math.nan):.3e}"
        )


def refusal(node: SuperNode) -> str:
    """Describe how an unregistered SuperNode fared: its exit status and refusal line."""
    status = node.process.poll()
    lines = [
        line
        for line in read_log(node.log_path).splitlines()
        if "node" in line.lower() and ("fail" in line.lower() or "denied" in line.lower())
    ]
    state = "still running" if status is None else f"exited with {status}"
    return f"{state}; " + (lines[-1].strip() if lines else "no refusal in its log")


def restart_may_hang(args: argparse.Namespace, round_timeout: float | None) -> bool:
    """Whether the kill and restart asked for can stall a round with no timeout.

    The SuperLink answers a message whose node is offline with an error reply, but only
    while that node is offline. A crashed node under SuperNode auth comes back with the
    same node id once its old registration expires; if it is active again before the
    ServerApp's next poll, the message the dead process had pulled stays pending until
    its TTL (12 h), and without ``round-timeout`` the round waits that long.
    """
    restarts = args.kill_node is not None and args.restart_after >= 0
    return restarts and args.auth and args.kill_signal == "KILL" and round_timeout is None


def main(argv: list[str] | None = None) -> int:
    """Deploy, run (with an optional kill and restart), check; 0 if the run is complete."""
    args = build_parser().parse_args(argv)
    try:
        config = run_config_of(args)
    except ValueError as error:
        raise SystemExit(str(error)) from None
    settings = parse_run_config(config)
    if restart_may_hang(args, settings.round_timeout):
        print(
            "WARNING: a SIGKILLed authenticated SuperNode that restarts under its node id "
            "can leave its round's message pending for good (Flower fails it only while "
            "the node is offline); set --run-config 'round-timeout=...' to bound that round",
            file=sys.stderr,
        )
    log_path = settings.task_dir / f"{settings.stem}.deployment.log"
    home = Path(args.home).resolve() if args.home else None
    deployment = LoopbackDeployment(
        args.supernodes,
        home=home,
        tls=args.tls or args.auth,
        auth=args.auth,
        unregistered=args.unregistered,
        network=args.network,
    )
    with deployment:
        nodes = ", ".join(
            f"{i}: pid {n.process.pid} node {n.node_id}" for i, n in deployment.supernodes.items()
        )
        security = "TLS" if deployment.tls else "insecure"
        security += " + SuperNode auth" if deployment.auth else ""
        print(f"network: {deployment.network_note}; {security}", flush=True)
        print(f"SuperLink {deployment.host}:{deployment.port}; SuperNodes {nodes}", flush=True)
        run = deployment.submit(config, log_path)
        restarted = True
        if args.kill_node is not None:
            sig = signal.SIGKILL if args.kill_signal == "KILL" else signal.SIGTERM
            pid = deployment.kill_during_round(
                args.kill_node, run, args.kill_round, args.timeout, sig
            )
            print(
                f"killed SuperNode {args.kill_node} (pid {pid}, SIG{args.kill_signal}) "
                f"in round {args.kill_round}"
            )
            if args.restart_after >= 0:
                time.sleep(args.restart_after)
                try:  # the run goes on with the other nodes meanwhile
                    node = deployment.restart_supernode(args.kill_node, RESTART_RETRY_SECONDS)
                    print(f"restarted it: pid {node.process.pid}, node {node.node_id}", flush=True)
                except (RuntimeError, TimeoutError) as error:
                    print(f"PROBLEM: SuperNode {args.kill_node} did not restart: {error}")
                    restarted = False
        outcome = run.wait(args.timeout)
        for intruder in deployment.intruders:
            print(f"unregistered SuperNode (pid {intruder.process.pid}): {refusal(intruder)}")
    print(f"flwr run: exit code {outcome.returncode}, {outcome.seconds:.1f} s, log {log_path}")
    document, problems = check_result(
        settings.task_dir, settings.stem, args.rounds, allow_failures=args.kill_node is not None
    )
    print_rounds(document)
    for problem in problems:
        print(f"PROBLEM: {problem}", file=sys.stderr)
    return 0 if outcome.returncode == 0 and not problems and restarted else 1


if __name__ == "__main__":
    raise SystemExit(main())
