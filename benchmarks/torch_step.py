"""The PyTorch client's cost per local step vs a bare PyTorch training step.

On the same model, data, minibatches and optimizer (SGD), three loops run
interleaved, each for `steps` steps:

- bare: ``zero_grad; loss(model(x), y).backward(); optimizer.step()`` (a FedAvg client);
- prox: the same plus ``admm.after_step(optimizer)``, the decoupled proximal step of
  `flwr_admm.torch.TorchADMM` (``penalty="prox"``: the simulations app's loop);
- loss: ``penalty="loss"``, rho/2 ||w - v||^2 added to the loss.

rho = 0.1 around a center v != w. Times are CPU times of the process with one torch
thread and deterministic algorithms (as the simulation clients run); the ratio to bare
is taken per repeat and reported as the median with its quartiles.

    python -m benchmarks.torch_step [--quick]
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from benchmarks.common import base_parser, format_table, interleaved_times, median, write_json
from flwr_admm.data import load_task
from flwr_admm.torch import TorchADMM, state_arrays
from flwr_admm.torch.models import SmallCNN, TorchLogistic, TorchSoftmax

RHO = 0.1


@dataclass(frozen=True)
class Case:
    """One model on one task's first client, minibatches of `batch_size` (None: full)."""

    label: str
    task: str
    build: Callable[[], torch.nn.Module]
    batch_size: int | None
    learning_rate: float


CASES = (
    Case(
        "logistic, seed-logreg, full batch",
        "seed-logreg",
        lambda: TorchLogistic(20, l2=0.01),
        None,
        1.0,
    ),
    Case("softmax, digits, batch 16", "digits", lambda: TorchSoftmax(64, 10, l2=1e-3), 16, 0.5),
    Case("cnn (BatchNorm), digits, batch 16", "digits", lambda: SmallCNN((1, 8, 8), 10), 16, 0.5),
)


def make_loop(case: Case, penalty: str | None, steps: int) -> Callable[[], object]:
    """Return a closure running `steps` local steps (penalty None: the bare loop)."""
    task = load_task(case.task, seed=42)
    X = torch.as_tensor(task.data.X[0], dtype=torch.float32)
    y = torch.as_tensor((task.data.y[0] == 1) if case.task == "seed-logreg" else task.data.y[0])
    y = y.to(torch.float32 if case.task == "seed-logreg" else torch.int64)
    torch.manual_seed(0)
    model = case.build()
    center = {n: a + 0.01 for n, a in state_arrays(model).items()}
    admm = None
    if penalty is not None:
        admm = TorchADMM.from_parameters(
            model,
            list(center.values()),
            {"rho": RHO},
            penalty=penalty,  # type: ignore[arg-type]
        )
        admm.start(init="center")
    optimizer = torch.optim.SGD(model.parameters(), lr=case.learning_rate)
    size = case.batch_size or X.shape[0]
    order = np.random.default_rng(0).permutation(X.shape[0])
    batches = [order[i : i + size] for i in range(0, X.shape[0] - size + 1, size)]
    model.train()
    loss_of: Callable[[torch.Tensor, torch.Tensor], Any] = model.loss  # type: ignore[assignment]

    def bare() -> None:
        for k in range(steps):
            index = batches[k % len(batches)]
            optimizer.zero_grad()
            loss_of(X[index], y[index]).backward()
            optimizer.step()

    def client() -> None:
        assert admm is not None
        for k in range(steps):
            index = batches[k % len(batches)]
            optimizer.zero_grad()
            loss = loss_of(X[index], y[index])
            if admm.penalty == "loss":  # the app's loop: prox mode adds nothing to the loss
                loss = loss + admm.penalty_term()
            loss.backward()
            optimizer.step()
            admm.after_step(optimizer)

    return bare if penalty is None else client


def measure(case: Case, steps: int, repeats: int) -> dict[str, Any]:
    """Return per-step CPU costs and the per-repeat ratios to the bare step."""
    loops = {
        name: make_loop(case, penalty, steps)
        for name, penalty in (("bare", None), ("prox", "prox"), ("loss", "loss"))
    }
    for loop in loops.values():
        loop()  # warm-up: allocator, autograd graph caches
    _, cpu = interleaved_times(loops, repeats)
    row: dict[str, Any] = {"case": case.label, "steps": steps, "repeats": repeats}
    for name in loops:
        row[f"{name}_us_per_step"] = 1e6 * median(cpu[name]) / steps
    for name in ("prox", "loss"):
        ratios = [a / b for a, b in zip(cpu[name], cpu["bare"], strict=True)]
        quartiles = statistics.quantiles(ratios, n=4) if len(ratios) >= 2 else [ratios[0]] * 3
        row[f"{name}_ratio"] = median(ratios)
        row[f"{name}_ratio_q1"], row[f"{name}_ratio_q3"] = quartiles[0], quartiles[2]
        row[f"{name}_cpu_seconds"] = cpu[name]
    row["bare_cpu_seconds"] = cpu["bare"]
    return row


def main(argv: list[str] | None = None) -> int:
    """Run every case; print the table and write the JSON."""
    args = base_parser(__doc__ or "").parse_args(argv)
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    steps, repeats = (20, 3) if args.quick else (200, 15)
    results = [measure(case, steps, repeats) for case in CASES]
    rows = [
        [
            r["case"],
            f"{r['bare_us_per_step']:.0f}",
            f"{r['prox_us_per_step']:.0f}",
            f"{r['prox_ratio']:.3f} [{r['prox_ratio_q1']:.3f}, {r['prox_ratio_q3']:.3f}]",
            f"{r['loss_ratio']:.3f} [{r['loss_ratio_q1']:.3f}, {r['loss_ratio_q3']:.3f}]",
        ]
        for r in results
    ]
    headers = ["case", "bare us/step", "prox us/step", "prox / bare", "loss / bare"]
    print(format_table(headers, rows))
    path = write_json(
        "torch_step",
        {"rho": RHO, "torch": torch.__version__, "quick": args.quick, "results": results},
        args.output,
    )
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
