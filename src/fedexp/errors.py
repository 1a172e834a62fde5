"""The bottom layer: the error every layer raises for a configuration that cannot run, and the
hook by which a function component declares its own checks, and the directory check that
both the config checks and the run dir's lock make.

It imports nothing of fedexp, so any package may use it (see the layers in pyproject.toml).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any


class ConfigError(ValueError):
    """A configuration that cannot run; the message is one line naming the key."""


ConfigCheck = Callable[[Any], None]  # check_config(cfg)
DataCheck = Callable[[Any, Any], None]  # check_data(cfg, data)


def with_checks(config: ConfigCheck | None = None, data: DataCheck | None = None):
    """Attach `check_config` / `check_data` to a function component (model factory, loader).

    `fedexp.config.validation` runs them before any training (see its module docstring).
    """

    def attach(obj):
        if config is not None:
            obj.check_config = config
        if data is not None:
            obj.check_data = data
        return obj

    return attach


def check_directory(key: str, path: Path) -> None:
    """`path` is a directory, or nothing yet with a directory as its nearest existing parent."""
    if path.exists() and not path.is_dir():
        raise ConfigError(f"{key}: {path} is a file, not a directory")
    for parent in path.parents:
        if parent.exists():
            if not parent.is_dir():
                raise ConfigError(f"{key}: {path} is under {parent}, which is a file")
            return
