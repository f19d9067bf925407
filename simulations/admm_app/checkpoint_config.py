"""The run-config keys of server checkpoints: ``checkpoint-dir``, ``checkpoint-every``, ``resume``.

Only the ADMM strategies (``fedadmm``, ``fedadmm-client-duals``) checkpoint: after
every ``checkpoint-every`` aggregated rounds their full server state (z, the cached
w_i and duals, the sums, rho, the key bindings) goes to ``checkpoint-dir``
(`flwr_admm.rounds.checkpoint`). With ``resume = true`` and a checkpoint there, the
run starts from it: its first round is the checkpoint's round + 1 and it ends at round
``num-server-rounds`` (the total, as in the interrupted run); without a checkpoint
there it starts fresh. Run-config values are scalars, so ``""`` means no checkpoints.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from flwr_admm.options import Checkpointing

CHECKPOINT_STRATEGIES = ("fedadmm", "fedadmm-client-duals")

CHECKPOINT_DEFAULTS: dict[str, Any] = {
    "checkpoint-dir": "",
    "checkpoint-every": 1,
    "resume": False,
}

CHECKPOINT_HELP: dict[str, str] = {
    "checkpoint-dir": "'' (no checkpoints) or a directory path (strategy fedadmm or "
    "fedadmm-client-duals; relative paths resolve against the SuperLink's cwd)",
    "checkpoint-every": "integer >= 1: checkpoint after every this many rounds",
    "resume": "true or false: start from the checkpoint in checkpoint-dir, if there is one",
}


@dataclass(frozen=True)
class CheckpointSettings:
    """Validated checkpoint keys; `directory` is None when checkpoints are off."""

    directory: str | None = None
    every: int = 1
    resume: bool = False

    def checkpointing(self) -> Checkpointing | None:
        """The ``checkpoint`` of FedADMM / FedADMMClientDuals (both APIs); None: off."""
        if self.directory is None:
            return None
        return Checkpointing(self.directory, self.every, self.resume)


def _fail(key: str, value: Any) -> ValueError:
    return ValueError(f"run config {key!r}: must be {CHECKPOINT_HELP[key]}, got {value!r}")


def checkpoint_settings(config: Mapping[str, Any], strategy: str) -> CheckpointSettings:
    """Validate the checkpoint keys of `config` (missing keys take their defaults)."""
    config = {**CHECKPOINT_DEFAULTS, **config}
    directory, every, resume = (config[key] for key in CHECKPOINT_DEFAULTS)
    if not isinstance(directory, str) or (directory and not directory.strip()):
        raise _fail("checkpoint-dir", directory)
    if (
        isinstance(every, bool)
        or not isinstance(every, int | float)
        or not math.isfinite(every)
        or int(every) != every
        or every < 1
    ):
        raise _fail("checkpoint-every", every)
    if not isinstance(resume, bool):
        raise _fail("resume", resume)
    if directory and strategy not in CHECKPOINT_STRATEGIES:
        raise ValueError(
            f"run config 'checkpoint-dir': only strategies {list(CHECKPOINT_STRATEGIES)} "
            f"checkpoint; leave it at '' with strategy={strategy!r}"
        )
    if resume and not directory:
        raise ValueError("run config 'resume': true needs a 'checkpoint-dir' to resume from")
    path = str(Path(directory).expanduser().resolve()) if directory else None
    return CheckpointSettings(path, int(every), resume)


def remaining_rounds(num_server_rounds: int, done: int) -> int:
    """Return the rounds left after a resume at round `done`; raise if none are."""
    if done >= num_server_rounds:
        raise ValueError(
            f"run config 'resume': the checkpoint is at round {done}, not before "
            f"num-server-rounds={num_server_rounds}; nothing left to run"
        )
    return num_server_rounds - done
