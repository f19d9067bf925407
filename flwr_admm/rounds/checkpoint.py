"""Atomic, pickle-free checkpoints: one ``.npz`` of arrays plus a JSON manifest.

Layout of a checkpoint directory::

    checkpoint.json          manifest: format, round, fingerprint, metadata, the name
                             and SHA-256 of the arrays file it belongs to, and
                             ``manifest_sha256``, the SHA-256 of the rest of the manifest
    state-r<round>.npz       arrays, loaded with ``allow_pickle=False``

Both files are written to a temporary name and renamed into place, the manifest last,
so a crash leaves either the previous or the new checkpoint, never a mix. Any edit of
the manifest (rho, n_i, keys, ...) fails ``manifest_sha256``, a truncated or altered
arrays file fails its SHA-256, and an arrays file without a manifest is refused, not
taken for an empty directory: each raises `CheckpointError`. (The checksums detect
damage and casual edits; they are not a signature against someone who can rewrite
both.)
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

from flwr_admm.core.persistence import DELETED, deleted_message, state_dtype_message

FORMAT = 2  # 2: manifest_sha256, all settings fingerprinted, key bindings
MANIFEST = "checkpoint.json"
ARRAYS_GLOB = "state-r*.npz"
MANIFEST_SHA256 = "manifest_sha256"


class CheckpointError(ValueError):
    """A checkpoint is missing, truncated, or does not fit the current configuration."""


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _manifest_sha256(manifest: dict[str, Any]) -> str:
    """Return the SHA-256 of the canonical JSON of `manifest` without its own checksum."""
    body = {k: v for k, v in manifest.items() if k != MANIFEST_SHA256}
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":"), allow_nan=False)
    return hashlib.sha256(canonical.encode()).hexdigest()


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
    full[MANIFEST_SHA256] = _manifest_sha256(full)
    payload = json.dumps(full, indent=1, sort_keys=True, allow_nan=False).encode()
    _atomic_write(root / MANIFEST, lambda handle: handle.write(payload))
    for old in root.glob(ARRAYS_GLOB):
        if old.name != name:
            old.unlink(missing_ok=True)
    for pattern in (f".{MANIFEST}.*.tmp", f".{ARRAYS_GLOB}.*.tmp"):  # a killed save's
        for stray in root.glob(pattern):
            stray.unlink(missing_ok=True)
    return root / MANIFEST


def has_checkpoint(directory: str | os.PathLike[str]) -> bool:
    """Return True when `directory` holds a manifest or an arrays file (then load it)."""
    root = Path(directory)
    return (root / MANIFEST).is_file() or any(root.glob(ARRAYS_GLOB))


def load_checkpoint(
    directory: str | os.PathLike[str],
) -> tuple[dict[str, NDArray[Any]], dict[str, Any]]:
    """Read and verify a checkpoint; raise `CheckpointError` on any inconsistency."""
    root = Path(directory)
    manifest = _read_manifest(root)
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


def _read_manifest(root: Path) -> dict[str, Any]:
    """Read the manifest of `root`, checking its presence, format and checksum."""
    path = root / MANIFEST
    try:
        manifest = json.loads(path.read_text())
    except FileNotFoundError as error:
        orphans = sorted(p.name for p in root.glob(ARRAYS_GLOB))
        if orphans:
            raise CheckpointError(
                f"checkpoint: {root} holds {orphans} but no {MANIFEST} (deleted or never "
                "written); refusing to start fresh over it: restore the manifest, or move "
                "the directory away to start fresh"
            ) from error
        raise CheckpointError(f"checkpoint: no {MANIFEST} in {root}") from error
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise CheckpointError(f"checkpoint: {path} is not valid JSON ({error})") from error
    if not isinstance(manifest, dict):
        raise CheckpointError(f"checkpoint: {path} is not a manifest (a JSON object)")
    if manifest.get("format") != FORMAT:
        raise CheckpointError(
            f"checkpoint: {path} has format {manifest.get('format')!r}; this version of "
            f"flwr-admm reads format {FORMAT} only (format 1 had no manifest checksum, "
            "fewer fingerprinted settings and no key bindings): resume it with the "
            "version that wrote it, or move it away to start fresh"
        )
    try:
        intact = manifest.get(MANIFEST_SHA256) == _manifest_sha256(manifest)
    except (TypeError, ValueError):  # NaN or non-JSON values: not what we wrote
        intact = False
    if not intact:
        raise CheckpointError(f"checkpoint: {path} was edited or damaged (manifest_sha256)")
    return manifest


def config_fingerprint(config: dict[str, Any]) -> str:
    """SHA-256 of a JSON configuration (sorted keys), the value a checkpoint must match."""
    return hashlib.sha256(json.dumps(config, sort_keys=True).encode()).hexdigest()


def config_differences(saved: Any, current: dict[str, Any]) -> list[str]:
    """Return ``name: checkpoint X, now Y`` for every field where `saved` and `current` differ.

    In the order of `current` (the strategy's own settings first), then the fields
    only `saved` has.
    """
    if not isinstance(saved, dict):
        return []
    names = list(current) + sorted(set(saved) - set(current))
    return [
        f"{name}: checkpoint {saved.get(name)!r}, now {current.get(name)!r}"
        for name in names
        if saved.get(name) != current.get(name)
    ]


def load_matching_checkpoint(
    directory: str | os.PathLike[str], settings: dict[str, Any]
) -> tuple[dict[str, NDArray[Any]], dict[str, Any]]:
    """`load_checkpoint`, refused unless it was written with these `settings`.

    The checkpoint's ``fingerprint`` must equal ``config_fingerprint(settings)``;
    otherwise the `CheckpointError` names every field that differs, or the deleted
    option it was written with. A recorded ``state_dtype`` "float64" or ``acceleration``
    None (the fields of the versions before their deletion) resumes.
    """
    arrays, manifest = load_checkpoint(directory)
    saved = manifest.get("configuration")
    saved = saved if isinstance(saved, dict) else {}
    acceleration = saved.get("acceleration")
    if isinstance(acceleration, str) and acceleration in DELETED:
        raise CheckpointError(deleted_message(acceleration, f"checkpoint: {directory}"))
    if "acceleration" in saved and acceleration is None:  # fingerprinted as it was
        old = {name: saved[name] for name in ("acceleration", "restart_eta") if name in saved}
        settings = {**settings, **old}
    if "state_dtype" in saved:
        if saved["state_dtype"] != "float64":
            where = f"checkpoint: {directory}"
            raise CheckpointError(state_dtype_message(saved["state_dtype"], where))
        settings = {**settings, "state_dtype": "float64"}  # fingerprinted as it was
    if manifest.get("fingerprint") != config_fingerprint(settings):
        differences = config_differences(manifest.get("configuration"), settings)
        detail = "; ".join(differences) or f"its own is not recorded; now {settings}"
        raise CheckpointError(
            f"checkpoint: {directory} was written with another configuration ({detail}); "
            "refusing to resume"
        )
    return arrays, manifest


def strategy_manifest(
    settings: dict[str, Any],
    dtypes: Any,
    binding: dict[str, Any],
    clock: int,
    converged: bool,
    own: dict[str, Any],
) -> dict[str, Any]:
    """Return the manifest fields every consensus strategy writes, then its `own` ones.

    `settings` and their fingerprint, the tensor `dtypes`, the client-key `binding`
    (``KeyBinding.state_dict()``), the round `clock` and the `converged` flag.
    """
    return {
        "fingerprint": config_fingerprint(settings),
        "configuration": settings,
        "dtypes": [str(d) for d in dtypes],
        "binding": binding,
        "clock": clock,
        "converged": converged,
        **own,
    }
