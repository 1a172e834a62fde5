"""Cross-component compatibility checks, run before any training.

Every check raises `ConfigError("key.path: problem")` (one line). Components declare their own
checks, so adding a component never means editing this file:

- On a component's `_target_` (an algorithm, attack or executor class, a model factory, a dataset
  loader, an aggregator), define `check_config(cfg)` (a classmethod or staticmethod on a class;
  `@with_checks(config=...)` on a function, from `fedexp.errors`). It runs before anything is
  built, with the whole config, so it can look at the other components
  (`target(cfg, "aggregator")`).
- `check_data(cfg, data)` works the same way and runs once the data is loaded and partitioned,
  before the model and algorithm are built, for checks that need data facts (input shape, number
  of classes, client ids).
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

import re
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from hydra.utils import get_object
from omegaconf import DictConfig, OmegaConf

from fedexp.config.build import accepted_options, annotations_of, not_an_option
from fedexp.config.values import check_value
from fedexp.errors import ConfigError, with_checks  # noqa: F401 - with_checks is part of this API

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


def _hooks(cfg: DictConfig, name: str) -> Iterator[Callable]:
    objs = [obj for _key, obj in components(cfg)]
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


# ---- types and ranges (the scalars' own: `fedexp.config.values`, run before these) -------------
def check_types(cfg: DictConfig) -> None:
    """Every component's keys, and its options' types against its target's annotations, then
    the relations between the run's scalars; raises ConfigError. The values themselves (the run
    scalars, the client settings) were checked before: `fedexp.config.values`."""
    nodes = [(key, obj, OmegaConf.select(cfg, key)) for key, obj in components(cfg)]
    for key, obj, node in nodes:
        check_keys(key, obj, node)
        anns = annotations_of(obj)
        values = OmegaConf.to_container(node, resolve=True)
        for name, value in values.items():
            if name in anns:
                check_value(f"{key}.{name}", value, anns[name])
    # the relations between the run's scalars, before any component's own checks
    the_cohort_fits_the_population(cfg)
    the_held_out_fractions_leave_training_data(cfg)
    the_device_exists(cfg)


# keys of a component's node that fedexp reads itself, not passed to its target
OWN_KEYS = {"_target_", "_partial_"}
GROUP_KEYS = {"dataset": {"max_samples"}}  # the data cap, `fedexp.data.subset.KEY`
# what `build` passes besides the node (left out of the options an error lists)
RUNTIME = {"dataset": ("seed", "num_clients"), "algorithm": ("ctx",), "privacy": ("ctx",)}
RUNTIME["logger"] = ("run_dir",)


def check_keys(key: str, obj: Any, node: DictConfig) -> None:
    """Every key of a component's node is an option of its target, where the target's signature
    names them all (no `**kwargs`): a typo (`model.bias=1`, `algorithm.muu=0.1`) is refused
    here, before any data is read, as `build` would refuse it later."""
    options, closed = accepted_options(obj)
    if not closed:  # `**kwargs` passed on: the callee names a key it refuses (`build`)
        return
    own = OWN_KEYS | GROUP_KEYS.get(key, set())
    for name in node:
        if name not in options and name not in own:
            runtime = dict.fromkeys(RUNTIME.get(key.split(".")[0], ()))
            raise not_an_option(key, str(name), node._target_, options, runtime)


# ---- rules of the run itself --------------------------------------------------------------------
def the_cohort_fits_the_population(cfg: DictConfig) -> None:
    if cfg.clients_per_round > cfg.num_clients:
        raise ConfigError(
            f"clients_per_round: must be in [1, num_clients={cfg.num_clients}], "
            f"got {cfg.clients_per_round}"
        )


def the_held_out_fractions_leave_training_data(cfg: DictConfig) -> None:
    test, val = cfg.partition.test_fraction, cfg.partition.val_fraction
    if not 0 <= test < 1:
        raise ConfigError("partition.test_fraction: must be in [0, 1)")
    if not 0 <= val < 1:
        raise ConfigError("partition.val_fraction: must be in [0, 1)")
    if test + val >= 1:
        raise ConfigError(
            "partition.val_fraction: test_fraction + val_fraction must be < 1 (clients need "
            "training data)"
        )


def the_device_exists(cfg: DictConfig) -> None:
    if cfg.device not in ("auto", "cpu", "cuda"):
        raise ConfigError(f"device: must be auto, cpu or cuda, got {cfg.device!r}")
    if cfg.device == "cuda":
        import torch  # start-up: the config's checks run before torch is needed otherwise

        if not torch.cuda.is_available():
            raise ConfigError("device: cuda requested but no CUDA device is available")


@config_rule
def checkpoint_every_is_a_count(cfg: DictConfig) -> None:
    every = cfg.get("checkpoint_every", 0)
    if not isinstance(every, int) or isinstance(every, bool) or every < 0:
        raise ConfigError(f"checkpoint_every: must be an integer >= 0, got {every!r}")


@config_rule
def personal_sample_fits_the_population(cfg: DictConfig) -> None:
    count = OmegaConf.select(cfg, "eval.personal_clients", default=None)
    if isinstance(count, int) and count > cfg.num_clients:
        raise ConfigError(
            f"eval.personal_clients: {count} exceeds num_clients={cfg.num_clients}; "
            "null evaluates every client"
        )


@config_rule
def resume_is_given_alone(cfg: DictConfig) -> None:
    if cfg.get("resume") is not None:
        raise ConfigError(
            "resume: give it alone on the command line: python -m fedexp resume=<run dir>"
        )


# every metric name a run can return to a sweeper (`objective`); the eval/ ones exist only for
# algorithms with that kind of model, the eval/val/ ones only with a validation split
OBJECTIVE_PATTERNS = (
    r"train/loss",
    r"eval/(val/)?global/acc",
    r"eval/(val/)?global/client_acc_(mean|std|var|min|p10|max)",
    r"eval/(val/)?personal/acc_(mean|std|var|min|p10|max)",
    r"eval/(val/)?finetuned/acc_(mean|std|var|min|p10|max)",
    r"eval/group/gap",
    r"eval/group/[A-Za-z0-9_]+/acc_mean",
    r"privacy/[A-Za-z0-9_@%.]+",
    r"comm/(up|down)_bits(_total)?",
    r"attack/[a-z_]+",
)


NO_OBJECTIVE = "none"  # a run without an objective (`auto` without validation data)


def check_objective_name(name) -> None:
    """`auto`, `none` or the name of a metric fedexp reports (checked before anything is built)."""
    if name in ("auto", NO_OBJECTIVE):
        return
    if not isinstance(name, str) or not any(re.fullmatch(p, name) for p in OBJECTIVE_PATTERNS):
        raise ConfigError(
            f"objective: {name!r} is not a metric fedexp reports; e.g. auto, none, "
            "eval/val/global/acc, eval/val/personal/acc_mean, eval/global/acc, train/loss"
        )


def check_search_objective(cfg: DictConfig, searched: Sequence[str] = ()) -> None:
    """What a search (`hydra/sweeper=optuna_study`) needs before its first trial: an objective,
    and validation data when the objective is `auto` or an `eval/val/` metric (a search never
    falls back to tuning on the test set). `searched`: the keys the search varies (a searched
    `partition.val_fraction` is left to each trial)."""
    name = cfg.get("objective", "auto")
    check_objective_name(name)
    if name == NO_OBJECTIVE:
        raise ConfigError(
            "objective: none; a search needs one (e.g. eval/val/global/acc, with "
            "partition.val_fraction > 0)"
        )
    val = OmegaConf.select(cfg, "partition.val_fraction", default=0) or 0
    wants_val = name == "auto" or name.startswith("eval/val/")
    if wants_val and "partition.val_fraction" not in searched and not val > 0:
        raise ConfigError(
            f"objective: {name} needs validation data and partition.val_fraction is {val}; "
            "a search does not tune on the test set: set partition.val_fraction > 0"
        )


@config_rule
def objective_is_a_metric_name(cfg: DictConfig) -> None:
    check_objective_name(cfg.get("objective", "auto"))
