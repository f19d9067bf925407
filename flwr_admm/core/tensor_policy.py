"""Which tensors of a model are consensus variables (numpy only).

A model's tensors each get a role:

- ``"consensus"``: an ADMM variable: z, a dual per client, the center v_i = z - u_i;
- ``"average"``: FedAvg: z_t = sum_i n_i x_i / sum_i n_i over the round's accepted
  replies, no dual, every node is sent z_t (BatchNorm running statistics: they are
  not optimized, so a dual on them would only accumulate their spread);
- ``"keep"``: the server's value never changes; replies are ignored (integer
  buffers such as BatchNorm's 0-d ``num_batches_tracked``).

Rules map fnmatch patterns over tensor names to roles; the first matching rule (in
the mapping's order) wins, then the defaults: integer or boolean dtype -> ``"keep"``,
a name ending in ``running_mean`` or ``running_var`` -> ``"average"``, anything else
-> ``"consensus"``. `TensorSplit` holds the non-consensus tensors of z beside the
core's `ConsensusADMM`, which sees the consensus tensors only.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from numpy.typing import NDArray

from flwr_admm.core.types import NON_FINITE, Arrays

ROLES = ("consensus", "average", "keep")
VARIANCE = "*running_var"  # an averaged variance must stay >= 0 (BatchNorm divides by it)
DEFAULT_RULES = (("*running_mean", "average"), (VARIANCE, "average"))
Rules = tuple[tuple[str, str], ...]

__all__ = [
    "DEFAULT_RULES",
    "ROLES",
    "VARIANCE",
    "Rules",
    "TensorSplit",
    "check_rules",
    "nonnegative_of",
    "roles_of",
]


def check_rules(policy: Mapping[str, str] | None, field: str = "tensor_policy") -> Rules:
    """Return the rules of `policy` as (pattern, role) pairs; ValueError naming a bad one."""
    if policy is None:
        return ()
    if not isinstance(policy, Mapping):
        raise ValueError(f"{field}: must be a mapping of name patterns to roles, got {policy!r}")
    rules = []
    for pattern, role in policy.items():
        if not isinstance(pattern, str) or not pattern:
            raise ValueError(f"{field}: patterns must be non-empty strings, got {pattern!r}")
        if role not in ROLES:
            raise ValueError(f"{field}[{pattern!r}]: must be one of {list(ROLES)}, got {role!r}")
        rules.append((pattern, str(role)))
    return tuple(rules)


def roles_of(
    rules: Rules, names: Sequence[str], dtypes: Sequence[np.dtype[Any]]
) -> tuple[str, ...]:
    """Return each tensor's role: the first rule matching its name, else the defaults."""
    roles = []
    for name, dtype in zip(names, dtypes, strict=True):
        role = next((r for pattern, r in rules if fnmatch.fnmatchcase(name, pattern)), None)
        if role is None and np.dtype(dtype).kind in "biu":
            role = "keep"
        if role is None:
            role = next((r for p, r in DEFAULT_RULES if fnmatch.fnmatchcase(name, p)), "consensus")
        roles.append(role)
    return tuple(roles)


class TensorSplit:
    """The non-consensus tensors of z, and how to split and merge full tensor lists.

    ``consensus(arrays)`` picks the consensus tensors (what `ConsensusADMM` holds),
    ``merge(consensus)`` puts the held ones back in place. With every tensor a
    consensus variable (`trivial`) both return their argument itself.
    """

    def __init__(
        self, roles: Sequence[str], z: Sequence[NDArray[Any]], nonnegative: Sequence[int] = ()
    ) -> None:
        if len(roles) != len(z):
            raise ValueError(f"roles: expected {len(z)}, got {len(roles)}")
        self.roles = tuple(roles)
        # averaged tensors that are variances (`nonnegative_of`): a reply below 0 is refused
        self.nonnegative = tuple(int(i) for i in nonnegative if self.roles[i] == "average")
        self.shapes = [np.shape(t) for t in z]
        self.index = [i for i, r in enumerate(self.roles) if r == "consensus"]
        self.held = {
            i: np.array(z[i], dtype=np.float64)
            for i, r in enumerate(self.roles)
            if r != "consensus"
        }
        self._sum: dict[int, NDArray[np.float64]] = {}
        self._weight = 0.0

    @property
    def trivial(self) -> bool:
        """Return True when every tensor is a consensus variable."""
        return not self.held

    def consensus(self, arrays: Sequence[NDArray[Any]]) -> list[NDArray[Any]]:
        """Return the consensus tensors of a full list, in order."""
        return list(arrays) if self.trivial else [arrays[i] for i in self.index]

    def merge(self, consensus: Arrays) -> Arrays:
        """Return the full list: `consensus` in place, the held tensors around it."""
        if self.trivial:
            return consensus
        full = [self.held[i] if i in self.held else consensus[0] for i in range(len(self.roles))]
        for i, t in zip(self.index, consensus, strict=True):
            full[i] = t
        return full

    def adopt(self, z: Sequence[NDArray[Any]]) -> None:
        """Take the held tensors from a broadcast z (first round, a resume)."""
        for i in self.held:
            self.held[i] = np.array(z[i], dtype=np.float64)

    def problem(self, arrays: Sequence[NDArray[Any]]) -> str | None:
        """Why the reply's averaged tensors are unusable (NaN or inf, a negative variance)."""
        for i, role in enumerate(self.roles):
            if role == "average" and not bool(np.all(np.isfinite(arrays[i]))):
                return NON_FINITE
        for i in self.nonnegative:
            if bool(np.any(np.asarray(arrays[i]) < 0)):
                return f"tensor {i} is a running variance and has entries below 0"
        return None

    def begin(self) -> None:
        """Open a round: no averaged reply yet."""
        self._sum, self._weight = {}, 0.0

    def absorb(self, arrays: Sequence[NDArray[Any]], num_examples: int) -> None:
        """Add n_i x_i of each averaged tensor (call in the round's fixed reply order)."""
        for i, role in enumerate(self.roles):
            if role == "average":
                term = float(num_examples) * np.asarray(arrays[i], dtype=np.float64)
                self._sum[i] = term if i not in self._sum else self._sum[i] + term
        self._weight += float(num_examples)

    def finish(self) -> None:
        """Set each averaged tensor to sum_i n_i x_i / sum_i n_i (unchanged without replies)."""
        if self._weight > 0:
            for i, total in self._sum.items():
                self.held[i] = total / self._weight
        self.begin()

    def describe(self, names: Sequence[str]) -> dict[str, str]:
        """Return {name: role} of the non-consensus tensors (for logs and checkpoints)."""
        return {names[i]: self.roles[i] for i in self.held}


def nonnegative_of(names: Sequence[str]) -> tuple[int, ...]:
    """Return the indices of the tensors named as variances (``*running_var``)."""
    return tuple(i for i, name in enumerate(names) if fnmatch.fnmatchcase(name, VARIANCE))
