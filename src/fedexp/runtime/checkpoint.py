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
at any moment leaves either the previous checkpoint or the new one, never half of one. Each holds
a sha256 of its content (`content_checksum`: every tensor's bytes, every number and key), checked
on load, so a file changed on disk after it was written (a few flipped bits in a weight) is
refused, not resumed; and its sections are checked (`check_sections`) before a resume touches any
file of the run.

This module writes, reads and checks the file (and the RNG streams in it); `fedexp.runtime.signals`
stops a run on SIGINT/SIGTERM; `fedexp.runtime.resume` is the checkpointing callback, the restore,
and the config of a run dir to resume.
"""

from __future__ import annotations

import hashlib
import os
import random
from pathlib import Path
from typing import Any

import numpy as np
import torch

from fedexp.core.types import ConfigError
from fedexp.runtime.fingerprint import (  # noqa: F401 - config_hash is part of this API
    ConfigDigest,
    config_hash,
    data_digest,
    first_difference,
)

CHECKPOINT_FILE = "checkpoint.pt"
FORMAT_VERSION = 3  # 2: the resolved config's hash and the data digest; 3: a content checksum
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
    check_saveable(payload)
    save_atomic(path, {**payload, "checksum": content_checksum(payload)})


class _WriteErrors:
    """A file for `torch.save` that keeps the OSError its writes raised: torch's zip writer
    swallows it and fails later with a RuntimeError of its own (`[enforce fail at
    inline_container.cc:...] . unexpected pos ...`) that names neither the file nor the cause."""

    def __init__(self, f):
        self.f = f
        self.error: OSError | None = None

    def write(self, data) -> int:
        try:
            return self.f.write(data)
        except OSError as err:
            self.error = self.error or err
            raise

    def flush(self) -> None:
        self.f.flush()


def save_atomic(path: str | Path, obj: Any) -> None:
    """`torch.save(obj)` to a temp file in the same directory, fsync, rename: a kill at any
    moment leaves the previous file or the new one, and a failed write removes its temp file.

    A write the file system refuses (a full disk) raises its OSError, naming the temp file,
    also where torch reports it as a RuntimeError of its zip writer; any other error of
    torch's is raised as it is."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    try:
        with tmp.open("wb") as f:
            writes = _WriteErrors(f)
            try:
                torch.save(obj, writes)
            except RuntimeError as err:
                if writes.error is None:
                    raise  # not the file system's: a bug keeps its traceback
                raise writes.error from err
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as err:  # a full disk, a second stop signal: the previous one stays
        tmp.unlink(missing_ok=True)
        if isinstance(err, OSError) and err.filename is None:
            err.filename = str(tmp)  # a failed write names no file by itself
        raise


def content_checksum(payload: dict) -> str:
    """sha256 of a checkpoint's content (its `checksum` key left out): the dtype, shape and bytes
    of every tensor, every number, string and key, in a fixed order; the same for a payload
    and for that payload saved and loaded again, on any device."""
    h = hashlib.sha256()

    def feed(obj: Any) -> None:
        if isinstance(obj, torch.Tensor):
            flat = obj.detach().cpu().contiguous().reshape(-1)
            h.update(f"T{flat.dtype}{tuple(obj.shape)};".encode())
            h.update(flat.view(torch.uint8).numpy().tobytes())
        elif isinstance(obj, dict):
            h.update(f"D{len(obj)};".encode())
            for key in sorted(obj, key=lambda k: (type(k).__name__, str(k))):
                h.update(f"{key!r}:".encode())
                feed(obj[key])
        elif isinstance(obj, list | tuple):
            h.update(f"L{len(obj)};".encode())
            for item in obj:
                feed(item)
        else:
            h.update(f"{type(obj).__name__}:{obj!r};".encode())

    feed({k: v for k, v in payload.items() if k != "checksum"})
    return h.hexdigest()


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
    if isinstance(version, int) and 0 < version < FORMAT_VERSION:
        raise ConfigError(
            f"resume: {path} was written by an older fedexp (checkpoint format {version}), "
            f"which this one cannot check (format {FORMAT_VERSION}); start the run again"
        )
    if version != FORMAT_VERSION:
        raise ConfigError(f"resume: {path} is not a fedexp checkpoint of format {FORMAT_VERSION}")
    if payload.get("checksum") != content_checksum(payload):
        raise ConfigError(
            f"resume: {path} is damaged: its content does not match the checksum saved with it "
            "(changed on disk since it was written); restore the file or start the run again"
        )
    if expected_hash is not None:
        check_config_hash(payload, expected_hash, path)
    return payload


def check_config_hash(payload: dict, expected_hash: str, path: str | Path) -> None:
    """The checkpoint was written for the config whose hash is `expected_hash` (`config_hash`),
    its total number of rounds aside (a run that extends: `fedexp.config.extend`); else a
    one-line ConfigError naming the first key that differs."""
    total = saved_total(payload)
    if isinstance(expected_hash, ConfigDigest) and total is not None:
        expected_hash = config_hash({**expected_hash.stable, "rounds": total})
    if payload.get("config_hash") != expected_hash:
        diff = None
        if isinstance(expected_hash, ConfigDigest):
            diff = first_difference(expected_hash.stable, payload.get("resolved_config"))
        detail = f": {diff}" if diff else ""
        raise ConfigError(
            f"resume: {path} was written for a different config than the run dir's "
            f".hydra/config.yaml resolves to now (config hash mismatch{detail})"
        )


def saved_total(payload: dict) -> int | None:
    """The total number of rounds of the run that wrote the checkpoint (None: not recorded)."""
    resolved = payload.get("resolved_config")
    rounds = resolved.get("rounds") if isinstance(resolved, dict) else None
    return rounds if isinstance(rounds, int) and not isinstance(rounds, bool) else None


# what a resume reads of each section (`Checkpointer.restore`, `Orchestrator.load_state_dict`)
SECTIONS: dict[str, Any] = {
    "round": int,
    "config_hash": str,
    "data_digest": str,
    "server": {"params": (torch.Tensor, type(None)), "buffers": dict},
    "client_store": dict,
    "orchestrator": {
        "round": int,
        "totals": dict,
        "last_eval": dict,
        "client_accs": dict,
        "train_seconds": (int, float),
    },
    "components": dict,
    "loggers": dict,
    "rng": {"torch": torch.Tensor, "numpy": list, "python": list},
}


def check_sections(payload: dict, path: str | Path, spec: dict | None = None, at: str = "") -> None:
    """Every section a resume reads is there with its type (a round is an int >= 0, ...); one
    missing or of another type is a one-line ConfigError naming it."""
    for key, kind in (SECTIONS if spec is None else spec).items():
        where = f"{at}{key}"
        if not isinstance(payload, dict) or key not in payload:
            raise ConfigError(f"resume: {path} is damaged: it has no {where!r} section")
        value = payload[key]
        if isinstance(kind, dict):
            check_sections(value, path, kind, f"{where}.")
        elif not isinstance(value, kind) or isinstance(value, bool):
            raise ConfigError(
                f"resume: {path} is damaged: {where} is {type(value).__name__} {value!r:.40}"
            )
    if spec is None and (payload["round"] < 0 or payload["orchestrator"]["round"] < 0):
        raise ConfigError(f"resume: {path} is damaged: round {payload['round']} < 0")


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
