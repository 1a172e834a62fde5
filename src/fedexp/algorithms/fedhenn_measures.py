"""FedHeNN's alignment, measured each round (docs/fedhenn.md, "Alignment, measured").

Per client, at the model it starts its round from (what its first local step sees, `first`) and
at the model its last local step leaves (what it keeps and uploads, `last`):

- d: the alignment distance exactly as the objective computes it (`AlignModule.
  alignment_distance`: the configured distance, kernel and `align_layer`), on the round's RAD
  and target, the model in training mode as in a step;
- the gradient ratio eta(t) * ||grad d|| / ||grad F_i||, F_i the task loss over the client's
  whole training data (the objective's first term: its full-batch gradient, which the steps'
  mini-batches estimate); the norms are over the trained parameters, all concatenated.

Measuring never changes training: it runs in the algorithm's `end`, after the steps, client by
client: each client's parameters are loaded into the module, its starting ones (`first`) and its
trained ones (`last`), and the module's parameters and buffers put back afterwards. Each
measurement runs with torch's RNG forked (and seeded from (seed, round, client, which), so that
a model with dropout is measured alike under every executor and in either order), and the
model's train/eval and requires_grad flags, its buffers (BatchNorm's running statistics) and the
module's log capture put back; gradients come from `torch.autograd.grad`, which leaves `.grad`
and the optimiser alone. The starting parameters are measured with the buffers the client
trained with (in training mode a norm layer normalises by the batch's own statistics). The
cohort's measurements reach the round's metrics through the uploads (`measured`, stacked, not on
the wire: no bits), so they are right under every executor, the distributed one included.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from torch import nn

from fedexp.algorithms.fedhenn_alignment import AlignModule, AlignPayload
from fedexp.core.client_loop import load_row
from fedexp.core.cohort import CohortTraining
from fedexp.core.flat import load_flat
from fedexp.core.seeding import derive_seed, seed_global_rng
from fedexp.core.types import ClientResult, Weights

MEASURE_STREAM = 47  # derive_seed tag of the measurement's own randomness (dropout)
TASK_CHUNK = 1024  # the full-batch task gradient is summed over chunks of this many samples
DIST_FIRST, DIST_LAST = "fedhenn/align_dist_first", "fedhenn/align_dist_last"
RATIO_FIRST, RATIO = "fedhenn/grad_ratio_first", "fedhenn/grad_ratio"


@dataclass(frozen=True)
class Measurement:
    """One client's round: `values` = [d first, d last, ratio first, ratio last] (a tensor: no
    host sync per client; a cohort's stacked [C, 4], `fedexp.core.cohort.unstack` gives one's).
    `has_distance` is False where the round had no target to measure against (heterogeneous
    round 1, or eta0 = 0); its d entries are then NaN and unused."""

    values: torch.Tensor
    has_distance: bool


@dataclass(frozen=True)
class MeasuredWeights(Weights):
    """FedAvg's upload, the weight delta, with the client's measurement (not on the wire:
    `num_bits` counts the weights only)."""

    measured: Measurement | None = None


def measured_on(payload: AlignPayload) -> tuple[torch.Tensor, torch.Tensor] | None:
    """The (RAD inputs, target) the client's alignment is measured on: those it trains with,
    else the homogeneous server's `measure_on` of an eta = 0 round; None without a target."""
    if payload.rad is not None and payload.target is not None:
        return payload.rad.x, payload.target
    if payload.measure_on is not None:
        return payload.measure_on[0].x, payload.measure_on[1]
    return None


def term_on(payload: AlignPayload) -> bool:
    """Whether the client trains with the alignment term (`AlignModule.set_alignment`'s rule)."""
    return payload.eta > 0 and payload.rad is not None and payload.target is not None


class AlignmentMeter:
    """Measures a cohort's clients in the algorithm's `end`: each at the parameters it started
    its round from (`first`) and at those it trained (`last`). Keeps nothing between calls."""

    def __init__(self, seed: int, device: torch.device):
        self.seed = seed
        self.device = torch.device(device)

    def end(
        self,
        module: AlignModule,
        payloads: Sequence[AlignPayload],
        params: Mapping[str, torch.Tensor],
        training: CohortTraining,
        start: tuple[Sequence[torch.Tensor], torch.Tensor],
    ) -> Measurement:
        """The cohort's measurements, stacked [C, 4]. `params`: the trained parameters and
        buffers by name [C, ...] (as `end` receives them); `start`: (the module's tensors the
        clients started from other values of, those values flat: [d] for every client or
        [C, d]). The module's parameters and buffers are as they were afterwards."""
        has = {measured_on(p) is not None for p in payloads}
        if len(has) != 1:
            raise ValueError("FedHeNN: a cohort's clients are measured with and without a target")
        if not has.pop():  # no target: nothing to measure (d NaN, ratio 0)
            nan = torch.full((len(payloads), 2), float("nan"), device=self.device)
            return Measurement(torch.cat([nan, torch.zeros_like(nan)], 1), False)
        tensors, values = start
        rows = []
        with kept(module):
            for i, (cid, payload) in enumerate(zip(training.client_ids, payloads)):
                data = training.data[i] if training.data else None  # no data: ratio NaN
                load_row(module, params, i)
                last = self.measure(module, cid, payload, 1, data)
                load_flat(list(tensors), values if values.dim() == 1 else values[i])
                first = self.measure(module, cid, payload, 0, data)
                rows.append(torch.stack([first[0], last[0], first[1], last[1]]))
        return Measurement(torch.stack(rows), True)

    def measure(
        self, module: AlignModule, client_id: int, payload: AlignPayload, which: int, data
    ) -> torch.Tensor:
        """[d, ratio] of the module's model now (d NaN without a target; ratio 0 where the
        client trains without the term: its gradient there is 0); `data`: the client's
        training (x, y) for the task gradient."""
        on = measured_on(payload)
        zero = torch.zeros((), device=self.device)
        if on is None:
            return torch.stack([torch.full_like(zero, float("nan")), zero])
        rad, target = on
        seed = derive_seed(self.seed, MEASURE_STREAM, payload.round_idx, client_id, which)
        with untouched(module, seed, self.device) as params:
            if not term_on(payload):
                with torch.no_grad():
                    distance = module.alignment_distance(rad, target)
                return torch.stack([distance.detach().float(), zero])
            with torch.enable_grad():
                distance = module.alignment_distance(rad, target)
                align = gradient_norm(distance, params)
                task = task_gradient_norm(module, params, data)
            ratio = payload.eta * align / task.clamp_min(torch.finfo(task.dtype).tiny)
            return torch.stack([distance.detach().float(), ratio.float()])


@contextmanager
def kept(module: nn.Module) -> Iterator[None]:
    """The module's parameters and buffers are as they were on leaving (rows loaded inside)."""
    saved = [(t, t.detach().clone()) for t in [*module.parameters(), *module.buffers()]]
    try:
        yield
    finally:
        with torch.no_grad():
            for t, value in saved:
                t.copy_(value)


def trained_params(module: AlignModule) -> list[torch.nn.Parameter]:
    """The parameters local training updates: those of the module's phases, once each."""
    seen: dict[int, torch.nn.Parameter] = {}
    for phase in module.phases():
        for p in phase.params:
            seen.setdefault(id(p), p)
    return list(seen.values())


@contextmanager
def untouched(module: AlignModule, seed: int, device: torch.device) -> Iterator[list]:
    """The model in training mode with its trained parameters requiring gradients, on a forked
    RNG seeded with `seed`; afterwards the model's flags, buffers, RNG and the module's log
    capture are as they were. Yields the trained parameters."""
    model = module.model
    params = trained_params(module)
    flags = [(p, p.requires_grad) for p in params]
    modes = [(m, m.training) for m in model.modules()]
    buffers = [(b, b.detach().clone()) for b in model.buffers()]
    capture = module.log_capture
    step = capture.take_step()  # a user's objective may `log` inside its task loss
    devices = [device] if device.type == "cuda" else []
    try:
        with torch.random.fork_rng(devices=devices):
            seed_global_rng(seed, device)
            model.train()
            for p in params:
                p.requires_grad_(True)
            yield params
    finally:
        for m, mode in modes:
            m.training = mode
        for p, flag in flags:
            p.requires_grad_(flag)
        with torch.no_grad():
            for b, saved in buffers:
                b.copy_(saved)
        capture.take_step()
        capture.step = step


def gradient_norm(value: torch.Tensor, params: Sequence[torch.Tensor]) -> torch.Tensor:
    """||d value / d params||, all parameters concatenated (0 for those it does not reach)."""
    grads = torch.autograd.grad(value, list(params), allow_unused=True)
    return norm_of(grads, value)


def norm_of(grads, like: torch.Tensor) -> torch.Tensor:
    norms = [torch.linalg.vector_norm(g) for g in grads if g is not None]
    return torch.linalg.vector_norm(torch.stack(norms)) if norms else torch.zeros_like(like)


def task_gradient_norm(
    module: AlignModule, params: Sequence[torch.Tensor], data: tuple | None
) -> torch.Tensor:
    """||grad F_i||, F_i the task loss over the client's training `data` (x, y) as it trained on
    them (no augmentation), summed over chunks weighted by their share of the samples; NaN
    without data."""
    if data is None or len(data[1]) == 0:
        return torch.full((), float("nan"), device=params[0].device)
    x, y = data
    n = len(y)
    total = None
    for start in range(0, n, TASK_CHUNK):
        xb, yb = x[start : start + TASK_CHUNK], y[start : start + TASK_CHUNK]
        loss = module.task_loss((xb, yb), 0) * (len(yb) / n)
        grads = torch.autograd.grad(loss, list(params), allow_unused=True)
        if total is None:
            total = list(grads)
        else:
            total = [t if g is None else (g if t is None else t + g) for t, g in zip(total, grads)]
    return norm_of(total, loss)


def measured_metrics(results: Sequence[ClientResult], eta: float) -> dict[str, float]:
    """The round's metrics: each figure's unweighted mean over the cohort's clients (the
    distances over those measured against a target; absent where none was). Without any
    measurement (heterogeneous with eta0 = 0: nothing travels) a round with eta(t) = 0 still
    reports its ratios, 0."""
    rows = [m for r in results if (m := getattr(r.upload, "measured", None)) is not None]
    if not rows:
        return {RATIO_FIRST: 0.0, RATIO: 0.0} if eta == 0 else {}
    values = torch.stack([m.values for m in rows])
    with_target = [i for i, m in enumerate(rows) if m.has_distance]
    means = values[:, 2:].mean(0)
    if with_target:
        means = torch.cat([means, values[with_target, :2].mean(0)])
    numbers = means.tolist()  # one host sync for the round
    out = {RATIO_FIRST: numbers[0], RATIO: numbers[1]}
    if with_target:
        out.update({DIST_FIRST: numbers[2], DIST_LAST: numbers[3]})
    return out
