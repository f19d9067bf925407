"""The app's run config: kebab-case keys, defaults, validation, task-default resolution.

`DEFAULTS` mirrors ``[tool.flwr.app.config]`` in simulations/pyproject.toml (a test
checks they agree). `parse_run_config` turns a Flower run config (or any mapping of
those keys) into a validated `RunSettings`; every error names the key and what it
accepts. Learning rate, fraction-fit and local work left at 0 (and batch size at -1)
take the task's recommended values (`Task.defaults`; a task naming none gets lr 0.1,
10 local steps, full participation).
"""

from __future__ import annotations

import inspect
import math
import re
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from logging import WARNING
from pathlib import Path
from typing import Any

from flwr.common.logger import log

from flwr_admm.core.local_solver import PROX_STEPS
from flwr_admm.core.schedules import SCHEDULES
from flwr_admm.data.registry import TASKS
from flwr_admm.options import KEY_BINDINGS

from . import checkpoint_config as ckpt
from . import form_config as forms

STRATEGIES = (
    "fedadmm",
    "fedadmm-client-duals",
    "fedavg",
    "fedprox",
    "fednova",
    "scaffold",
    "feddyn",
)
APIS = ("message", "legacy")
PEER_STRATEGIES = ("scaffold", "feddyn")  # numpy clients only; both APIs
PARTITIONERS = ("iid", "dirichlet", "pathological")
FRAMEWORKS = ("numpy", "torch")
TORCH_MODELS = ("cnn",)  # models only framework=torch has (besides the tasks' own)

# "consensus" (start at the received z) needs client-held duals: refused for "fedadmm";
# "auto" is "consensus" under client-held duals and "previous" under server-held ones
LOCAL_INITS = ("auto", "previous", "center", "consensus")

DEFAULTS: dict[str, Any] = {
    "api": "message",
    "strategy": "fedadmm",
    "task": "seed-logreg",
    "num-server-rounds": 50,
    "num-clients": 0,
    "rho": 0.1,
    "rho-schedule": "constant",
    "relaxation": 1.0,
    "dual-step": 1.0,
    "local-init": "auto",
    "prox-step": "exact",
    "local-steps": 0,
    "local-epochs": 0,
    "batch-size": -1,
    "learning-rate": 0.0,
    "proximal-mu": 0.1,
    "fraction-fit": 0.0,
    "model": "",
    "partitioner": "dirichlet",
    "dirichlet-alpha": 0.5,
    "seed": 42,
    "output-dir": "outputs",
    "run-tag": "",
    "client-wait-seconds": 120.0,
    "round-timeout": 0.0,
    "key-binding": "node",
    "framework": "numpy",
    "server-learning-rate": 1.0,
    "feddyn-alpha": 0.1,
    "secure-aggregation": False,
    **ckpt.CHECKPOINT_DEFAULTS,
    **forms.FORM_DEFAULTS,
}

HELP: dict[str, str] = {
    "api": f"one of {list(APIS)} (Flower's Message API or the legacy strategy API)",
    "strategy": f"one of {list(STRATEGIES)}",
    "task": "a task name of flwr_admm.data.registry.TASKS",
    "num-server-rounds": "integer >= 1",
    "num-clients": "integer >= 0 (0 = the task's own number of clients)",
    "rho": "FedADMM penalty, number >= 0",
    "rho-schedule": f"one of {sorted(SCHEDULES)}",
    "relaxation": "FedADMM over-relaxation alpha, number in (0, 2) (1 = plain ADMM)",
    "dual-step": "FedADMM dual step gamma, number in (0, 1] (1 = the textbook step), or "
    '"adaptive" (FedADMM()\'s AdaptiveDualStep, from 0.2)',
    "local-init": f"FedADMM warm start, one of {list(LOCAL_INITS)} (consensus: the received z, "
    "not with strategy fedadmm, whose server-held duals send z - u_i; auto: consensus with "
    "client-held duals, else previous)",
    "prox-step": f"one of {list(PROX_STEPS)}",
    "local-steps": "integer >= 0 (local-steps = local-epochs = 0: task default)",
    "local-epochs": "integer >= 0 (local-steps = local-epochs = 0: task default)",
    "batch-size": "integer >= -1 (-1 = task default, 0 = full batch)",
    "learning-rate": "number >= 0 (0 = task default)",
    "proximal-mu": "FedProx mu, number >= 0",
    "fraction-fit": "number in [0, 1] (0 = task default, else 1)",
    "model": "'' (task default) or a model name the task accepts (softmax, mlp)",
    "partitioner": f"one of {list(PARTITIONERS)}",
    "dirichlet-alpha": "number > 0",
    "seed": "integer >= 0",
    "output-dir": "a directory path",
    "run-tag": "'' or letters, digits, '.', '_', '-' (results go to <strategy>-<run-tag>.json)",
    "client-wait-seconds": "number > 0",
    "round-timeout": "number >= 0: seconds a round waits for replies (0 = no limit)",
    "key-binding": f"client identity (FedADMM*, SCAFFOLD, FedDyn), one of {list(KEY_BINDINGS)}",
    "framework": f"client framework, one of {list(FRAMEWORKS)} (torch: pip install torch)",
    "server-learning-rate": "SCAFFOLD's server step eta_g, number > 0",
    "feddyn-alpha": "FedDyn's alpha, number > 0",
    "secure-aggregation": "true or false: SecAgg+ (strategy=fedadmm-client-duals; legacy path)",
    **ckpt.CHECKPOINT_HELP,
    **forms.FORM_HELP,
}


@dataclass(frozen=True)
class RunSettings:
    """Validated run config, with learning rate and local work resolved for the task."""

    strategy: str
    task: str
    num_server_rounds: int
    num_clients: int
    rho: float
    rho_schedule: str
    relaxation: float
    dual_step: float | str  # or "adaptive"
    local_init: str
    prox_step: str
    local_steps: int | None
    local_epochs: int | None
    batch_size: int | None
    learning_rate: float
    proximal_mu: float
    fraction_fit: float
    min_fit_clients: int
    model: str
    partitioner: str
    dirichlet_alpha: float
    seed: int
    output_dir: str
    run_tag: str
    client_wait_seconds: float
    round_timeout: float | None = None
    key_binding: str = "node"
    api: str = "message"
    framework: str = "numpy"
    server_learning_rate: float = 1.0
    feddyn_alpha: float = 0.1
    secure_aggregation: bool = False
    checkpoint: ckpt.CheckpointSettings = field(default_factory=ckpt.CheckpointSettings)
    form: forms.FormSettings = field(default_factory=forms.FormSettings)

    @property
    def task_dir(self) -> Path:
        """``output-dir/<task>``, made absolute."""
        return Path(self.output_dir).expanduser().resolve() / self.task

    @property
    def stem(self) -> str:
        """File stem of this run's results: ``<strategy>`` or ``<strategy>-<run-tag>``."""
        return f"{self.strategy}-{self.run_tag}" if self.run_tag else self.strategy

    def task_options(self) -> dict[str, Any]:
        """Options for `load_task` (only those its factory accepts)."""
        options: dict[str, Any] = {
            "partitioner": self.partitioner,
            "dirichlet_alpha": self.dirichlet_alpha,
        }
        explicit = {
            "num_clients": ("num-clients", self.num_clients),
            "model": ("model", "" if self.model in TORCH_MODELS else self.model),
        }
        for option, (key, value) in explicit.items():
            if not value:
                continue
            if not accepted_options(self.task, {option: value}):
                raise ValueError(
                    f"run config {key!r}: task {self.task!r} has no such "
                    f"option; leave it at {DEFAULTS[key]!r}"
                )
            options[option] = value
        return accepted_options(self.task, options)

    def to_dict(self) -> dict[str, Any]:
        """Plain dict (JSON-serializable)."""
        return asdict(self)


def accepted_options(task: str, options: dict[str, Any]) -> dict[str, Any]:
    """Keep the options the task factory names; **kwargs factories get all of them."""
    parameters = inspect.signature(TASKS[task]).parameters
    named = {name for name, p in parameters.items() if p.kind is not p.VAR_KEYWORD}
    if any(p.kind is p.VAR_KEYWORD for p in parameters.values()) and named <= {"seed"}:
        return dict(options)  # a catch-all factory: it decides what to ignore
    return {key: value for key, value in options.items() if key in named}


def _fail(key: str, value: Any) -> ValueError:
    return ValueError(f"run config {key!r}: must be {HELP[key]}, got {value!r}")


def _integer(config: Mapping[str, Any], key: str, minimum: int) -> int:
    value = config[key]
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise _fail(key, value)
    if int(value) != value or value < minimum:
        raise _fail(key, value)
    return int(value)


def _number(
    config: Mapping[str, Any],
    key: str,
    minimum: float,
    *,
    strict: bool = False,
    maximum: float | None = None,
) -> float:
    value = config[key]
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise _fail(key, value)
    if value < minimum or (strict and value == minimum):
        raise _fail(key, value)
    if maximum is not None and value > maximum:
        raise _fail(key, value)
    return float(value)


def _relaxation(config: Mapping[str, Any]) -> float:
    value = _number(config, "relaxation", 0.0, strict=True, maximum=2.0)
    if value == 2.0:
        raise _fail("relaxation", value)
    return value


def _dual_step(config: Mapping[str, Any]) -> float | str:
    if config["dual-step"] == "adaptive":
        return "adaptive"
    return _number(config, "dual-step", 0.0, strict=True, maximum=1.0)


def _choice(config: Mapping[str, Any], key: str, allowed: Any) -> str:
    value = config[key]
    if not isinstance(value, str) or value not in allowed:
        raise _fail(key, value)
    return value


def _run_tag(config: Mapping[str, Any]) -> str:
    value = config["run-tag"]
    if not isinstance(value, str) or not re.fullmatch(r"[A-Za-z0-9_.-]*", value):
        raise _fail("run-tag", value)
    return value


def parse_run_config(
    run_config: Mapping[str, Any], task_defaults: Mapping[str, Any] | None = None
) -> RunSettings:
    """Validate `run_config` (missing keys take `DEFAULTS`) and resolve task defaults.

    `task_defaults` is the task's `Task.defaults`; pass it once the task is loaded
    (learning_rate, local_steps / local_epochs, batch_size, fraction_fit,
    min_fit_clients). Without it the result only validates: learning_rate may be 0
    and local_steps / local_epochs None (unresolved).
    """
    unknown = sorted(set(run_config) - set(DEFAULTS))
    if unknown:
        raise ValueError(f"run config: unknown keys {unknown}; allowed keys are {sorted(DEFAULTS)}")
    config = {**DEFAULTS, **run_config}
    task = config["task"]
    if not isinstance(task, str) or task not in TASKS:
        raise ValueError(f"run config 'task': must be one of {sorted(TASKS)}, got {task!r}")
    steps = _integer(config, "local-steps", 0)
    epochs = _integer(config, "local-epochs", 0)
    if steps > 0 and epochs > 0:
        raise ValueError(
            "run config 'local-steps' / 'local-epochs': set at most one of them > 0, "
            f"got local-steps={steps}, local-epochs={epochs}"
        )
    batch = _integer(config, "batch-size", -1)
    lr = _number(config, "learning-rate", 0.0)
    defaults = dict(task_defaults or {})
    if steps == 0 and epochs == 0:
        steps = int(defaults.get("local_steps") or 0)
        epochs = int(defaults.get("local_epochs") or 0)
        if steps == 0 and epochs == 0:
            steps = 10 if task_defaults is not None else 0
    if batch == -1:
        batch = int(defaults.get("batch_size") or 0)
    if lr == 0.0:
        lr = float(defaults.get("learning_rate", 0.1 if task_defaults is not None else 0.0))
    output_dir = config["output-dir"]
    if not isinstance(output_dir, str) or not output_dir.strip():
        raise _fail("output-dir", output_dir)
    rho_schedule = _choice(config, "rho-schedule", SCHEDULES)
    fraction = _number(config, "fraction-fit", 0.0, maximum=1.0)
    min_fit_clients = 1
    if fraction == 0.0:  # the task's sampling, with its guard against rounding down
        fraction = float(defaults.get("fraction_fit", 1.0))
        min_fit_clients = int(defaults.get("min_fit_clients", 1))
    model = config["model"]
    if not isinstance(model, str):
        raise _fail("model", model)
    strategy = _choice(config, "strategy", STRATEGIES)
    secure = secure_aggregation_of(config)
    if secure and strategy != "fedadmm-client-duals":
        raise ValueError(
            "run config 'secure-aggregation': true needs strategy=fedadmm-client-duals "
            f"(the only strategy that needs just the sum of the replies), got {strategy!r}"
        )
    api = _choice(config, "api", APIS)
    if secure and api != "legacy":  # Flower 1.42 has SecAgg+ on the legacy API only
        log(
            WARNING,
            "run config 'secure-aggregation': true runs the legacy API (SecAgg+ has no "
            "Message-API workflow in Flower 1.42); api=%r is overridden",
            api,
        )
        api = "legacy"
    key_binding = _choice(config, "key-binding", KEY_BINDINGS)
    return RunSettings(
        strategy=strategy,
        task=task,
        num_server_rounds=_integer(config, "num-server-rounds", 1),
        num_clients=_integer(config, "num-clients", 0),
        rho=_number(config, "rho", 0.0),
        rho_schedule=rho_schedule,
        relaxation=_relaxation(config),
        dual_step=_dual_step(config),
        local_init=_choice(config, "local-init", LOCAL_INITS),
        prox_step=_choice(config, "prox-step", PROX_STEPS),
        local_steps=steps if steps > 0 else None,
        local_epochs=epochs if epochs > 0 else None,
        batch_size=batch if batch > 0 else None,
        learning_rate=lr,
        proximal_mu=_number(config, "proximal-mu", 0.0),
        fraction_fit=fraction,
        min_fit_clients=min_fit_clients,
        model=model,
        partitioner=_choice(config, "partitioner", PARTITIONERS),
        dirichlet_alpha=_number(config, "dirichlet-alpha", 0.0, strict=True),
        seed=_integer(config, "seed", 0),
        output_dir=output_dir,
        run_tag=_run_tag(config),
        client_wait_seconds=_number(config, "client-wait-seconds", 0.0, strict=True),
        round_timeout=_number(config, "round-timeout", 0.0) or None,
        key_binding=key_binding,
        api=api,
        framework=_checked_local_init(
            config, _framework(config, model, secure, strategy), strategy
        ),
        server_learning_rate=_number(config, "server-learning-rate", 0.0, strict=True),
        feddyn_alpha=_number(config, "feddyn-alpha", 0.0, strict=True),
        secure_aggregation=secure,
        checkpoint=ckpt.checkpoint_settings(config, strategy),
        form=forms.form_settings(config, DEFAULTS, strategy),
    )


def _framework(config: Mapping[str, Any], model: str, secure: bool, strategy: str) -> str:
    framework = _choice(config, "framework", FRAMEWORKS)
    if strategy in PEER_STRATEGIES and framework != "numpy":
        raise ValueError(
            f"run config 'framework': strategy={strategy!r} runs the numpy clients "
            f"(flwr_admm.node.peers); must be 'numpy', got {framework!r}"
        )
    if model in TORCH_MODELS and framework != "torch":
        raise ValueError(
            f"run config 'model': {model!r} needs framework='torch', got {framework!r}"
        )
    if secure and framework != "numpy":
        raise ValueError(
            "run config 'framework': secure-aggregation runs the numpy clients; "
            f"must be 'numpy' with secure-aggregation=true, got {framework!r}"
        )
    return framework


def _checked_local_init(config: Mapping[str, Any], framework: str, strategy: str) -> str:
    """Refuse local-init='consensus' where the server sends no z; return framework.

    Server-held duals (strategy fedadmm) send v_i = z - u_i, not z: both clients
    (`ADMMClient`, `TorchADMM.start`) would refuse it at fit. Client-held duals send z,
    and FedProx / FedAvg send the model itself, with numpy and torch clients alike.
    """
    if config["local-init"] == "consensus" and strategy == "fedadmm":
        raise ValueError(
            "run config 'local-init': 'consensus' starts the local solve at the received z, "
            "which strategy='fedadmm' (server-held duals) does not send; use "
            f"strategy='fedadmm-client-duals' or local-init 'previous' / 'center' "
            f"(got strategy={strategy!r}, framework={framework!r})"
        )
    return framework


def framework_of(run_config: Mapping[str, Any]) -> str:
    """Return the validated ``framework`` of `run_config` (the default when absent)."""
    return _choice({**DEFAULTS, **run_config}, "framework", FRAMEWORKS)


def api_of(run_config: Mapping[str, Any]) -> str:
    """Return the validated ``api`` of `run_config` (the default when absent)."""
    return _choice({**DEFAULTS, **run_config}, "api", APIS)


def secure_aggregation_of(run_config: Mapping[str, Any]) -> bool:
    """Return the validated ``secure-aggregation`` of `run_config` (default false).

    True runs the legacy strategy under Flower's ``SecAggPlusWorkflow`` and the
    clients under ``secaggplus_mod`` whatever ``api`` says: Flower 1.42 has SecAgg+
    for legacy strategies only (`simulations.admm_app.secure_server`).
    """
    value = {**DEFAULTS, **run_config}["secure-aggregation"]
    if not isinstance(value, bool):
        raise _fail("secure-aggregation", value)
    return value


def fit_config(settings: RunSettings) -> dict[str, Any]:
    """What every client receives in its fit config (besides rho / proximal_mu)."""
    config: dict[str, Any] = {
        "learning_rate": settings.learning_rate,
        "batch_size": settings.batch_size or 0,
    }
    if settings.local_epochs is not None:
        config["local_epochs"] = settings.local_epochs
    else:
        config["local_steps"] = settings.local_steps
    return config
