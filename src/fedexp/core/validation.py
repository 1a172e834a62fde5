"""Cross-component compatibility checks, run before any training.

Every check raises `ConfigError("key.path: problem")` (one line). Components declare their own
checks, so adding a component never means editing this file:

- On a component's `_target_` (an algorithm, attack or executor class, a model factory, a dataset
  loader, an aggregator), define `check_config(cfg)` (a classmethod or staticmethod on a class;
  `@with_checks(config=...)` on a function). It runs before anything is built, with the whole
  config, so it can look at the other components (`target(cfg, "aggregator")`).
- `check_data(cfg, data)` works the same way and runs once the data is loaded and partitioned,
  before the model and algorithm are built, for checks that need data facts (input shape, number
  of classes, client ids).
- A partition scheme (a function in `fedexp.data.partition.SCHEMES`) may carry the same two hooks.
- A rule that belongs to no single component: `@config_rule` / `@data_rule` on a module-level
  function `(cfg)` / `(cfg, data)`; it is active once its module is imported (this module's
  rules always; a rule in a component's module when that component is in the config, because
  its `_target_` is imported before the rules run).

Examples of declared checks (the components they belong to land with them):

    class FRL(Algorithm):
        @classmethod
        def check_config(cls, cfg):
            if target(cfg, "aggregator") is not rank_vote:
                raise ConfigError("aggregator: FRL uploads rankings; use aggregator=rank_vote")
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from hydra.utils import get_object
from omegaconf import DictConfig

from fedexp.core.types import ConfigError

ConfigCheck = Callable[[DictConfig], None]
DataCheck = Callable[[DictConfig, Any], None]

CONFIG_RULES: list[ConfigCheck] = []
DATA_RULES: list[DataCheck] = []


def config_rule(fn: ConfigCheck) -> ConfigCheck:
    """Register a check `fn(cfg)` that runs on every config before anything is built."""
    CONFIG_RULES.append(fn)
    return fn


def data_rule(fn: DataCheck) -> DataCheck:
    """Register a check `fn(cfg, data)` that runs once the data is loaded and partitioned."""
    DATA_RULES.append(fn)
    return fn


def with_checks(config: ConfigCheck | None = None, data: DataCheck | None = None):
    """Attach `check_config` / `check_data` to a function component (model factory, loader)."""

    def attach(obj):
        if config is not None:
            obj.check_config = config
        if data is not None:
            obj.check_data = data
        return obj

    return attach


def target(cfg: DictConfig, key: str) -> Any | None:
    """The object named by `cfg.<key>._target_` (a class or function), or None if no target.

    `key` may be dotted (`logger.wandb`).
    """
    node = cfg
    for part in key.split("."):
        node = node.get(part) if isinstance(node, DictConfig) else None
    if not isinstance(node, DictConfig) or "_target_" not in node:
        return None
    name = node._target_
    try:
        return get_object(name)
    except Exception as err:
        cause = err.__cause__ or err  # Hydra wraps the real error in a multi-line ImportError
        reason = str(cause).strip().splitlines()[0] if str(cause).strip() else ""
        raise ConfigError(
            f"{key}._target_: cannot import {name!r} ({type(cause).__name__}: {reason})"
        ) from None


def components(cfg: DictConfig) -> Iterator[tuple[str, Any]]:
    """(key, target object) of every component in the config: nodes with a `_target_` at the top
    level (algorithm, model, dataset, ...) or one level down (logger.<name>)."""
    for key, node in cfg.items():
        if not isinstance(node, DictConfig):
            continue
        if "_target_" in node:
            yield str(key), target(cfg, str(key))
            continue
        for sub, child in node.items():
            if isinstance(child, DictConfig) and "_target_" in child:
                yield f"{key}.{sub}", target(cfg, f"{key}.{sub}")


def partition_scheme(cfg: DictConfig) -> Any | None:
    from fedexp.data.partition import SCHEMES

    return SCHEMES.get(cfg.partition.get("name")) if cfg.get("partition") else None


def _hooks(cfg: DictConfig, name: str) -> Iterator[Callable]:
    objs = [obj for _key, obj in components(cfg)] + [partition_scheme(cfg)]
    for obj in objs:
        hook = getattr(obj, name, None)
        if callable(hook):
            yield hook


def validate_config(cfg: DictConfig) -> None:
    """Run every declared config check (components first, then rules); raises ConfigError."""
    for hook in list(_hooks(cfg, "check_config")):  # imports every component's module first
        hook(cfg)
    for rule in CONFIG_RULES:
        rule(cfg)


def validate_data(cfg: DictConfig, data: Any) -> None:
    """Run every declared data check once the data is loaded; raises ConfigError."""
    for hook in list(_hooks(cfg, "check_data")):
        hook(cfg, data)
    for rule in DATA_RULES:
        rule(cfg, data)


# ---- rules of the run itself --------------------------------------------------------------------
@config_rule
def checkpoint_every_is_a_count(cfg: DictConfig) -> None:
    every = cfg.get("checkpoint_every", 0)
    if not isinstance(every, int) or isinstance(every, bool) or every < 0:
        raise ConfigError(f"checkpoint_every: must be an integer >= 0, got {every!r}")


@config_rule
def resume_is_given_alone(cfg: DictConfig) -> None:
    if cfg.get("resume") is not None:
        raise ConfigError(
            "resume: give it alone on the command line: python -m fedexp resume=<run dir>"
        )


@config_rule
def objective_is_a_metric_name(cfg: DictConfig) -> None:
    from fedexp.run import check_objective_name

    check_objective_name(cfg.get("objective", "auto"))


@config_rule
def partition_scheme_exists(cfg: DictConfig) -> None:
    from fedexp.data.partition import SCHEMES

    name = cfg.partition.get("name") if cfg.get("partition") else None
    if name not in SCHEMES:
        raise ConfigError(f"partition.name: unknown scheme {name!r}; one of {sorted(SCHEMES)}")
