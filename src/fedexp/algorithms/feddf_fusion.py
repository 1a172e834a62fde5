"""FedDF's server-side fusion: a student distilled towards an ensemble's logits on unlabelled
inputs, with the reference code's optimiser, schedule, clipping and early stopping
(`fedexp.algorithms.feddf` says which paper and code)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from fedexp.algorithms.distillation import cosine_lr, kl_to_teacher, logits_of, shuffled_batches
from fedexp.core.types import ConfigError

LR_SCHEDULES = ("cosine", "constant")


def _check(ok: bool, key: str, problem: str) -> None:
    if not ok:
        raise ConfigError(f"algorithm.{key}: {problem}")


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


@dataclass(frozen=True)
class DistillOptions:
    """The distillation half of FedDF's config (conf/algorithm/feddf.yaml has the defaults)."""

    distill_steps: int
    distill_batch_size: int
    distill_lr: float
    distill_lr_schedule: str
    temperature: float
    distill_clip_norm: float | None
    early_stop_every: int
    early_stop_patience: int | None
    val_fraction: float

    def __post_init__(self) -> None:
        _check(
            _is_int(self.distill_steps) and self.distill_steps >= 0,
            "distill_steps",
            "must be an int >= 0",
        )
        _check(
            _is_int(self.distill_batch_size) and self.distill_batch_size >= 1,
            "distill_batch_size",
            "must be an int >= 1",
        )
        _check(_is_number(self.distill_lr) and self.distill_lr > 0, "distill_lr", "must be > 0")
        _check(
            self.distill_lr_schedule in LR_SCHEDULES,
            "distill_lr_schedule",
            f"must be one of {LR_SCHEDULES}, got {self.distill_lr_schedule!r}",
        )
        _check(_is_number(self.temperature) and self.temperature > 0, "temperature", "must be > 0")
        clip = self.distill_clip_norm
        _check(
            clip is None or (_is_number(clip) and clip > 0),
            "distill_clip_norm",
            "must be > 0 or null",
        )
        _check(
            _is_int(self.early_stop_every) and self.early_stop_every >= 1,
            "early_stop_every",
            "must be an int >= 1",
        )
        patience = self.early_stop_patience
        _check(
            patience is None or (_is_int(patience) and patience >= 1),
            "early_stop_patience",
            "must be an int >= 1 or null",
        )
        _check(
            _is_number(self.val_fraction) and 0 < self.val_fraction < 1,
            "val_fraction",
            f"must be in (0, 1), got {self.val_fraction!r}",
        )

    @property
    def validates(self) -> bool:
        """Whether distillation is validated (early stopping on): with steps to take."""
        return self.early_stop_patience is not None and self.distill_steps > 0

    def val_size(self, pool: int) -> int:
        """Inputs of a `pool` held out to validate on: round(val_fraction x pool), at least 1;
        none without early stopping."""
        return max(1, round(self.val_fraction * pool)) if self.validates else 0

    def lr_at(self, step: int) -> float:
        if self.distill_lr_schedule == "constant":
            return self.distill_lr
        return cosine_lr(self.distill_lr, step, self.distill_steps)


@dataclass
class Distilled:
    """What a distillation did: steps taken, the validation loss of the model it kept (None
    without validation), and at which step that model was."""

    steps: int
    val_loss: float | None
    kept_step: int


def val_loss(student: nn.Module, val: tuple[torch.Tensor, torch.Tensor], opts) -> float:
    """The distillation loss of `student` (eval mode) on the held-out inputs."""
    x, targets = val
    logits = logits_of(student, x, opts.distill_batch_size)
    return float(kl_to_teacher(logits, targets, opts.temperature))


def distil(
    student: nn.Module,
    train: tuple[torch.Tensor, torch.Tensor],
    val: tuple[torch.Tensor, torch.Tensor],
    opts: DistillOptions,
    generator: torch.Generator,
) -> Distilled:
    """Train `student` (in train mode, in place) towards the ensemble's logits `train` =
    (inputs, targets) for `opts.distill_steps` steps; with early stopping, validate on `val`
    every `early_stop_every` steps and at the last, stop once `early_stop_patience` steps have
    passed since the best validation (the reference code's `perf_index - best_loc >=
    patience`), and leave the best validated model in `student`."""
    x, targets = train
    optimizer = torch.optim.Adam(student.parameters(), lr=opts.distill_lr)
    batches = shuffled_batches(len(x), opts.distill_batch_size, generator)
    best: tuple[float, int, dict] | None = None  # (loss, step, state) of the best validated
    steps = 0
    student.train()
    with torch.enable_grad():
        for step in range(opts.distill_steps):
            for group in optimizer.param_groups:
                group["lr"] = opts.lr_at(step)
            idx = next(batches).to(x.device)
            loss = kl_to_teacher(student(x[idx]), targets[idx], opts.temperature)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            if opts.distill_clip_norm is not None:
                nn.utils.clip_grad_norm_(student.parameters(), opts.distill_clip_norm)
            optimizer.step()
            steps = step + 1
            if not opts.validates or (steps % opts.early_stop_every and steps < opts.distill_steps):
                continue
            value = val_loss(student, val, opts)
            if best is None or value < best[0]:
                state = {k: v.detach().clone() for k, v in student.state_dict().items()}
                best = (value, steps, state)
            if steps - best[1] >= opts.early_stop_patience:
                break
    if best is None:
        return Distilled(steps, None, steps)
    student.load_state_dict(best[2])
    return Distilled(steps, best[0], best[1])
