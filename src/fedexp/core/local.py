"""A client's local training: what it is configured by (`ClientConfig`, built once from `client.*`)
and what it did (`LocalTraining`; a cohort's facts, `CohortTraining`, reach `Algorithm.end`).

`ClientConfig` is the one owner of the `client.*` rules (`RULES`): the config's checks
(`fedexp.config.values.check_config_values`) build it before anything else is built, so this
module imports no torch at load time (a config error answers without it).

Learning-rate schedules across rounds: the lr of round t (1-based) of a run of T rounds.

One set of formulas for the client's lr (`client.lr_schedule`, `fedexp.core.local.ClientConfig`)
and the server's (`algorithm.server_lr_schedule` of FedAvg / FedAvgM and FedOpt), with γ the
decay, S the step length, W the warm-up length and lr_min the cosine's floor:

- constant:    lr (the default: training exactly as without a schedule)
- exponential: lr·γ^(t−1)                   (FRL's reference code's lr·0.999^e, e = t − 1)
- step:        lr·γ^floor((t−1)/S)          (γ once every S rounds)
- cosine:      lr_min + (lr − lr_min)·(1 + cos(π(t−1)/T))/2  (torch's CosineAnnealingLR with
               T_max = T stepped once a round: round 1 trains at lr, round T just above lr_min)
- warmup:      lr·t/W for t ≤ W, then lr    (linear warm-up; round W reaches lr)

The lr is a function of the round alone, so a resumed run trains as an uninterrupted one. Only
cosine depends on the run's total T: a run using it cannot be extended (`fedexp.config.extend`).

System heterogeneity (`client.local_work`): each client's local work in a round is drawn
uniformly from the integers of `client.local_work_range` [lo, hi], on its own stream of
(seed, round, client id) (`ClientConfig.work`), so every executor trains the same amounts and a
resumed run draws what an uninterrupted one draws.

- fixed:  every client takes `client.local_epochs` epochs (the default; no draw)
- epochs: client i takes E_i epochs in place of `client.local_epochs` (FedNova's experiments
          draw E_i from [2, 5])
- steps:  client i takes K_i optimizer steps: ceil(K_i / ceil(n_i / B)) passes over its data,
          each reshuffled, the last one cut off after the K_i-th step (FedProx's stragglers, who
          stop partway; `FedNova` normalises by the steps taken)
"""

from __future__ import annotations

import math
import operator
from collections.abc import Mapping
from dataclasses import MISSING, dataclass, field, fields
from functools import cached_property
from typing import TYPE_CHECKING, Any

from fedexp.errors import ConfigError

if TYPE_CHECKING:
    import torch


# ---- learning-rate schedules across rounds ----------------------------------------------------

SCHEDULES = ("constant", "exponential", "step", "cosine", "warmup")

# a schedule's options: (type, (bound, limit)); `(]`: within (limit[0], limit[1]]. The client's
# keys are these with `lr_` before them (`client.lr_decay`), the server's with `server_lr_`
SCHEDULE_RULES: dict[str, tuple[type, tuple[str, Any]]] = {
    "schedule": (str, ("in", SCHEDULES)),
    "decay": (float, ("(]", (0, 1))),
    "step_rounds": (int, (">=", 1)),
    "min": (float, (">=", 0)),
    "warmup_rounds": (int, (">=", 1)),
}
_KINDS = {int: "an int", float: "a number", str: "a string"}
_BOUNDS = {">=": operator.ge, ">": operator.gt}


def check_rule(key: str, rule: tuple[type, tuple[str, Any]], value: Any) -> Any:
    """`value` of option `key` as its type, once it fits `rule`; else a ConfigError
    `<key>: must be ..., got <value>`. A float accepts an int, never a bool."""
    kind, (bound, limit) = rule
    if kind is tuple:
        return _checked_range(key, value, limit)
    fits = isinstance(value, kind) or (kind is float and isinstance(value, int))
    if isinstance(value, bool) or not fits:
        raise ConfigError(f"{key}: must be {_KINDS[kind]}, got {value!r}")
    if bound == "in" and value not in limit:
        raise ConfigError(f"{key}: must be one of {sorted(limit)}, got {value!r}")
    if bound == "(]" and not limit[0] < value <= limit[1]:
        raise ConfigError(f"{key}: must be in ({limit[0]}, {limit[1]}], got {value!r}")
    if bound in _BOUNDS and not _BOUNDS[bound](value, limit):
        raise ConfigError(f"{key}: must be {bound} {limit}, got {value!r}")
    return kind(value)


def _checked_range(key: str, value: Any, low: int) -> tuple[int, int] | None:
    """`value` of option `key` as (lo, hi), two ints with low <= lo <= hi, or None; else a
    ConfigError naming the option."""
    if value is None:
        return None
    pair = None if isinstance(value, (str, bytes, Mapping)) else _pair(value)
    if pair is None or any(isinstance(v, bool) or not isinstance(v, int) for v in pair):
        raise ConfigError(f"{key}: must be [lo, hi], two ints, got {value!r}")
    if not low <= pair[0] <= pair[1]:
        raise ConfigError(f"{key}: must be [lo, hi] with {low} <= lo <= hi, got {list(pair)}")
    return pair


def _pair(value: Any) -> tuple[Any, Any] | None:
    try:
        items = tuple(value)
    except TypeError:
        return None
    return items if len(items) == 2 else None


@dataclass(frozen=True)
class LRSchedule:
    """A schedule of the module docstring; `rounds` is the run's total T (cosine's only)."""

    name: str = "constant"
    decay: float = 0.999
    step_rounds: int = 10
    min: float = 0.0
    warmup_rounds: int = 5
    rounds: int | None = None

    def check(self, prefix: str, lr: float) -> LRSchedule:
        """This schedule with its options checked (`<prefix>schedule`, `<prefix>decay`, ...)
        for a base lr `lr`; a ConfigError names the option."""
        values = {
            key: getattr(self, key if key != "schedule" else "name") for key in SCHEDULE_RULES
        }
        ok = {k: check_rule(f"{prefix}{k}", SCHEDULE_RULES[k], v) for k, v in values.items()}
        if ok["schedule"] == "cosine":
            if self.rounds is None:
                raise ConfigError(f"{prefix}schedule: cosine needs the run's total rounds")
            if ok["min"] > lr:
                raise ConfigError(
                    f"{prefix}min: must be <= the lr it anneals from ({lr}), got {ok['min']}"
                )
        return LRSchedule(
            ok["schedule"], ok["decay"], ok["step_rounds"], ok["min"], ok["warmup_rounds"],
            self.rounds,
        )  # fmt: skip

    def at(self, lr: float, round_idx: int) -> float:
        """The lr of round `round_idx` (1-based) for a base lr `lr` (`lr` itself when
        constant: no arithmetic touches it)."""
        t = round_idx
        if self.name == "constant":
            return lr
        if self.name == "exponential":
            return lr * self.decay ** (t - 1)
        if self.name == "step":
            return lr * self.decay ** ((t - 1) // self.step_rounds)
        if self.name == "cosine":
            share = (1 + math.cos(math.pi * (t - 1) / self.rounds)) / 2
            return self.min + (lr - self.min) * share
        if self.name == "warmup":
            return lr * t / self.warmup_rounds if t <= self.warmup_rounds else lr
        raise ConfigError(f"lr_schedule: must be one of {list(SCHEDULES)}, got {self.name!r}")


# ---- the client's settings --------------------------------------------------------------------
# module: the model's own `configure_optimizers` (a LightningModule of the user's)
OPTIMIZERS = ("sgd", "adam", "module")
LOCAL_WORK = ("fixed", "epochs", "steps")
WORK_STREAM = 61  # derive_seed tag of a client's drawn local work (`client.local_work`)

# client.<key>: (type, (bound, limit)); a float accepts an int, never a bool
# (`check_rule`). Each rule of the client settings is stated here alone,
# in the order of `ClientConfig`'s fields; the lr schedule's are the schedules' own rules
RULES: dict[str, tuple[type, tuple[str, Any]]] = {
    "local_epochs": (int, (">=", 1)),
    "batch_size": (int, (">=", 1)),
    "optimizer": (str, ("in", OPTIMIZERS)),
    "lr": (float, (">", 0)),
    "momentum": (float, (">=", 0)),
    "weight_decay": (float, (">=", 0)),
    **{f"lr_{key}": rule for key, rule in SCHEDULE_RULES.items()},
    "local_work": (str, ("in", LOCAL_WORK)),
    "local_work_range": (tuple, ("range", 1)),  # null, or [lo, hi] with 1 <= lo <= hi
}


def _checked(key: str, value: Any) -> Any:
    """`value` of `client.<key>` as its type, once it fits its rule (`RULES`); else a
    ConfigError `client.<key>: must be ..., got <value>`."""
    return check_rule(f"client.{key}", RULES[key], value)


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
        lr_schedule: the lr across rounds (`fedexp.core.local`): `constant` (the default),
            `exponential`, `step`, `cosine` or `warmup`; round t trains at `lr_at(t)`.
        lr_decay: γ of `exponential` and `step`, in (0, 1] (default 0.999).
        lr_step_rounds: S of `step`: γ once every S rounds (default 10).
        lr_min: the floor `cosine` anneals to, <= lr (default 0).
        lr_warmup_rounds: W of `warmup`: lr·t/W up to round W (default 5).
        local_work: `fixed` (the default: `local_epochs` for every client), `epochs` or
            `steps`: each client's local work in a round drawn from `local_work_range`
            (`fedexp.core.local`, system heterogeneity).
        local_work_range: [lo, hi] (inclusive) the epochs or steps are drawn from; null when
            `fixed`.
        rounds: the run's total rounds T (not a `client.*` key: the config's checks give it;
            `cosine` needs it).
    """

    local_epochs: int
    batch_size: int
    optimizer: str
    lr: float
    momentum: float
    weight_decay: float
    lr_schedule: str = "constant"
    lr_decay: float = 0.999
    lr_step_rounds: int = 10
    lr_min: float = 0.0
    lr_warmup_rounds: int = 5
    local_work: str = "fixed"
    local_work_range: tuple[int, int] | None = None
    rounds: int | None = field(default=None, kw_only=True)

    def __post_init__(self) -> None:
        for key in RULES:  # frozen: the values normalised to their types once, here
            object.__setattr__(self, key, _checked(key, getattr(self, key)))
        if self.rounds is not None:
            check_rule("rounds", (int, (">=", 1)), self.rounds)
        if self.optimizer == "module" and self.lr_schedule != "constant":
            raise ConfigError(
                "client.lr_schedule: set the lr of client.optimizer=module in the model's "
                f"configure_optimizers, got {self.lr_schedule!r}"
            )
        self.schedule.check("client.lr_", self.lr)
        if self.local_work == "fixed" and self.local_work_range is not None:
            raise ConfigError(
                "client.local_work_range: client.local_work=fixed trains client.local_epochs "
                "and ignores the range; set client.local_work=epochs or steps, got "
                f"{list(self.local_work_range)}"
            )
        if self.local_work != "fixed" and self.local_work_range is None:
            raise ConfigError(
                f"client.local_work_range: client.local_work={self.local_work} draws each "
                "client's work from it; set it as [lo, hi], e.g. client.local_work_range=[2,5]"
            )

    @classmethod
    def from_mapping(cls, node: Mapping[str, Any], rounds: int | None = None) -> ClientConfig:
        """The config of the `client` node (a resolved mapping) in a run of `rounds` rounds;
        unknown keys, or missing ones without a default (the lr schedule's have one), are a
        ConfigError naming them."""
        names = list(RULES)
        if not isinstance(node, Mapping):
            raise ConfigError(f"client: must be a mapping of {names}, got {node!r}")
        for key in node:
            if key not in names:
                raise ConfigError(f"client.{key}: not a client setting (one of {names})")
        for f in fields(cls):
            if f.name in names and f.name not in node and f.default is MISSING:
                raise ConfigError(f"client.{f.name}: missing")
        return cls(**{key: node[key] for key in names if key in node}, rounds=rounds)

    @staticmethod
    def depends_on_rounds(cfg: Any) -> list[str]:
        """What of `client.*` depends on the run's total rounds (`fedexp.config.extend`): the
        cosine schedule, annealed over them."""
        client = cfg.get("client") if hasattr(cfg, "get") else None
        if client is not None and client.get("lr_schedule") == "cosine":
            return ["client.lr_schedule=cosine"]
        return []

    @cached_property
    def schedule(self) -> LRSchedule:
        """The lr schedule across rounds (`client.lr_*`; made once)."""
        return LRSchedule(
            self.lr_schedule, self.lr_decay, self.lr_step_rounds, self.lr_min,
            self.lr_warmup_rounds, self.rounds,
        )  # fmt: skip

    def lr_at(self, round_idx: int) -> float:
        """The client lr of round `round_idx` (1-based): `lr` itself when constant."""
        return self.schedule.at(self.lr, round_idx)

    @property
    def optimizer_spec(self) -> tuple[str, dict[str, float]]:
        """(name, keyword arguments) of the client optimizer at the base `lr` (round 1's but for
        `warmup`); momentum is SGD's only. `round_spec(t)`: round t's."""
        return self.round_spec(None)

    def round_spec(self, round_idx: int | None) -> tuple[str, dict[str, float]]:
        """(name, keyword arguments) of the client optimizer in round `round_idx` (its lr
        `lr_at(round_idx)`; None: the base lr)."""
        lr = self.lr if round_idx is None else self.lr_at(round_idx)
        kwargs = {"lr": lr, "weight_decay": self.weight_decay}
        if self.optimizer == "sgd":
            kwargs["momentum"] = self.momentum
        return self.optimizer, kwargs

    def steps_per_epoch(self, num_samples: int) -> int:
        """ceil(n / B): the optimizer steps of one epoch over `num_samples` samples."""
        return -(-num_samples // self.batch_size)

    @property
    def varies(self) -> bool:
        """Whether each client's local work is drawn (`local_work` epochs or steps)."""
        return self.local_work != "fixed"

    def work(self, seed: int, round_idx: int, client_id: int) -> int | None:
        """The epochs or steps client `client_id` takes in round `round_idx` of a run seeded
        `seed`: uniform on the integers of `local_work_range`, drawn on the client's own stream
        (`WORK_STREAM`); None when `fixed`."""
        if self.local_work == "fixed":
            return None
        # here for start-up: the config's checks import this module, and seeding imports torch
        import numpy as np

        from fedexp.core.seeding import derive_seed

        lo, hi = self.local_work_range
        rng = np.random.default_rng(derive_seed(seed, WORK_STREAM, round_idx, client_id))
        return int(rng.integers(lo, hi + 1))

    def budget(self, work: int | None, num_samples: int) -> tuple[int, int | None] | None:
        """(passes over the data, step cap or None) of a client with `num_samples` samples
        that drew `work` (`ClientConfig.work`); None when fixed (the module's own phases)."""
        if work is None:
            return None
        if self.local_work == "epochs":
            return work, None
        per_epoch = self.steps_per_epoch(num_samples)
        return (-(-work // per_epoch) if per_epoch else 0), work


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
