"""Reply folding of `FedADMM`: check each client reply and fold it into the round.

Every reply is keyed by its client key, decoded against the center v_i = z - u_i the
client was sent (uplink compression sends w_i - v_i), checked (count, shapes, dtype,
n_i > 0, finite entries) and absorbed into the open `ConsensusADMM` round one at a
time, in natural key order, so that sums are deterministic and the server holds at
most one reply besides its state. Rejected replies are logged and counted
(``num_rejected``); replies that share a key are all rejected; a known client that
trained around another client's center (new node id) is resynced, not folded in.
"""

from __future__ import annotations

import math
from collections import Counter
from functools import partial
from logging import INFO
from typing import Any

import numpy as np
from flwr.common import FitRes, NDArrays, Scalar
from flwr.common.logger import log
from flwr.server.client_proxy import ClientProxy

from flwr_admm.core.consensus import ConsensusADMM
from flwr_admm.core.types import NON_FINITE, NonFiniteReplyError, Reply, natural_key
from flwr_admm.core.validation import check_reply
from flwr_admm.server.sampling import client_key, keyed_replies, reject_reply
from flwr_admm.uplink.channel import UplinkChannel


class ReplyFolding:
    """Reply checks and folding of `FedADMM` (mixed into it)."""

    admm: ConsensusADMM | None
    channel: UplinkChannel
    _dtypes: list[np.dtype[Any]]
    _key_of_cid: dict[str, str]
    _sent_key: dict[str, str | None]

    def _sent(self, cid: str) -> NDArrays:
        """The center client `cid` was sent this round, as it received it.

        (z, the duals and the dtypes do not change between configure_fit and
        aggregate_fit, so the center can be recomputed instead of stored.)
        """
        assert self.admm is not None
        center = self.admm.center(self._sent_key.get(cid))
        return [
            np.asarray(np.asarray(c, dtype=d), dtype=np.float64)
            for c, d in zip(center, self._dtypes, strict=True)
        ]

    def _client_key(self, proxy: ClientProxy, metrics: dict[str, Scalar]) -> str:
        return client_key(proxy, metrics)

    def _fold_replies(
        self,
        results: list[tuple[ClientProxy, FitRes]],
        admm: ConsensusADMM,
        counts: dict[str, Scalar],
    ) -> int:
        """Check each reply and fold it into the open ADMM round, one at a time.

        Only one reply is deserialized at any moment (besides the state), so the
        server's peak memory stays near the cached state. Returns the number folded in.
        """
        shapes = [t.shape for t in admm.z]
        keyed = keyed_replies(
            results, self._client_key, lambda key, why: self._reject(key, why, counts)
        )
        decoded: dict[int, tuple[NDArrays, float | None]] = {}
        dropped: set[int] = set()
        # Replies sharing a key: only those that pass the checks count as duplicates.
        for key, count in Counter(key for key, _, _ in keyed).items():
            if count == 1:
                continue
            valid = []
            for index, (other, proxy, res) in enumerate(keyed):
                if other == key:
                    checked = self._checked(key, proxy, res, shapes, counts, finite=True)
                    if checked is None:
                        dropped.add(index)
                    else:
                        decoded[index] = checked
                        valid.append(index)
            if len(valid) > 1:
                for index in valid:
                    self._reject(key, f"{len(valid)} replies share this client key", counts)
                    decoded.pop(index)
                    dropped.add(index)
        order = sorted(
            (i for i in range(len(keyed)) if i not in dropped),
            key=lambda i: natural_key(keyed[i][0]),
        )
        admm.begin([keyed[i][0] for i in order])
        folded = 0
        for index in order:
            key, proxy, res = keyed[index]
            checked = decoded.pop(index, None) or self._checked(key, proxy, res, shapes, counts)
            if checked is None:
                continue
            self._key_of_cid[proxy.cid] = key
            if admm.rho > 0 and key in admm.records and self._sent_key.get(proxy.cid) != key:
                # It trained around a center that was not its own (new node id after
                # a restart): keep its dual and cached share, send the right center next.
                log(INFO, "FedADMM: %s re-identified under cid %s; resynced", key, proxy.cid)
                counts["num_resynced"] = int(counts["num_resynced"]) + 1
                continue
            loss = res.metrics.get("loss")
            finite = isinstance(loss, int | float) and math.isfinite(loss)
            objective = float(loss) if finite and isinstance(loss, int | float) else None
            arrays, sq_norm = checked
            try:
                admm.absorb(Reply(key, arrays, int(res.num_examples), objective, sq_norm))
            except NonFiniteReplyError:  # found while folding it in; state rolled back
                self._reject(key, NON_FINITE, counts)
                continue
            folded += 1
        return folded

    def _checked(
        self,
        key: str,
        proxy: ClientProxy,
        res: FitRes,
        shapes: list[tuple[int, ...]],
        counts: dict[str, Scalar],
        finite: bool = False,
    ) -> tuple[NDArrays, float | None] | None:
        """Decoded arrays (and ||w||^2 if `finite`) of a usable reply; None if rejected.

        Without `finite`, NaN/inf entries are left to `ConsensusADMM.absorb`, which
        finds them in the pass that folds the reply in.
        """
        try:
            arrays = self.channel.decode(res.parameters, partial(self._sent, proxy.cid))
            problem, sq_norm = check_reply(arrays, res.num_examples, shapes, finite=finite)
        except Exception as error:  # a malformed reply must not stop the server
            problem, sq_norm = f"unreadable reply ({error!r})", None
        if problem is not None:
            self._reject(key, problem, counts)
            return None
        return arrays, sq_norm

    @staticmethod
    def _reject(key: str, problem: str, counts: dict[str, Scalar]) -> None:
        reject_reply("FedADMM", key, problem, counts)
