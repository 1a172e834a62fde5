"""The composed config as values, checked before anything is built or loaded (no torch needed).

`check_config_values(cfg)` runs first in every run and every resume, so each failure is one
line naming the key, before the data is loaded:

- every value resolves: an interpolation to a key that does not exist (`${nope}`), an unset
  environment variable (`${oc.env:NAME}` without a default) or a `???` left unset is refused;
- the keys a run needs (`REQUIRED`) are there (`~rounds` deletes one);
- the run scalars have their types and ranges (`fedexp.core.validation.SCALARS`);
- every number anywhere in the config (the options of every algorithm, aggregator, attack,
  partition, client, dataset, audit, ...) is finite: no option of fedexp takes NaN or ±inf, so
  one walk over the whole config refuses them wherever they are (each component's own range
  checks run when it is built, before training);
- every directory option (`paths.*`, `client_store.spill_dir`) is a directory or can be made
  one: not a file, nor under a file.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from fedexp.errors import ConfigError

# keys every run reads: deleting one (`~rounds`) is refused here, not met as a KeyError later
REQUIRED = (
    "seed",
    "rounds",
    "num_clients",
    "clients_per_round",
    "eval_every",
    "device",
    "progress",
    "dataset",
    "partition",
    "model",
    "client",
    "aggregator",
    "attack",
    "algorithm",
    "executor",
)
# directory options: a file there (or above) is refused before anything tries to write into it
DIRECTORIES = ("client_store.spill_dir",)
DIRECTORY_GROUPS = ("paths",)  # every key under these names a directory


def check_config_values(cfg: DictConfig) -> dict:
    """Run the checks of the module docstring; returns the resolved config (plain containers)."""
    from fedexp.core.validation import SCALARS, check_value

    values = resolved(cfg)
    for key in REQUIRED:
        if OmegaConf.select(cfg, key, default=_MISSING) is _MISSING:
            raise ConfigError(
                f"{key}: missing from the config (removed with ~{key}?); runs read it"
            )
    check_finite(values)  # first: NaN is refused as such, not as out of a range
    for key, (ann, bound) in SCALARS.items():
        value = OmegaConf.select(cfg, key, default=_MISSING)
        if value is not _MISSING:
            check_value(key, value, ann, bound)
    check_directories(values)
    return values


_MISSING = object()


def resolved(cfg: DictConfig) -> dict:
    """The config with every interpolation resolved; one that does not resolve is refused."""
    try:
        return OmegaConf.to_container(cfg, resolve=True, throw_on_missing=True)
    except OmegaConfBaseException as err:
        key = getattr(err, "full_key", None) or "config"
        raw = _raw(cfg, key)
        cause = str(getattr(err, "msg", None) or err).strip().splitlines()[0]
        cause = cause.removeprefix("KeyError raised while resolving interpolation: ").strip('"')
        if type(err).__name__ == "MissingMandatoryValue":
            raise ConfigError(f"{key}: no value given (???); set it") from None
        shown = f"{raw} " if isinstance(raw, str) and "${" in raw else ""
        raise ConfigError(f"{key}: {shown}does not resolve ({cause})") from None


def _raw(cfg: DictConfig, key: str) -> Any:
    node: Any = OmegaConf.to_container(cfg, resolve=False)
    for part in key.replace("]", "").replace("[", ".").split("."):
        try:
            node = node[int(part)] if isinstance(node, list) else node[part]
        except (KeyError, IndexError, ValueError, TypeError):
            return None
    return node


def check_finite(values: Any, key: str = "") -> None:
    """Refuse NaN and ±inf anywhere in `values` (nested dicts and lists), naming the key."""
    if isinstance(values, dict):
        for name, value in values.items():
            check_finite(value, f"{key}.{name}" if key else str(name))
    elif isinstance(values, list | tuple):
        for i, value in enumerate(values):
            check_finite(value, f"{key}[{i}]")
    elif isinstance(values, float) and not math.isfinite(values):
        raise ConfigError(f"{key}: must be a finite number, got {values}")


def check_directories(values: dict) -> None:
    """A directory option that names a file, or a path under a file, is refused."""
    keys = list(DIRECTORIES)
    for group in DIRECTORY_GROUPS:
        node = values.get(group)
        if isinstance(node, dict):
            keys += [f"{group}.{name}" for name in node]
    for key in keys:
        node: Any = values
        for part in key.split("."):
            node = node.get(part) if isinstance(node, dict) else None
        if isinstance(node, str) and node:
            check_directory(key, Path(node).expanduser())


def check_directory(key: str, path: Path) -> None:
    """`path` is a directory, or nothing yet with a directory as its nearest existing parent."""
    if path.exists() and not path.is_dir():
        raise ConfigError(f"{key}: {path} is a file, not a directory")
    for parent in path.parents:
        if parent.exists():
            if not parent.is_dir():
                raise ConfigError(f"{key}: {path} is under {parent}, which is a file")
            return
