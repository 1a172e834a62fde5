"""The composed config as values, checked before anything is built or loaded (no torch needed).

`check_config_values(cfg)` runs first in every run and every resume, once, so each failure is
one line naming the key, before the data is loaded:

- every value resolves: an interpolation to a key that does not exist (`${nope}`), an unset
  environment variable (`${oc.env:NAME}` without a default) or a `???` left unset is refused;
- the keys a run needs (`REQUIRED`) are there (`~rounds` deletes one);
- the run scalars have their types and ranges (`SCALARS`, `GROUP_SCALARS`), and the client
  settings theirs: `fedexp.core.local.ClientConfig` owns the `client.*` rules and is built here,
  the run's one `ClientConfig` (`CheckedValues.client`, handed on to the build);
- every number anywhere in the config (the options of every algorithm, aggregator, attack,
  partition, client, dataset, audit, ...) is finite: no option of fedexp takes NaN or ±inf, so
  one walk over the whole config refuses them wherever they are (each component's own range
  checks run when it is built, before training);
- every directory option (`paths.*`, `client_store.spill_dir`) is a directory or can be made
  one: not a file, nor under a file.
"""

from __future__ import annotations

import math
import operator
import os
import types
import typing
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Union

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from fedexp.config.participation import check_participation
from fedexp.core.local import ClientConfig
from fedexp.errors import ConfigError, check_directory

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


@dataclass(frozen=True)
class CheckedValues:
    """What `check_config_values` returns: its proof that the checks ran, for the build."""

    values: dict  # the config resolved (plain containers)
    client: ClientConfig  # `client.*`, built (so checked) by its owner: the run's one


def check_config_values(cfg: DictConfig) -> CheckedValues:
    """Run the checks of the module docstring, in its order."""
    values = resolved(cfg)
    for key in REQUIRED:
        if OmegaConf.select(cfg, key, default=_MISSING) is _MISSING:
            raise ConfigError(
                f"{key}: missing from the config (removed with ~{key}?); runs read it"
            )
    check_finite(values)  # first: NaN is refused as such, not as out of a range
    check_scalars(cfg, SCALARS)
    # the `client.*` rules, its own; the run's total rounds for the cosine lr schedule
    client = ClientConfig.from_mapping(values["client"], rounds=values["rounds"])
    check_scalars(cfg, GROUP_SCALARS)
    check_participation(cfg)  # sampling, dropout, the availability trace (parsed, checked)
    check_directories(values)
    return CheckedValues(values, client)


def check_scalars(cfg: DictConfig, table: dict[str, tuple[Any, tuple | None]]) -> None:
    """The type and range of each key of `table` the config has (`check_value`)."""
    for key, (ann, bound) in table.items():
        value = OmegaConf.select(cfg, key, default=_MISSING)
        if value is not _MISSING:
            check_value(key, value, ann, bound)


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


# ---- types and ranges ---------------------------------------------------------------------------
# run scalars (no `_target_` to read them from): key -> (type, bound); the client settings come
# between these and GROUP_SCALARS, checked by their owner (`ClientConfig`)
SCALARS: dict[str, tuple[Any, tuple | None]] = {
    "seed": (int, ((">=", 0), ("<", 2**63))),  # torch and numpy seeds take 64-bit signed ints
    "rounds": (int, (">=", 1)),
    "num_clients": (int, (">=", 1)),
    "clients_per_round": (int, (">=", 1)),
    "eval_every": (int, (">=", 1)),
    "eval.personal_clients": (int | None, (">=", 1)),
    "eval.finetune_epochs": (int, (">=", 0)),
    "device": (str, None),
    "progress": (bool, None),
    "malloc_keep": (bool, None),
    "progress_every_s": (float | None, (">=", 0)),
    "objective": (str | None, None),
}
# options fedexp reads itself in the partition and dataset nodes
GROUP_SCALARS: dict[str, tuple[Any, tuple | None]] = {
    "partition.server_pool": (int | Literal["auto"], (">=", 0)),
    "partition.test_fraction": (float, (">=", 0)),
    "partition.classes_per_client": (int, (">=", 1)),
    "dataset.max_samples": (int | None, (">=", 1)),
}
_BOUNDS = {">=": operator.ge, ">": operator.gt, "<": operator.lt}
_SEQUENCES = (list, tuple, Sequence)


def fits(value: Any, ann: Any) -> bool:
    """Whether a config value fits a type annotation: an int is not a bool or a float, a float
    accepts an int, Optional/Union/Literal/list[...] are followed; a class that a config value
    cannot be (a context, a callable) is not checked."""
    origin, args = typing.get_origin(ann), typing.get_args(ann)
    if ann is Any:
        return True
    if origin in (Union, types.UnionType):
        return any(fits(value, a) for a in args)
    if origin is Literal:
        return any(value == a and type(value) is type(a) for a in args)
    if ann is None or ann is type(None):
        return value is None
    if ann is bool:
        return isinstance(value, bool)
    if ann is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if ann is float:
        return isinstance(value, int | float) and not isinstance(value, bool)
    if ann in (str, Path, os.PathLike):
        return isinstance(value, str)
    if ann in _SEQUENCES or origin in _SEQUENCES:
        if not isinstance(value, list | tuple):
            return False
        if origin is tuple and not (len(args) == 2 and args[1] is Ellipsis):  # fixed length
            return len(args) == len(value) and all(fits(v, a) for v, a in zip(value, args))
        return not args or all(fits(v, args[0]) for v in value)
    if ann in (dict, Mapping) or origin in (dict, Mapping):
        return isinstance(value, dict)
    return True


def describe(ann: Any) -> str:
    """'an int', 'a number', 'one of a, b', 'an int or null', ... for error messages."""
    origin, args = typing.get_origin(ann), typing.get_args(ann)
    if origin in (Union, types.UnionType):
        return " or ".join(dict.fromkeys(describe(a) for a in args))
    if origin is Literal:
        return "one of " + ", ".join(map(str, args))
    names = {int: "an int", float: "a number", bool: "true or false", str: "a string"}
    if ann in names:
        return names[ann]
    if ann is None or ann is type(None):
        return "null"
    if ann in (Path, os.PathLike):
        return "a path"
    if ann in _SEQUENCES or origin in _SEQUENCES:
        plural = {int: " of ints", float: " of numbers", str: " of strings", bool: " of booleans"}
        homogeneous = args and (origin is not tuple or args[-1] is Ellipsis)
        return "a list" + (plural.get(args[0], "") if homogeneous else "")
    return getattr(ann, "__name__", str(ann))


def check_value(key: str, value: Any, ann: Any, bound: tuple | None = None) -> None:
    """Raise ConfigError `key: must be <type>, got <value>` (or the bound it breaks); `bound`:
    `(op, limit)` or a tuple of them (`((">=", 0), ("<", 2**63))`)."""
    if not fits(value, ann):
        raise ConfigError(f"{key}: must be {describe(ann)}, got {value!r}")
    bounds = (bound,) if bound is not None and isinstance(bound[0], str) else bound or ()
    for op, limit in bounds:
        if isinstance(value, int | float) and not _BOUNDS[op](value, limit):
            shown = "2**63" if limit == 2**63 else limit
            raise ConfigError(f"{key}: must be {op} {shown}, got {value!r}")
