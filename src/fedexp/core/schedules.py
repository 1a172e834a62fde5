"""Learning-rate schedules across rounds: the lr of round t (1-based) of a run of T rounds.

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
This module imports no torch (the config's checks use its rules before anything is built).
"""

from __future__ import annotations

import math
import operator
from dataclasses import dataclass
from typing import Any

from fedexp.errors import ConfigError

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
