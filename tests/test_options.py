"""The option values (`flwr_admm.options`) and the keywords that take them.

Each value checks itself when built (ValueError naming its field); a strategy given
anything else for one raises a ValueError naming its keyword; the flat keywords the
values replaced are gone (Python's TypeError), and the recipes are partials of FedADMM.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import flwr_admm.server
import flwr_admm.serverapp
from flwr_admm import Checkpointing, ClientPolicy, Convergence, Uplink
from flwr_admm.core.settings import TEXTBOOK
from flwr_admm.server.fedadmm import textbook
from flwr_admm.serverapp.fedadmm import textbook as message_textbook
from flwr_admm.uplink import LocalDP, StochasticQuantizer

APIS = (flwr_admm.server, flwr_admm.serverapp)
STRATEGIES = ("FedADMM", "FedADMMClientDuals", "SCAFFOLD", "FedDyn", "FedNova")


@pytest.mark.parametrize(
    ("build", "field"),
    [
        (lambda: Checkpointing("c", every=0), "every"),
        (lambda: Checkpointing("c", every=1.5), "every"),
        (lambda: Checkpointing("c", every=True), "every"),
        (lambda: Checkpointing("c", resume=1), "resume"),
        (lambda: Checkpointing(3), "directory"),  # type: ignore[arg-type]
        (lambda: ClientPolicy(key_binding="trust"), "key_binding"),
        (lambda: ClientPolicy(key_binding=None), "key_binding"),  # type: ignore[arg-type]
        (lambda: ClientPolicy(max_age=0), "max_age"),
        (lambda: ClientPolicy(max_age=-1), "max_age"),
        (lambda: ClientPolicy(max_age=1.5), "max_age"),  # type: ignore[arg-type]
        (lambda: ClientPolicy(max_age=True), "max_age"),
        (lambda: ClientPolicy(max_age="3"), "max_age"),  # type: ignore[arg-type]
        (lambda: ClientPolicy(max_count=0), "max_count"),
        (lambda: Convergence(eps_abs=-1.0), "eps_abs"),
        (lambda: Convergence(eps_abs=float("nan")), "eps_abs"),
        (lambda: Convergence(eps_rel=True), "eps_rel"),
        (lambda: Convergence(stop=1), "stop"),
        (lambda: Uplink(compressor="sq"), "compressor"),  # type: ignore[arg-type]
        (lambda: Uplink(local_dp=1.0), "local_dp"),  # type: ignore[arg-type]
    ],
)
def test_a_value_refuses_a_bad_field_naming_it(build: Any, field: str) -> None:
    with pytest.raises(ValueError, match=f"^{field}: "):
        build()


def test_values_keep_what_they_were_given() -> None:
    checkpoint = Checkpointing("ckpt", every=3, resume=False)
    assert checkpoint.path == Path("ckpt") and (checkpoint.every, checkpoint.resume) == (3, False)
    policy = ClientPolicy("reported", max_age=4, max_count=9)
    # checkpoints keep their fingerprinted names: a resume of an older run still matches
    assert policy.describe() == {"key_binding": "reported", "max_client_age": 4, "max_clients": 9}
    dp = LocalDP(clip=1.0, noise_multiplier=0.0)
    quantizer = StochasticQuantizer(bits=8)
    uplink = Uplink(quantizer, local_dp=dp)
    assert uplink.compressor is quantizer and uplink.local_dp is dp


def test_uplink_has_no_residual_field() -> None:
    """Error feedback is the one residual rule: ``residual="dual"`` was deleted."""
    with pytest.raises(TypeError, match="keyword argument 'residual'"):
        Uplink(StochasticQuantizer(bits=8), residual="dual")  # type: ignore[call-arg]


BAD_OPTIONS = [("clients", "node"), ("checkpoint", "ckpt"), ("convergence", 1e-6), ("uplink", 0)]
CASES = [
    (name, keyword, value)
    for name in STRATEGIES
    for keyword, value in BAD_OPTIONS
    if name.startswith("FedADMM") or keyword in ("clients", "checkpoint")  # the peers' two
]


@pytest.mark.parametrize("api", APIS, ids=["legacy", "message"])
@pytest.mark.parametrize(("name", "keyword", "value"), CASES)
def test_a_strategy_names_the_keyword_given_something_else(
    api: Any, name: str, keyword: str, value: Any
) -> None:
    kwargs = {"alpha": 0.1} if name == "FedDyn" else {}
    with pytest.raises(ValueError, match=rf"^{keyword}: must be [A-Z][A-Za-z]+\(\.\.\.\), got "):
        getattr(api, name)(**kwargs, **{keyword: value})


@pytest.mark.parametrize("api", APIS, ids=["legacy", "message"])
@pytest.mark.parametrize(
    "keyword",
    [
        "eps_abs",
        "eps_rel",
        "stop_on_convergence",
        "checkpoint_dir",
        "checkpoint_every",
        "resume",
        "key_binding",
        "max_client_age",
        "max_clients",
        "uplink_residual",
        "local_dp",
        "restart_eta",
        "acceleration",
    ],
)
def test_the_flat_keywords_are_gone(api: Any, keyword: str) -> None:
    """A call written for the flat keywords fails at once, naming the keyword."""
    with pytest.raises(TypeError, match=f"keyword argument '{keyword}'"):
        api.FedADMM(**{keyword: None})


@pytest.mark.parametrize(
    ("recipe", "settings", "api"),
    [
        (textbook, TEXTBOOK, flwr_admm.server),
        (message_textbook, TEXTBOOK, flwr_admm.serverapp),
    ],
)
def test_the_recipes_are_fedadmm_with_their_settings(recipe: Any, settings: Any, api: Any) -> None:
    strategy = recipe(sampling_seed=3)
    assert type(strategy) is api.FedADMM and strategy.sampling_seed == 3
    assert strategy.configuration() == api.FedADMM(**settings).configuration()
    assert recipe(rho=0.5).admm_settings.rho == 0.5  # a keyword given overrides the recipe's
