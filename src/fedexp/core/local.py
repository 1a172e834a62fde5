"""A client's local training: what it is configured by (`ClientConfig`, built once from `client.*`)
and what it did (`LocalTraining`, handed to `Algorithm.client_end`)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

import torch

from fedexp.core.types import ConfigError

# module: the model's own `configure_optimizers` (a LightningModule of the user's)
OPTIMIZERS = ("sgd", "adam", "module")


def _number(key: str, value: Any, kind: type) -> Any:
    """`value` as `kind` (int, or float accepting an int); never a bool or a string."""
    ok = isinstance(value, kind) or (kind is float and isinstance(value, int))
    if isinstance(value, bool) or not ok:
        raise ConfigError(f"client.{key}: must be {kind.__name__}, got {value!r}")
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
        set_ = object.__setattr__  # frozen: normalise the types once, here
        for key in ("local_epochs", "batch_size"):
            set_(self, key, _number(key, getattr(self, key), int))
        for key in ("lr", "momentum", "weight_decay"):
            set_(self, key, _number(key, getattr(self, key), float))
        checks = [
            (self.local_epochs >= 1, "local_epochs", f"must be >= 1, got {self.local_epochs}"),
            (self.batch_size >= 1, "batch_size", f"must be >= 1, got {self.batch_size}"),
            (
                self.optimizer in OPTIMIZERS,
                "optimizer",
                f"must be one of {sorted(OPTIMIZERS)}, got {self.optimizer!r}",
            ),
            (self.lr > 0, "lr", f"must be > 0, got {self.lr}"),
            (self.momentum >= 0, "momentum", f"must be >= 0, got {self.momentum}"),
            (self.weight_decay >= 0, "weight_decay", f"must be >= 0, got {self.weight_decay}"),
        ]
        for ok, key, problem in checks:
            if not ok:
                raise ConfigError(f"client.{key}: {problem}")

    @classmethod
    def from_mapping(cls, node: Mapping[str, Any]) -> ClientConfig:
        """The config of the `client` node (a resolved mapping); unknown or missing keys are a
        ConfigError naming them."""
        names = [f.name for f in fields(cls)]
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
    if not isinstance(optimizer, torch.optim.Optimizer) and hasattr(optimizer, "optimizers"):
        return tuple(lr for part in optimizer.optimizers for lr in optimizer_lrs(part))
    return tuple(float(group["lr"]) for group in optimizer.param_groups)
