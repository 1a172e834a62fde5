"""The bottom layer: the error every layer raises for a configuration that cannot run, and the
hook by which a function component declares its own checks.

It imports nothing of fedexp, so any package may use it (see the layers in pyproject.toml).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


class ConfigError(ValueError):
    """A configuration that cannot run; the message is one line naming the key."""


ConfigCheck = Callable[[Any], None]  # check_config(cfg)
DataCheck = Callable[[Any, Any], None]  # check_data(cfg, data)


def with_checks(config: ConfigCheck | None = None, data: DataCheck | None = None):
    """Attach `check_config` / `check_data` to a function component (model factory, loader).

    `fedexp.core.validation` runs them before any training (see its module docstring).
    """

    def attach(obj):
        if config is not None:
            obj.check_config = config
        if data is not None:
            obj.check_data = data
        return obj

    return attach
