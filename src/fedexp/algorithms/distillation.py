"""Pieces the distillation algorithms share (FedMD, FedDF): the server pool's subsets, a model's
logits on them, the losses that pull a model's logits towards targets, and shuffled batches.

The server pool (`partition.server_pool`, `FederatedData.server_x`) holds inputs only: the
distillation algorithms use it as public, unlabelled data, as FedHeNN draws its RAD from it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import replace

import torch
import torch.nn.functional as F
from torch import nn

from fedexp.core.types import ConfigError
from fedexp.models.family import family_size

POOL_KEY = "partition.server_pool"
LOGIT_LOSSES = ("l1", "mse")


def check_pool(pool: int, need: int, what: str, lower: str | None = None) -> None:
    """A one-line ConfigError unless the server pool holds `need` inputs; `what` says what the
    algorithm draws from it (e.g. "FedMD draws each round's public subset
    (algorithm.public_size=5000)"), `lower` the option that asks for them, if one does."""
    fix = f"raise {POOL_KEY}" + (f" or lower {lower}" if lower else "")
    if pool == 0:
        size = f">= {need}" if lower else "(e.g. 200 on digits; FedHeNN's presets set 10000)"
        raise ConfigError(
            f"{POOL_KEY}: 0, but {what} from the server's pool; set {POOL_KEY} {size}"
        )
    if pool < need:
        raise ConfigError(f"{POOL_KEY}: {pool} < {need}, but {what} from it; {fix}")


def pool_size(data) -> int:
    """How many inputs the server pool holds (0: none)."""
    server_x = getattr(data, "server_x", None)
    return 0 if server_x is None else len(server_x)


@torch.no_grad()
def logits_of(model: nn.Module, x: torch.Tensor, batch_size: int) -> torch.Tensor:
    """The model's outputs on `x` in eval mode, `batch_size` inputs at a time ([len(x), C]); the
    model's mode is left as it was."""
    was_training = model.training
    model.eval()
    out = torch.cat([model(x[i : i + batch_size]) for i in range(0, len(x), batch_size)])
    model.train(was_training)
    return out


def logit_loss(kind: str, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """`l1`: the mean absolute difference over the batch and the classes (Keras's
    mean_absolute_error, FedMD's reference code); `mse`: the mean squared difference."""
    if kind == "l1":
        return (logits - targets).abs().mean()
    if kind == "mse":
        return (logits - targets).pow(2).mean()
    raise ConfigError(f"algorithm.digest_loss: must be one of {LOGIT_LOSSES}, got {kind!r}")


def kl_to_teacher(
    student_logits: torch.Tensor, teacher_logits: torch.Tensor, temperature: float
) -> torch.Tensor:
    """KL(softmax(t / T) || softmax(s / T)) averaged over the batch: FedDF's distillation loss as
    its reference code writes it (`F.kl_div(log_softmax(s/T), softmax(t/T), "batchmean")`, no
    T^2 factor)."""
    log_p = F.log_softmax(student_logits / temperature, dim=1)
    q = F.softmax(teacher_logits / temperature, dim=1)
    return F.kl_div(log_p, q, reduction="batchmean")


def cosine_lr(lr: float, step: int, total: int) -> float:
    """The lr of step `step` (0-based) of `total` under cosine annealing to 0 (torch's
    CosineAnnealingLR with T_max = total, stepped after every batch): lr at step 0."""
    return lr * (1 + math.cos(math.pi * step / total)) / 2


def shuffled_batches(n: int, batch_size: int, generator: torch.Generator) -> Iterator[torch.Tensor]:
    """Index batches over `n` items, reshuffled every pass (the last batch of a pass may be
    shorter), without end: a shuffling DataLoader restarted each time it is exhausted."""
    while True:
        order = torch.randperm(n, generator=generator)
        yield from order.split(batch_size)


def fit_targets(
    model: nn.Module,
    x: torch.Tensor,
    targets: torch.Tensor,
    epochs: int,
    batch_size: int,
    lr: float,
    loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    generator: torch.Generator,
) -> float:
    """Train `model` (in train mode) for `epochs` passes over (x, targets) in shuffled batches
    with a fresh Adam at `lr`, minimising `loss(logits, targets)` (`logit_loss` towards target
    logits, cross-entropy towards labels); returns the mean loss of the steps (0 without
    steps)."""
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    model.train()
    total, steps = 0.0, 0
    with torch.enable_grad():
        for _ in range(epochs):
            order = torch.randperm(len(x), generator=generator).to(x.device)
            for idx in order.split(batch_size):
                value = loss(model(x[idx]), targets[idx])
                optimizer.zero_grad(set_to_none=True)
                value.backward()
                optimizer.step()
                total += float(value.detach())
                steps += 1
    return total / steps if steps else 0.0


def with_family(ctx, default_family: str | None):
    """`ctx` with its model factory replaced by the model family `default_family`
    (`conf/model/<name>.yaml`, or `auto`: `fedexp.config.build.default_family`) where the chosen
    model is one architecture; `ctx` itself where `default_family` is None or the model is a
    family already."""
    if default_family is None or family_size(ctx.model_factory) is not None:
        return ctx
    if ctx.family is None:
        raise ConfigError("algorithm.default_family: this build context has no model families")
    return replace(ctx, model_factory=ctx.family(default_family))
