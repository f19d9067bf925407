"""Atomic, pickle-free checkpoints: one ``.npz`` of arrays plus a JSON manifest.

Layout of a checkpoint directory::

    checkpoint.json          manifest: format, round, fingerprint, metadata, and the
                             name and SHA-256 of the arrays file it belongs to
    state-r<round>.npz       arrays, loaded with ``allow_pickle=False``

Both files are written to a temporary name and renamed into place, the manifest last,
so a crash leaves either the previous or the new checkpoint, never a mix. A truncated
or altered arrays file fails its checksum and raises `CheckpointError`.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

FORMAT = 1
MANIFEST = "checkpoint.json"


class CheckpointError(ValueError):
    """A checkpoint is missing, truncated, or does not fit the current configuration."""


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _atomic_write(path: Path, write: Any) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as handle:
            write(handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def save_checkpoint(
    directory: str | os.PathLike[str],
    arrays: dict[str, NDArray[Any]],
    manifest: dict[str, Any],
    server_round: int,
) -> Path:
    """Write `arrays` and `manifest` atomically into `directory`; return the manifest path."""
    root = Path(directory)
    root.mkdir(parents=True, exist_ok=True)
    name = f"state-r{server_round:06d}.npz"
    _atomic_write(root / name, lambda handle: np.savez(handle, **arrays))  # type: ignore[arg-type]
    full = {
        "format": FORMAT,
        "round": int(server_round),
        "arrays_file": name,
        "sha256": _sha256(root / name),
        **manifest,
    }
    payload = json.dumps(full, indent=1, sort_keys=True, allow_nan=False).encode()
    _atomic_write(root / MANIFEST, lambda handle: handle.write(payload))
    for old in root.glob("state-r*.npz"):
        if old.name != name:
            old.unlink(missing_ok=True)
    return root / MANIFEST


def has_checkpoint(directory: str | os.PathLike[str]) -> bool:
    """True when `directory` holds a manifest."""
    return (Path(directory) / MANIFEST).is_file()


def load_checkpoint(
    directory: str | os.PathLike[str],
) -> tuple[dict[str, NDArray[Any]], dict[str, Any]]:
    """Read and verify a checkpoint; raise `CheckpointError` on any inconsistency."""
    root = Path(directory)
    manifest_path = root / MANIFEST
    try:
        manifest = json.loads(manifest_path.read_text())
    except FileNotFoundError as error:
        raise CheckpointError(f"checkpoint: no {MANIFEST} in {root}") from error
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise CheckpointError(f"checkpoint: {manifest_path} is not valid JSON ({error})") from error
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise CheckpointError(f"checkpoint: {manifest_path} has unknown format (want {FORMAT})")
    arrays_path = root / str(manifest.get("arrays_file", ""))
    if not arrays_path.is_file():
        raise CheckpointError(f"checkpoint: arrays file {arrays_path} is missing")
    if _sha256(arrays_path) != manifest.get("sha256"):
        raise CheckpointError(f"checkpoint: {arrays_path} is truncated or altered (checksum)")
    try:
        with np.load(arrays_path, allow_pickle=False) as npz:
            arrays = {key: npz[key] for key in npz.files}
    except (OSError, ValueError) as error:
        raise CheckpointError(f"checkpoint: cannot read {arrays_path} ({error})") from error
    return arrays, manifest


def config_fingerprint(config: dict[str, Any]) -> str:
    """SHA-256 of a JSON configuration (sorted keys), the value a checkpoint must match."""
    return hashlib.sha256(json.dumps(config, sort_keys=True).encode()).hexdigest()


def config_differences(saved: Any, current: dict[str, Any]) -> list[str]:
    """``name: checkpoint X, now Y`` for every field where `saved` and `current` differ."""
    if not isinstance(saved, dict):
        return []
    return [
        f"{name}: checkpoint {saved.get(name)!r}, now {current.get(name)!r}"
        for name in sorted(set(saved) | set(current))
        if saved.get(name) != current.get(name)
    ]


def checkpoint_every_value(value: Any) -> int:
    """`value` as the number of aggregations between checkpoints (an integer >= 1)."""
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float | np.integer)
        or int(value) != value
        or value < 1
    ):
        raise ValueError(f"checkpoint_every: must be an integer >= 1, got {value!r}")
    return int(value)
