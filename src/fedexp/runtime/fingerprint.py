"""What a checkpoint must agree with to be resumed: the resolved config and the data itself.

The config is hashed *resolved*: `${oc.env:FEDEXP_DATA_DIR,...}` and other interpolations take
their values in the resuming process, so a resume under another data dir (or with any other
interpolated value changed) is a different config. The data digest covers what the run trains
and evaluates on, whatever produced it: training labels, a sample of the training inputs, the
test labels and every client's train/test indices.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch
from omegaconf import DictConfig, OmegaConf

from fedexp.core.summary import ADDED_KEYS

# keys that may differ between a run and its resumption without changing any result
VOLATILE_KEYS = ("resume", "progress", "progress_every_s", "device", "threads", "checkpoint_every")
VOLATILE_KEYS += ("client_store",)
INPUT_SAMPLE = 512  # training inputs hashed (evenly spaced): enough to tell two datasets apart


class ConfigDigest(str):
    """A config hash that remembers the resolved config it was taken of (to name a difference).

    Save `str(digest)`: a weights-only checkpoint load refuses the subclass.
    """

    stable: dict

    def __new__(cls, digest: str, stable: dict) -> ConfigDigest:
        obj = super().__new__(cls, digest)
        obj.stable = stable
        return obj


def stable_config(cfg: DictConfig | Mapping) -> dict:
    """The resolved config without the keys that do not change results, nor the keys that only
    repeat one of them (`executor.device: ${device}`)."""
    if isinstance(cfg, DictConfig):
        raw = OmegaConf.to_container(cfg, resolve=False)
        cfg = OmegaConf.to_container(cfg, resolve=True)
        _drop_copies(cfg, raw)
    stable = {k: v for k, v in cfg.items() if k not in VOLATILE_KEYS}
    _drop_added_defaults(stable)
    paths = stable.get("paths")
    if isinstance(paths, dict):  # caches only: their content is keyed by what it holds
        stable["paths"] = {k: v for k, v in paths.items() if k != "cache_dir"}
    return stable


def _drop_added_defaults(stable: dict) -> None:
    """Leave out an option added since older run dirs were saved while it holds the value they
    ran with (`ADDED_KEYS`): their checkpoints' hashes, taken without it, still match."""
    node = stable.get("algorithm")
    if not isinstance(node, dict):
        return
    added = ADDED_KEYS.get(str(node.get("_target_")), {})
    dropped = {k: v for k, v in node.items() if not (k in added and added[k] == v)}
    if len(dropped) != len(node):
        stable["algorithm"] = dropped


def _drop_copies(resolved: dict, raw: dict) -> None:
    """Remove from `resolved` the keys whose raw value is `${<a volatile key>}`."""
    copies = {"${" + key + "}" for key in VOLATILE_KEYS}
    for key, value in raw.items():
        if isinstance(value, str) and value.strip() in copies:
            resolved.pop(key, None)
        elif isinstance(value, dict) and isinstance(resolved.get(key), dict):
            _drop_copies(resolved[key], value)


def config_hash(cfg: DictConfig | Mapping) -> ConfigDigest:
    """A digest of the resolved config (a DictConfig is resolved here; a plain mapping is taken
    as it is), ignoring keys that do not change results."""
    stable = stable_config(cfg)
    text = json.dumps(stable, sort_keys=True, default=str)
    return ConfigDigest(hashlib.sha256(text.encode()).hexdigest(), stable)


def first_difference(mine: Any, theirs: Any, prefix: str = "") -> str | None:
    """The first dotted key whose value differs between two nested dicts, with both values."""
    if isinstance(mine, dict) and isinstance(theirs, dict):
        for key in sorted(set(mine) | set(theirs), key=str):
            found = first_difference(mine.get(key), theirs.get(key), f"{prefix}{key}.")
            if found is not None:
                return found
        return None
    if mine != theirs:
        return f"{prefix.rstrip('.')} is {mine!r} now, {theirs!r} in the checkpoint"
    return None


def data_digest(data: Any) -> str:
    """sha1 of the built `FederatedData`: train labels, a sample of train inputs, test labels and
    the client partition (train, test and validation indices of every client)."""
    h = hashlib.sha1()

    def add(array: Any) -> None:
        if isinstance(array, torch.Tensor):
            array = array.detach().cpu().contiguous().numpy()
        array = np.ascontiguousarray(array)
        h.update(f"{array.dtype}{array.shape}".encode())
        h.update(array.tobytes())

    ds = data.dataset
    add(ds.train_y)
    step = max(1, len(ds.train_x) // INPUT_SAMPLE)
    add(ds.train_x[::step][:INPUT_SAMPLE])
    if ds.test_y is not None:
        add(ds.test_y)
    splits = (data.partition.train, data.partition.test, getattr(data.partition, "val", None))
    for split in splits:
        for indices in split or ():
            add(np.asarray(indices, dtype=np.int64))
    return h.hexdigest()
