"""FedADMM strategies pinned to the textbook iteration the tests' references compute.

The strategies' defaults (`flwr_admm.core.settings.strategy_defaults`: fast ADMM,
`ResidualBalancing`, alpha = 1.6) are measured, not textbook; a test that checks the
plain iteration against an independent loop asks for it explicitly.
"""

from __future__ import annotations

from typing import Any

from flwr_admm import FedADMM
from flwr_admm.core.schedules import Constant
from flwr_admm.serverapp import FedADMM as MessageFedADMM

TEXTBOOK: dict[str, Any] = {"rho_schedule": Constant(), "relaxation": 1.0, "acceleration": None}


def textbook_fedadmm(**kwargs: Any) -> FedADMM:
    """Return FedADMM(**kwargs) with constant rho, alpha = 1, no acceleration unless given."""
    return FedADMM(**{**TEXTBOOK, **kwargs})


def textbook_message_fedadmm(**kwargs: Any) -> MessageFedADMM:
    """Return the Message-API FedADMM(**kwargs), textbook unless told otherwise."""
    return MessageFedADMM(**{**TEXTBOOK, **kwargs})
