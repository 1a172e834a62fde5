"""Checkpoints for exact resume: everything that determines the future of a run, in one file.

What is saved (and why it is enough): the server state (params + buffers), the client store, the
round number, the orchestrator's running totals and last evaluation, the state of the attack,
executor and callbacks (their optional `state_dict`), the loggers' run ids, and the global RNG
streams. Client sampling and every client's randomness are derived from (seed, round, client) in
`fedexp.core.seeding`, so there is no sampler position to save; the global torch/numpy/python RNG
streams are saved anyway because nothing stops a component (a server-side noise draw, a library
call) from using them between the executor's per-client reseeds. Client optimizers are built
afresh for every phase of every client, so they hold no state across rounds; a client whose
optimizer state persists keeps it in the client store, which is saved.

Files hold only tensors, numbers, strings, None, lists and dicts, so they load with
`torch.load(weights_only=True)`; they are written to a temp file and renamed into place, so a kill
at any moment leaves either the previous checkpoint or the new one, never half of one.

This module writes, reads and checks the file (and the RNG streams in it); `fedexp.core.signals`
stops a run on SIGINT/SIGTERM; `fedexp.core.resume` is the checkpointing callback, the restore,
and the config of a run dir to resume.
"""

from __future__ import annotations

import os
import random
from pathlib import Path
from typing import Any

import numpy as np
import torch

from fedexp.core.fingerprint import (  # noqa: F401 - config_hash is part of this API
    ConfigDigest,
    config_hash,
    data_digest,
    first_difference,
)
from fedexp.core.types import ConfigError

CHECKPOINT_FILE = "checkpoint.pt"
FORMAT_VERSION = 2  # 2: the config hash is of the resolved config, and the data digest is saved
SAVEABLE_SCALARS = (bool, int, float, str, type(None))


def check_saveable(obj: Any, where: str = "checkpoint") -> None:
    """Raise TypeError naming the first value that `torch.load(weights_only=True)` would refuse.

    Components keep their state as tensors, numbers, strings, lists/tuples and dicts of those
    (the convention of ServerState.buffers and the ClientStore); anything else is a bug there.
    """
    if isinstance(obj, (torch.Tensor, *SAVEABLE_SCALARS)):
        return
    if isinstance(obj, list | tuple):
        for i, item in enumerate(obj):
            check_saveable(item, f"{where}[{i}]")
    elif isinstance(obj, dict):
        for key, item in obj.items():
            if not isinstance(key, int | str):
                raise TypeError(f"{where}: dict key {key!r} is not an int or str")
            check_saveable(item, f"{where}[{key!r}]")
    else:
        raise TypeError(
            f"{where}: {type(obj).__name__} cannot go into a checkpoint; keep state as "
            "tensors, numbers, strings, lists and dicts"
        )


def save_checkpoint(path: str | Path, payload: dict) -> None:
    """Write `payload` atomically: temp file in the same directory, fsync, rename."""
    path = Path(path)
    check_saveable(payload)
    tmp = path.with_name(path.name + ".tmp")
    with tmp.open("wb") as f:
        torch.save(payload, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def load_checkpoint(
    path: str | Path, expected_hash: str | None = None, map_location: Any = "cpu"
) -> dict:
    """Load and check a checkpoint; any problem is a one-line ConfigError."""
    path = Path(path)
    if not path.exists():
        raise ConfigError(f"resume: no checkpoint at {path}")
    try:
        payload = torch.load(path, map_location=map_location, weights_only=True)
    except Exception as err:
        first = str(err).strip().splitlines()[0] if str(err).strip() else ""
        raise ConfigError(
            f"resume: {path} is not a readable checkpoint ({type(err).__name__}: {first[:120]})"
        ) from None
    version = payload.get("format") if isinstance(payload, dict) else None
    if version == 1:
        raise ConfigError(
            f"resume: {path} was written by an older fedexp (checkpoint format 1), which did not "
            "record the data it trained on; start the run again"
        )
    if version != FORMAT_VERSION:
        raise ConfigError(f"resume: {path} is not a fedexp checkpoint of format {FORMAT_VERSION}")
    if expected_hash is not None and payload.get("config_hash") != expected_hash:
        diff = None
        if isinstance(expected_hash, ConfigDigest):
            diff = first_difference(expected_hash.stable, payload.get("resolved_config"))
        detail = f": {diff}" if diff else ""
        raise ConfigError(
            f"resume: {path} was written for a different config than the run dir's "
            f".hydra/config.yaml resolves to now (config hash mismatch{detail})"
        )
    return payload


def check_resumed_data(payload: dict | None, data: Any) -> None:
    """Refuse (one line) to resume a checkpoint on data other than the data it was trained on;
    no-op without a checkpoint. `data` is the built FederatedData."""
    if payload is not None and payload.get("data_digest") != data_digest(data):
        raise ConfigError(
            "resume: the data differs from the data the checkpoint was trained on (training "
            "labels, inputs or client partition); resume with the same data"
        )


# ---- RNG streams ------------------------------------------------------------------------------
def rng_state() -> dict:
    """The global RNG streams (torch CPU and CUDA, numpy's legacy global, python's random)."""
    kind, keys, pos, has_gauss, gauss = np.random.get_state()
    version, internal, gauss_next = random.getstate()
    state = {
        "torch": torch.get_rng_state(),
        "numpy": [kind, torch.from_numpy(keys.astype(np.int64)), pos, has_gauss, gauss],
        "python": [version, list(internal), gauss_next],
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    torch.set_rng_state(state["torch"].cpu())
    kind, keys, pos, has_gauss, gauss = state["numpy"]
    np.random.set_state((kind, keys.cpu().numpy().astype(np.uint32), pos, has_gauss, gauss))
    version, internal, gauss_next = state["python"]
    random.setstate((version, tuple(internal), gauss_next))
    cuda = state.get("cuda")
    if cuda is not None and torch.cuda.is_available() and len(cuda) == torch.cuda.device_count():
        torch.cuda.set_rng_state_all([s.cpu() for s in cuda])
