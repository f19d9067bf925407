"""flwr_admm.rounds.views: a strategy's own save_checkpoint / load_checkpoint."""

from __future__ import annotations

import numpy as np
from flower_run import NUM_CLIENTS, admm_client_fn, zeros_parameters

from flwr_admm.server import FedADMM
from flwr_admm.testing import make_proxies, run_rounds


def test_load_checkpoint_restores_what_save_checkpoint_wrote(tmp_path) -> None:
    client_fn = admm_client_fn(local_steps=5, learning_rate=1.0)
    saved = FedADMM(rho=0.1, initial_parameters=zeros_parameters())
    run_rounds(saved, make_proxies(client_fn, NUM_CLIENTS), 3)
    saved.save_checkpoint(tmp_path / "ckpt")
    restored = FedADMM(rho=0.1, initial_parameters=zeros_parameters())
    assert restored.load_checkpoint(tmp_path / "ckpt") == 3 == saved.last_round
    assert saved.admm is not None and restored.admm is not None
    for a, b in zip(restored.admm.z, saved.admm.z, strict=True):
        np.testing.assert_array_equal(a, b)
    assert restored.admm.records.keys() == saved.admm.records.keys()
    for key, record in saved.admm.records.items():
        for a, b in zip(restored.admm.records[key].y, record.y, strict=True):
            np.testing.assert_array_equal(a, b)
    assert restored.binding.key_of == saved.binding.key_of
