"""The one rule by which every image loader maps stored pixels to [0, 1].

By dtype, where the data enters (before any normalisation):

- uint8 (and any other integer type): values must be in 0..255 and are divided by 255; a value
  outside 0..255 (a 16-bit image, a label map up to 1000) is refused, never clipped;
- float: values must be finite and in [0, 1], and are kept as they are; a NaN, an infinity or a
  value outside [0, 1] (e.g. float levels 0..255) is refused;
- bool: False 0, True 1.

`dataset.pixel_range: [lo, hi]` (datasets that take it: `hf`, `femnist`; default null) declares
the stored range instead, whatever the dtype: every value must be in [lo, hi] and is mapped to
(value - lo) / (hi - lo). LEAF JSON has no dtype: its numbers follow the float rule (LEAF stores
pixels in [0, 1]). A refusal is one `ConfigError` line naming the file (or split and column),
the row, the value and the rule.
"""

from __future__ import annotations

import io
import math
from typing import Any

import numpy as np

from fedexp.data.files import data_error, one_line
from fedexp.errors import ConfigError

RULE = (
    "the rule: uint8/integer pixels must be in 0..255 and are divided by 255, float pixels "
    "must be in [0, 1] and are kept; set dataset.pixel_range=[lo, hi] to map another range"
)
LEAF_RULE = (
    "the rule: LEAF JSON pixels must be in [0, 1] (LEAF's own scale); set "
    "dataset.pixel_range=[lo, hi] to map another range, e.g. [0, 255]"
)
_255 = np.float32(255)


def check_pixel_range(value: Any) -> tuple[float, float] | None:
    """`dataset.pixel_range` as (lo, hi) with finite lo < hi, or None; ConfigError otherwise."""
    if value is None:
        return None
    try:
        lo, hi = (float(v) for v in value if not isinstance(v, bool | str))
    except (TypeError, ValueError):
        lo = hi = math.nan
    if not (math.isfinite(lo) and math.isfinite(hi) and lo < hi):
        raise ConfigError(
            f"dataset.pixel_range: must be null or [lo, hi] with finite numbers lo < hi, "
            f"got {value!r}"
        )
    return lo, hi


def _first(mask: np.ndarray, array: np.ndarray, unit: str) -> str:
    """`<unit> i: pixel value v` for the first True of mask (the first axis counts units)."""
    at = tuple(int(i) for i in np.argwhere(mask)[0])
    value = array[at].item()
    where = f"{unit} {at[0]}: " if array.ndim > 1 else ""
    return f"{where}pixel value {value!r}"


def pixel_problem(
    array: np.ndarray, pixel_range: tuple[float, float] | None, rule: str = RULE, unit="row"
) -> str | None:
    """What breaks the pixel rule in array (its first axis counts `unit`s), or None."""
    kind = array.dtype.kind
    if kind == "b":
        return None
    if kind not in "uif":
        return f"pixels of dtype {array.dtype}, expected numbers ({rule})"
    if kind == "f":
        finite = np.isfinite(array)
        if not finite.all():
            return f"{_first(~finite, array, unit)} is not finite (pixels must be finite numbers)"
    if pixel_range is not None:
        lo, hi = pixel_range
        outside = (array < lo) | (array > hi)
        if outside.any():
            got = _first(outside, array, unit)
            return f"{got} outside dataset.pixel_range [{lo:g}, {hi:g}]"
        return None
    lo, hi, stated = (0, 255, "0..255") if kind in "ui" else (0.0, 1.0, "[0, 1]")
    if array.size and (array.min() < lo or array.max() > hi):
        outside = (array < lo) | (array > hi)
        return f"{_first(outside, array, unit)} outside {stated} for {array.dtype} pixels ({rule})"
    return None


def to_unit(
    array: np.ndarray,
    where: str,
    pixel_range: tuple[float, float] | None = None,
    rule: str = RULE,
    unit: str = "row",
) -> np.ndarray:
    """Stored pixels -> float32 in [0, 1] by the rule above; one ConfigError naming `where`."""
    array = np.asarray(array)
    problem = pixel_problem(array, pixel_range, rule, unit)
    if problem is not None:
        raise data_error(where, problem)
    if pixel_range is not None:
        lo, hi = pixel_range
        return ((array.astype(np.float64) - lo) / (hi - lo)).astype(np.float32)
    if array.dtype.kind in "uib":
        return array.astype(np.float32) / (_255 if array.dtype.kind != "b" else np.float32(1))
    return array.astype(np.float32, copy=False)


def decode_image(value: Any, where: str, grey: bool = False) -> np.ndarray:
    """One image (PIL image, {'bytes': ...} dict, array or nested list) -> its stored pixels.

    8-bit PIL modes become uint8 L (1, L; any mode with `grey`) or RGB (the rest); 16/32-bit
    integer (I, I;16) and float (F) images keep their values, for `to_unit` to judge: nothing
    is clipped or cast here.
    """
    from PIL import Image

    try:
        if isinstance(value, dict):
            value = Image.open(io.BytesIO(value["bytes"]))
        elif isinstance(value, bytes):
            value = Image.open(io.BytesIO(value))
        if isinstance(value, Image.Image):
            if value.mode == "F" or value.mode.startswith("I"):
                value = np.asarray(value)
            else:
                value = value.convert("L" if grey or value.mode in ("1", "L") else "RGB")
        array = np.asarray(value)
    except Exception as err:
        raise data_error(where, f"not a readable image ({one_line(err)})") from None
    if array.ndim not in (2, 3) or array.dtype.kind not in "buif":
        raise data_error(where, f"not an image (an array of shape {array.shape})")
    return array
