"""A client's local training: what it is configured by (`ClientConfig`, built once from `client.*`)
and what it did (`LocalTraining`; a cohort's facts, `CohortTraining`, reach `Algorithm.end`).

`ClientConfig` is the one owner of the `client.*` rules (`RULES`): the config's checks
(`fedexp.config.values.check_config_values`) build it before anything else is built, so this
module imports no torch at load time (a config error answers without it).
"""

from __future__ import annotations

import operator
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any

from fedexp.errors import ConfigError

if TYPE_CHECKING:
    import torch

# module: the model's own `configure_optimizers` (a LightningModule of the user's)
OPTIMIZERS = ("sgd", "adam", "module")

# client.<key>: (type, (bound, limit)); a float accepts an int, never a bool. Each rule of the
# client settings is stated here alone, in the order of `ClientConfig`'s fields
RULES: dict[str, tuple[type, tuple[str, Any]]] = {
    "local_epochs": (int, (">=", 1)),
    "batch_size": (int, (">=", 1)),
    "optimizer": (str, ("in", OPTIMIZERS)),
    "lr": (float, (">", 0)),
    "momentum": (float, (">=", 0)),
    "weight_decay": (float, (">=", 0)),
}
_KINDS = {int: "an int", float: "a number", str: "a string"}
_BOUNDS = {">=": operator.ge, ">": operator.gt}


def _checked(key: str, value: Any) -> Any:
    """`value` of `client.<key>` as its type, once it fits its rule (`RULES`); else a
    ConfigError `client.<key>: must be ..., got <value>`."""
    kind, (bound, limit) = RULES[key]
    fits = isinstance(value, kind) or (kind is float and isinstance(value, int))
    if isinstance(value, bool) or not fits:
        raise ConfigError(f"client.{key}: must be {_KINDS[kind]}, got {value!r}")
    if bound == "in" and value not in limit:
        raise ConfigError(f"client.{key}: must be one of {sorted(limit)}, got {value!r}")
    if bound != "in" and not _BOUNDS[bound](value, limit):
        raise ConfigError(f"client.{key}: must be {bound} {limit}, got {value!r}")
    return kind(value)


@dataclass(frozen=True)
class ClientConfig:
    """The client's local training settings (`client.*`), checked when built.

    Attributes:
        local_epochs: passes over the client's training data per round (E).
        batch_size: local mini-batch size (B); the last batch of an epoch may be shorter.
        optimizer: `sgd`, `adam`, or `module` (the model's own `configure_optimizers`).
        lr: the optimizer's learning rate.
        momentum: SGD momentum (ignored by Adam).
        weight_decay: L2 weight decay of the optimizer.
    """

    local_epochs: int
    batch_size: int
    optimizer: str
    lr: float
    momentum: float
    weight_decay: float

    def __post_init__(self) -> None:
        for key in RULES:  # frozen: the values normalised to their types once, here
            object.__setattr__(self, key, _checked(key, getattr(self, key)))

    @classmethod
    def from_mapping(cls, node: Mapping[str, Any]) -> ClientConfig:
        """The config of the `client` node (a resolved mapping); unknown or missing keys are a
        ConfigError naming them."""
        names = [f.name for f in fields(cls)]
        if not isinstance(node, Mapping):
            raise ConfigError(f"client: must be a mapping of {names}, got {node!r}")
        for key in node:
            if key not in names:
                raise ConfigError(f"client.{key}: not a client setting (one of {names})")
        for key in names:
            if key not in node:
                raise ConfigError(f"client.{key}: missing")
        return cls(**{key: node[key] for key in names})

    @property
    def optimizer_spec(self) -> tuple[str, dict[str, float]]:
        """(name, keyword arguments) of the client optimizer; momentum is SGD's only."""
        kwargs = {"lr": self.lr, "weight_decay": self.weight_decay}
        if self.optimizer == "sgd":
            kwargs["momentum"] = self.momentum
        return self.optimizer, kwargs

    def steps_per_epoch(self, num_samples: int) -> int:
        """ceil(n / B): the optimizer steps of one epoch over `num_samples` samples."""
        return -(-num_samples // self.batch_size)


@dataclass(frozen=True)
class PhaseTraining:
    """One phase of a client's local training (see `fedexp.core.client.Phase`).

    Attributes:
        name: the phase's name (`all`, or e.g. FedRep's `head` and `body`).
        epochs: passes over the data in this phase.
        steps: optimizer steps taken in this phase (epochs * ceil(n / B)).
        lrs: the learning rate of each optimizer param group, in the optimizer's order (a
            joint optimizer lists its optimizers' groups one after the other).
    """

    name: str
    epochs: int
    steps: int
    lrs: tuple[float, ...]


@dataclass(frozen=True)
class LocalTraining:
    """What one client's local training did; both executors fill it identically.

    SCAFFOLD-like algorithms read `steps` (K) and `lr` for their control variates,
    c_i+ = c_i - c + (x - y_i) / (K * lr).

    Attributes:
        steps: optimizer steps over all phases (sum of epochs * ceil(n / B)).
        samples: the client's training samples n (what it trained on).
        mean_loss: the mean of the steps' `training_step` losses, a 0-d tensor on the training
            device (read it with `float()`; 0 when no step was taken).
        phases: one `PhaseTraining` per phase, in order.
    """

    steps: int
    samples: int
    mean_loss: torch.Tensor
    phases: tuple[PhaseTraining, ...] = ()

    @property
    def lr(self) -> float | None:
        """The learning rate every step used, or None where the phases' param groups differ
        (e.g. WAFFLe's variational parameters): then read `phases`."""
        lrs = {lr for phase in self.phases for lr in phase.lrs}
        return lrs.pop() if len(lrs) == 1 else None


def optimizer_lrs(optimizer: Any) -> tuple[float, ...]:
    """The learning rate of each param group of `optimizer` (a torch optimizer, or an object
    holding several in `.optimizers`, e.g. `JointOptimizer`)."""
    import torch  # here, not at load time: the config's checks import this module before torch

    if not isinstance(optimizer, torch.optim.Optimizer) and hasattr(optimizer, "optimizers"):
        return tuple(lr for part in optimizer.optimizers for lr in optimizer_lrs(part))
    return tuple(float(group["lr"]) for group in optimizer.param_groups)
