"""Build components from `_target_` nodes, passing runtime objects (tensors, contexts) directly.

Hydra's `instantiate` merges keyword arguments into the config, which rejects non-primitive values
such as tensors and arrays; `build` resolves the node to plain values and calls the target itself.
"""

from __future__ import annotations

import functools
from typing import Any

from hydra.utils import get_object
from omegaconf import DictConfig, OmegaConf

from fedexp.core.types import ConfigError


def build(node: DictConfig | dict, **runtime: Any) -> Any:
    """Call `node._target_(**node, **runtime)`; with `_partial_: true` return a partial."""
    params = (
        OmegaConf.to_container(node, resolve=True) if isinstance(node, DictConfig) else dict(node)
    )
    target_name = params.pop("_target_")
    is_partial = params.pop("_partial_", False)
    try:
        target = get_object(target_name)
    except Exception as err:
        raise ConfigError(f"_target_: cannot import {target_name!r} ({err})") from None
    if is_partial:
        return functools.partial(target, **params, **runtime)
    return target(**params, **runtime)
