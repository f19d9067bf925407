"""FedADMM strategies pinned to the textbook iteration the tests' references compute.

The strategies' defaults (`flwr_admm.core.settings`: `ResidualBalancing` from rho0 =
0.1, a damped dual step) are measured, not textbook; a test that checks the plain
iteration against an independent loop asks for it (`TEXTBOOK`) explicitly.
"""

from __future__ import annotations

from typing import Any

from flwr_admm.core.settings import TEXTBOOK
from flwr_admm.server import FedADMM
from flwr_admm.serverapp import FedADMM as MessageFedADMM


def textbook_fedadmm(**kwargs: Any) -> FedADMM:
    """Return FedADMM(**kwargs): the textbook iteration (`TEXTBOOK`) unless told otherwise."""
    return FedADMM(**{**TEXTBOOK, **kwargs})


def textbook_message_fedadmm(**kwargs: Any) -> MessageFedADMM:
    """Return the Message-API FedADMM(**kwargs), textbook unless told otherwise."""
    return MessageFedADMM(**{**TEXTBOOK, **kwargs})
