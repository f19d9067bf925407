"""`flwr_admm.rounds.checkpoint`: atomic saves, and what a killed save leaves behind."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from flwr_admm.rounds.checkpoint import load_checkpoint, save_checkpoint


def test_a_save_removes_the_temporary_files_of_a_killed_save(tmp_path: Path) -> None:
    save_checkpoint(tmp_path, {"z_0": np.arange(3.0)}, {"strategy": "test"}, 1)
    # what a SIGKILL between mkstemp and os.replace leaves (the names _atomic_write uses)
    strays = [tmp_path / ".checkpoint.json.k3j2.tmp", tmp_path / ".state-r000002.npz.x9q.tmp"]
    for stray in strays:
        stray.write_bytes(b"partial")
    unrelated = tmp_path / "notes.tmp"
    unrelated.write_text("the user's")
    save_checkpoint(tmp_path, {"z_0": np.arange(3.0) + 1}, {"strategy": "test"}, 2)
    assert not any(stray.exists() for stray in strays)
    assert unrelated.exists()  # only our own temporary names go
    arrays, manifest = load_checkpoint(tmp_path)
    assert manifest["round"] == 2
    np.testing.assert_array_equal(arrays["z_0"], np.arange(3.0) + 1)
