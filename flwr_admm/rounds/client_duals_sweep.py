"""The rebuild sweep of `FedADMMClientDuals`: take stale shares out of S exactly.

S = sum_i sigma_i + (stale shares), where sigma_i = n_i c_i - e_i is the current share
of a key the server holds. A share goes stale when its client lost its state and
resynchronized (it sent a new full contribution, but the old one is still in S), or
when its key was evicted. The server cannot subtract it: it never had it. But S
without the stale shares is the sum of the current shares of the keys it holds, so
the sweep collects those:

    S_new = sum_{i in R} sigma_i            R: the keys rebuilt so far

A key enters R with a full share: the first contribution of a new or resyncing key,
or sigma_j' sent on request (``admm-rebuild = 1``) next to its usual change Delta_j.
After that its changes go into S_new as well as S. Once R holds every key the server
holds, S := S_new and the stale shares are gone. Meanwhile they keep their weight
N_stale in the z-step, as absent clients do: z = prox_{g/rho}(S / (N + N_stale)).

A stale share inside S_new (a rebuilt key resyncs again, or is evicted) restarts the
sweep: S_new = sum_{i in K} sigma_i, R = K.

Known shares K. A resync's full contribution F_i is all of the key's new share, and
the server sees it (not under SecAgg+, which shows only sums): it keeps sigma_i = F_i,
plus the key's later Delta_i while a sweep is on or after its client trained from the
offered share, so sigma_i stays exact (any other Delta_i forgets it). A key in K is in
R whenever a sweep is on. Its next resync, or its eviction, takes its share out exactly:

    S -= sigma_i,  S_new -= sigma_i,  N_stale unchanged         (`take_out`)

so a client that loses its state every round, or forges resync claims, adds its n to
N_stale at most once per sweep. A key in K is also offered its share back
(`flwr_admm.core.client_duals.restored_state`), so a client that loses its state again
trains from it instead of from scratch.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
from numpy.typing import NDArray

from flwr_admm.core.kernels import axpy
from flwr_admm.core.types import Arrays

__all__ = ["RebuildSweep"]


class RebuildSweep:
    """S_new, the rebuilt keys R, the stale weight N_stale (one sweep or none) and K."""

    def __init__(self) -> None:
        self.new_sum: Arrays | None = None  # S_new; None: no sweep
        self.rebuilt: set[str] = set()  # R
        self.stale_examples = 0.0  # N_stale: the omega of the stale shares still in S
        self.known: dict[str, Arrays] = {}  # K: key -> sigma_i, its exact share in S

    @property
    def active(self) -> bool:
        """Return whether S still holds a stale share."""
        return self.new_sum is not None

    def wants_share(self, key: str) -> bool:
        """Return whether `key` must send its full share sigma' (``admm-rebuild``)."""
        return self.new_sum is not None and key not in self.rebuilt

    def drop(self, key: str, weight: float, like: Arrays) -> None:
        """Mark the share of `key` in S stale; start the sweep, or restart it.

        (Re)start with S_new = sum_{i in K} sigma_i, R = K; restart when that share is
        inside S_new (`key` in R).
        """
        if self.new_sum is None or key in self.rebuilt:
            self.new_sum = [np.zeros_like(t) for t in like]
            for share in self.known.values():
                _add(self.new_sum, share)
            self.rebuilt = set(self.known)
        self.stale_examples += weight

    def take_out(self, key: str, total: Arrays) -> bool:
        """S -= sigma_key (and S_new -= sigma_key) if `key` is in K; return whether it was.

        `key` leaves K and R: its next full contribution (`fold`) re-enters both.
        """
        share = self.known.pop(key, None)
        if share is None:
            return False
        _subtract(total, share)
        if self.new_sum is not None:
            _subtract(self.new_sum, share)
            self.rebuilt.discard(key)
        return True

    def fold(
        self,
        key: str,
        total: Arrays,
        change: Sequence[NDArray[np.generic]],
        share: Sequence[NDArray[np.generic]] | None,
        *,
        full: bool,
        resync: bool = False,
        restored: bool = False,
    ) -> None:
        """Add a reply's Delta_j to S (`total`), and what the sweep needs to S_new.

        A full contribution (new or resyncing key) is all of its share: S_new += it,
        j joins R. Otherwise S_new += Delta_j if j is in R, else S_new += sigma_j'
        (j joins R) when the reply sent it. A resync's share joins K; a key in K
        adds Delta_j to its sigma_j during a sweep, or when its client trained from
        the offered share (`restored`: it may lose its state again), and leaves K
        otherwise.
        """
        _add(total, change)
        if resync:
            self.known[key] = [np.array(t, dtype=np.float64) for t in change]
        elif key in self.known and (self.new_sum is not None or restored):
            _add(self.known[key], change)
        else:
            self.known.pop(key, None)
        if self.new_sum is None:
            return
        if full or key in self.rebuilt:
            _add(self.new_sum, change)
            self.rebuilt.add(key)
        elif share is not None:
            _add(self.new_sum, share)
            self.rebuilt.add(key)

    def fold_sum(
        self,
        keys: Iterable[str],
        total: Arrays,
        change_sum: Arrays,
        new_block: Arrays | None,
    ) -> None:
        """Add a round's summed changes to S; under SecAgg+ also its S_new block.

        The S_new block sums, over the round's `keys`, sigma_j' (asked to rebuild) or
        Delta_j (already rebuilt, or new): after it every key of the round is in R.
        Without the block (the sweep began this round) nobody joins R.
        """
        _add(total, change_sum)
        if self.new_sum is not None and new_block is not None:
            _add(self.new_sum, new_block)
            self.rebuilt.update(keys)

    def finish(self, held: Iterable[str]) -> Arrays | None:
        """Return S_new and end the sweep once every held key is in R; else None."""
        if self.new_sum is None or not set(held) <= self.rebuilt:
            return None
        new_sum = self.new_sum
        self._reset()
        return new_sum

    def _reset(self) -> None:
        self.new_sum, self.rebuilt, self.stale_examples = None, set(), 0.0

    # ------------------------------------------------------------- checkpoints
    def state_dict(self) -> tuple[dict[str, NDArray[Any]], dict[str, Any]]:
        """Return S_new (``s_new_<i>``), K's shares (``known_<j>_<i>``), R, N_stale, K's keys."""
        arrays = {f"s_new_{i}": t for i, t in enumerate(self.new_sum or [])}
        for j, share in enumerate(self.known.values()):
            arrays.update({f"known_{j}_{i}": t for i, t in enumerate(share)})
        manifest: dict[str, Any] = {
            "rebuilding": self.active,
            "rebuilt": sorted(self.rebuilt),
            "stale_examples": float(self.stale_examples),
        }
        if self.known:  # absent (no known share) in checkpoints of a run without resyncs
            manifest["known"] = list(self.known)
        return arrays, manifest

    def load_state_dict(
        self, arrays: dict[str, NDArray[Any]], manifest: dict[str, Any], like: Arrays
    ) -> None:
        """Restore a sweep and K from `state_dict` output (no entries: none)."""
        self._reset()
        shapes = [t.shape for t in like]
        known = {
            str(key): [
                np.asarray(arrays[f"known_{j}_{i}"], dtype=np.float64) for i in range(len(like))
            ]
            for j, key in enumerate(manifest.get("known", []))
        }
        if any([t.shape for t in share] != shapes for share in known.values()):
            raise ValueError("a known share and S disagree")
        self.known = known
        if not manifest.get("rebuilding", False):
            return
        new_sum = [np.asarray(arrays[f"s_new_{i}"], dtype=np.float64) for i in range(len(like))]
        if [t.shape for t in new_sum] != shapes:
            raise ValueError("S_new and S disagree")
        self.new_sum = new_sum
        self.rebuilt = {str(k) for k in manifest["rebuilt"]}
        self.stale_examples = float(manifest["stale_examples"])


def _add(total: Arrays, arrays: Sequence[NDArray[np.generic]]) -> None:
    """Set total += arrays in place (float64, one pass)."""
    for acc, array in zip(total, arrays, strict=True):
        axpy(1.0, np.asarray(array, dtype=np.float64), acc)


def _subtract(total: Arrays, arrays: Arrays) -> None:
    """Set total -= arrays in place (float64, one pass)."""
    for acc, array in zip(total, arrays, strict=True):
        axpy(-1.0, array, acc)
