"""What clients send up: compression, local DP, the uplink channel, wire views.

`StochasticQuantizer` and `TopK` compress w_i - v_i with error feedback; `LocalDP`
clips and noises it and `PrivacyLedger` accounts for it; `UplinkChannel` is the
server's decoder; `UplinkWrapper` adds both to any legacy strategy.
"""

from flwr_admm.uplink.compression import StochasticQuantizer, TopK
from flwr_admm.uplink.privacy import LocalDP, PrivacyLedger
from flwr_admm.uplink.wrapper import UplinkWrapper

__all__ = [
    "LocalDP",
    "PrivacyLedger",
    "StochasticQuantizer",
    "TopK",
    "UplinkWrapper",
]
