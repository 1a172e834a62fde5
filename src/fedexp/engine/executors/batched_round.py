"""A group of a round's clients trained at once through the algorithm's client half
(`Algorithm.begin` / `end`, `fedexp.core.cohort`): the vectorized executor's round, whose torch
operations do not grow with the cohort, beyond each client's own shuffle and the copy of the
state it keeps.

Begin: the algorithm stacks every client's start (the broadcast weights expanded, client state
gathered with one stack). The cohort's samples are gathered at once, each client's permutations
drawn from its own generator as the sequential loop draws them and brought to the host together,
and the batch schedule laid out there. Training: `stacked.train_stacked`, chunk by chunk. End:
the algorithm takes the trained stacked parameters and returns the uploads stacked; losses and
logged values stay on the device (`RoundResults`) until the round's sync.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from torch.utils._pytree import tree_map

from fedexp.core.algorithm import Algorithm
from fedexp.core.client_loop import client_streams, set_round
from fedexp.core.cohort import CohortTraining, RoundResults
from fedexp.core.local import PhaseTraining, optimizer_lrs
from fedexp.core.seeding import CLIENT, derive_seed, seed_global_rng
from fedexp.core.types import RoundContext
from fedexp.engine.executors.schedule import pad_rows, schedule
from fedexp.engine.executors.stacked import check_vmappable, train_stacked
from fedexp.engine.functional_optim import spec_from_optimizer


def run_cohort(
    algorithm: Algorithm,
    module,
    ids: list[int],
    payloads,
    stats,
    ctx: RoundContext,
    data,
    batch_size: int,
    chunk_size: int | None = None,
    pad_to: int | None = None,
    capture: bool = False,
    loop: bool = False,
) -> RoundResults:
    """Clients `ids`, all training `module`, begun, trained and ended as stacked tensors.

    `chunk_size`: at most this many clients trained at once; `pad_to`: every chunk padded to
    this many (inactive rows), so every step of every round has the same shapes, and each
    phase's steps run on a `StaticStep` (a CUDA graph with `capture`); `loop`: the chunk's
    clients train one after another (`stacked`'s loop form). With a training augmentation
    (`data.batch_transform`, drawn from each client's generator step by step) chunks are not
    padded."""
    messages = [payloads[c] for c in ids]
    start = algorithm.begin(module, ids, messages, stats)
    check_vmappable(module)
    module.train()
    set_round(module, ctx.round)  # the optimizer's lr is the round's (`_phase_plans` reads it)
    plans, rates = _phase_plans(module)
    x_all, y_all, sizes = cohort_train_data(data, ids)
    client = algorithm.ctx.client
    budgets = [client.budget(client.work(ctx.seed, ctx.round, c), n) for c, n in zip(ids, sizes)]
    schedules, generators = _schedules(ctx, ids, sizes, plans, batch_size, budgets)
    transform = data.batch_transform
    if transform is None:
        generators = None
    else:
        pad_to, capture = None, False
    buffers = {n: start.params[n] for n, _ in module.named_buffers()}
    params, loss_sum, log_sums, log_counts = _train_chunks(
        algorithm, module, ctx, ids, start, buffers, plans, x_all, y_all, schedules,
        (generators, transform), chunk_size=chunk_size, pad_to=pad_to, capture=capture, loop=loop,
    )  # fmt: skip
    params.update(buffers)  # buffers as the clients began (no running statistics here)
    phases = [
        tuple(
            PhaseTraining(name, e, k, lrs)
            for (name, _, _, lrs), (e, k) in zip(rates, _phase_work(plans, n, batch_size, budget))
        )
        for n, budget in zip(sizes, budgets)
    ]
    steps = [sum(p.steps for p in client_phases) for client_phases in phases]
    steps_t = torch.tensor([max(k, 1) for k in steps], device=loss_sum.device)
    local = ClientSlices(x_all, y_all, sizes)
    flat_lrs = tuple(lr for *_, lrs in rates for lr in lrs)
    training = CohortTraining(ids, list(sizes), steps, loss_sum / steps_t, flat_lrs, local, phases)
    upload = algorithm.end(module, messages, params, training)
    logged = {k: log_sums[k] / log_counts[k].clamp(min=1) for k in log_sums}
    stats_up = algorithm.client_stats(module, params)
    return RoundResults(training, upload, logged, log_counts, stats_up)


class ClientSlices(Sequence):
    """Each client's (x, y) of the cohort's samples laid client after client, sliced when read
    (an `end` that reads none costs nothing per client)."""

    def __init__(self, x: torch.Tensor, y: torch.Tensor, sizes):
        self.x, self.y = x, y
        self.cuts = np.cumsum([0, *sizes]).tolist()

    def __len__(self) -> int:
        return len(self.cuts) - 1

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        a, b = self.cuts[i], self.cuts[i + 1]
        return self.x[a:b], self.y[a:b]


def _phase_plans(module) -> tuple[list[tuple[str, tuple[str, ...], int, dict]], list]:
    """Each phase's (name, parameter names, epochs, optimizer spec), and (name, parameter
    names, epochs, its optimizer's learning rates), from the module's `phases` and
    `configure_optimizers`."""
    names = {id(p): n for n, p in module.named_parameters()}
    plans, rates = [], []
    for phase in module.phases():
        module.start_phase(phase)
        optimizer = module.configure_optimizers()
        spec = spec_from_optimizer(optimizer, names)
        params = tuple(names[id(p)] for p in phase.params)
        plans.append((phase.name, params, phase.epochs, spec))
        rates.append((phase.name, params, phase.epochs, optimizer_lrs(optimizer)))
    return plans, rates


def _phase_work(plans, n: int, batch_size: int, budget) -> list[tuple[int, int]]:
    """(epochs, steps) of each phase of a client with `n` samples: the plans' epochs, or its
    drawn local work's `budget` (epochs, step cap) for the one phase (`train_local`'s rule)."""
    per_epoch = -(-n // batch_size)
    if budget is None:
        return [(e, e * per_epoch) for _, _, e, _ in plans]
    epochs, cap = budget
    steps = epochs * per_epoch
    return [(epochs, steps if cap is None else min(cap, steps))]


def _schedules(
    ctx: RoundContext, ids: list[int], sizes, plans, batch_size: int, budgets=None
) -> tuple:
    """Each phase's `Schedule` (host arrays): each client's permutation of every epoch of every
    phase, in that order, drawn from its own generator (as the sequential loop draws them) and
    brought to the host at once; and the generators, where the augmentation draws next.
    `budgets`: each client's drawn local work (`ClientConfig.budget`) or None."""
    budgets = budgets or [None] * len(ids)
    work = [_phase_work(plans, n, batch_size, b) for n, b in zip(sizes, budgets)]
    perms, generators = [], []
    for cid, n, phases in zip(ids, sizes, work):
        generator = client_streams(ctx.seed, ctx.round, cid)[1]
        generators.append(generator)
        perms.extend(torch.randperm(n, generator=generator) for e, _ in phases for _ in range(e))
    flat = torch.cat(perms).numpy() if perms else np.zeros(0, np.int64)
    counts = [n for n, phases in zip(sizes, work) for e, _ in phases for _ in range(e)]
    pieces = np.split(flat, np.cumsum(counts)[:-1]) if counts else []
    schedules, used = [], [0] * len(ids)
    starts = np.cumsum([0] + [sum(e for e, _ in phases) for phases in work]).tolist()
    for k in range(len(plans)):
        phase_orders, caps = [], []
        for i, phases in enumerate(work):
            epochs, steps = phases[k]
            at = starts[i] + used[i]
            phase_orders.append(pieces[at : at + epochs])
            caps.append(steps)
            used[i] += epochs
        schedules.append(schedule(phase_orders, sizes, batch_size, caps))
    return schedules, generators


def _train_chunks(
    algorithm, module, ctx, ids, start, buffers, plans, x_all, y_all, schedules, augment, *,
    chunk_size, pad_to, capture, loop,
):  # fmt: skip
    """`train_stacked` over the cohort, chunk by chunk (`run_cohort`'s arguments; `augment`:
    the clients' generators and the augmentation, or None and None); (params, loss sums,
    logged sums, logged counts), each [C, ...] over the cohort."""
    generators, transform = augment
    stacked = {n: start.params[n] for n, _ in module.named_parameters()}
    chunk = chunk_size or len(ids)
    trained, losses, sums, counts = [], [], [], []
    for a in range(0, len(ids), chunk):
        b = min(a + chunk, len(ids))
        seed_global_rng(derive_seed(ctx.seed, CLIENT, ctx.round, ids[a], 2), algorithm.device)
        part = _rows(a, b, len(ids), pad_to)
        out = train_stacked(
            module,
            [(name, pn, spec) for name, pn, _, spec in plans],
            {n: part(t) for n, t in stacked.items()},
            {n: part(t) for n, t in buffers.items()},
            start.shared,
            tree_map(part, start.attrs),
            x_all,
            y_all,
            [sched.rows(a, b, pad_to).to(x_all.device) for sched in schedules],
            generators=None if generators is None else generators[a:b],
            transform=transform,
            static=pad_to is not None,
            capture=capture,
            loop=loop,
        )
        real = b - a  # the padded rows trained nothing: dropped
        trained.append({n: t[:real] for n, t in out[0].items()})
        losses.append(out[1][:real])
        sums.append({k: v[:real] for k, v in out[2].items()})
        counts.append({k: v[:real] for k, v in out[3].items()})
    if len(trained) == 1 and pad_to is None:
        return trained[0], losses[0], sums[0], counts[0]
    return (
        {n: torch.cat([t[n] for t in trained]) for n in trained[0]},
        torch.cat(losses),
        {k: torch.cat([s[k] for s in sums]) for k in sums[0]},
        {k: torch.cat([c[k] for c in counts]) for k in counts[0]},
    )


def cohort_train_data(data, client_ids: list[int]) -> tuple[torch.Tensor, torch.Tensor, list[int]]:
    """The cohort's training samples, client after client, and each client's count: one
    gather where the data can (`train_many`), else one slice per client."""
    many = getattr(data, "train_many", None)
    if many is not None:
        return many(client_ids)
    parts = [data.train(c) for c in client_ids]
    return (
        torch.cat([x for x, _ in parts]),
        torch.cat([y for _, y in parts]),
        [len(y) for _, y in parts],
    )


def _rows(a: int, b: int, total: int, pad_to: int | None = None):
    """Rows a..b of a stacked [C, ...] tensor (the tensor itself when that is all of it),
    padded to `pad_to` rows."""

    def take(t):
        if not isinstance(t, torch.Tensor):
            return t
        rows = t if (a == 0 and b == total) else t[a:b]
        return rows if pad_to is None else pad_rows(rows, pad_to)

    return take
