"""The numeric columns `dataset=hf` reads as a vector input (`dataset.feature_keys`).

`feature_keys` lists the columns, or is `*`: every column but the label (`label_key`), the owner
(`client_key`) and the columns that hold no number at all (ids such as `site4`, names, free
text, an empty column, images), which are left out and named in one log line. A column that
holds numbers and something else (a stray `n/a`) is a feature with a bad value: refused naming
its row, as any value of a listed column that is not a finite number.
"""

from __future__ import annotations

import logging
import math
from pathlib import Path
from typing import Any

import numpy as np

from fedexp.data.files import data_error
from fedexp.errors import ConfigError

log = logging.getLogger(__name__)

STRINGS = ("string", "large_string")
SHOWN = 12  # columns named in the log line, each list


def column(split: Any, key: str, what: str, split_name: str) -> list:
    """The values of column `key`; a missing column is refused naming `dataset.<what>`."""
    if key not in split.column_names:
        raise ConfigError(
            f"dataset.{what}: no column {key!r} in split {split_name!r} "
            f"(columns: {', '.join(split.column_names)})"
        )
    return split[key]


def number(value: Any) -> bool:
    """Whether `value` reads as a number (`float(value)` succeeds)."""
    if value is None or isinstance(value, bytes):
        return False
    try:
        float(value)
    except (TypeError, ValueError):
        return False
    return True


def _finite(value: Any) -> bool:
    """A number that is not NaN or ±inf (`'nan'` in a name column is no number here)."""
    return number(value) and math.isfinite(float(value))


def _holds_numbers(split: Any, key: str) -> bool:
    """Whether a column may be a feature: numbers or booleans by its type, or strings, of which
    at least one is a finite number (the others are then refused by `features`, naming them);
    a column with no finite value at all (empty, all NaN) is none."""
    dtype = getattr(split.features.get(key), "dtype", None)
    if dtype in STRINGS or (isinstance(dtype, str) and dtype.startswith("float")):
        return any(_finite(v) for v in split[key])
    return isinstance(dtype, str) and dtype.startswith(("bool", "int", "uint"))


def _shown(names: list[str]) -> str:
    more = f" and {len(names) - SHOWN} more" if len(names) > SHOWN else ""
    return ", ".join(names[:SHOWN]) + more


def star_keys(split: Any, label_key: str, client_key: str | None, split_name: str) -> list[str]:
    """`feature_keys='*'`: every column but the label, the owner and those without numbers."""
    kept, left = [], []
    for key in split.column_names:
        if key == label_key:
            left.append(f"{key} (dataset.label_key)")
        elif key == client_key:
            left.append(f"{key} (dataset.client_key)")
        elif _holds_numbers(split, key):
            kept.append(key)
        else:
            left.append(f"{key} (no numbers)")
    if not kept:
        raise ConfigError(
            f"dataset.feature_keys: '*' found no column of numbers in split {split_name!r} "
            f"besides the label and the owner (columns: {', '.join(split.column_names)})"
        )
    log.info(
        "dataset.feature_keys='*': %d feature columns (%s); left out %s",
        len(kept),
        _shown(kept),
        _shown(left) if left else "none",
    )
    return kept


def feature_keys(
    keys, split: Any, label_key: str, client_key: str | None, split_name: str
) -> list[str]:
    """The feature columns: as listed, or `*` (`star_keys`)."""
    if keys == "*":
        return star_keys(split, label_key, client_key, split_name)
    if isinstance(keys, str) or not keys:
        raise ConfigError(f"dataset.feature_keys: a list of column names or '*', got {keys!r}")
    return [str(k) for k in keys]


def features(split: Any, keys: list[str], root: Path, split_name: str) -> np.ndarray:
    """Numeric columns -> a float32 (rows, len(keys)) array; anything else refused, naming it."""
    columns = []
    for key in keys:
        values = column(split, key, "feature_keys", split_name)
        where = f"{root}: split {split_name}, column {key}"
        try:
            array = np.asarray(values, dtype=np.float64)
        except (TypeError, ValueError):
            row = next((i for i, v in enumerate(values) if v is not None and not number(v)), 0)
            raise data_error(where, f"row {row}: {values[row]!r} is not a number") from None
        if array.ndim != 1:
            raise data_error(where, "holds lists or arrays, not one number a row")
        if not np.isfinite(array).all():
            row = int(np.flatnonzero(~np.isfinite(array))[0])
            raise data_error(where, f"row {row}: {array[row]} (missing or not finite)")
        columns.append(array)
    return np.stack(columns, axis=1).astype(np.float32)
