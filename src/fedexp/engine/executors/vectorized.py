"""executor=vectorized: the round's clients that share an architecture train at once (torch.func).

The objective is the module's own `training_step`, run under `functional_call` with each
client's parameters and vmapped over the cohort; `grad` differentiates it and a functional
SGD/Adam (`functional_optim`) keeps one optimizer state per client. What a module must satisfy:

- `training_step(batch, batch_idx)` is a pure function of the module's parameters, buffers and
  attributes: no `.item()`, no data-dependent Python control flow, no in-place writes to
  parameters or buffers (so no BatchNorm running statistics).
- The task loss ignores padded samples: a short batch is padded to `batch_size` with label -100,
  which `F.cross_entropy` ignores (its mean runs over the real samples only), so each client's
  gradient is that of its unpadded batch. Terms that do not depend on the batch (FedProx's
  proximal term, an alignment term on a shared dataset, a KL) need nothing.
- Per-client inputs that `client_begin` sets as module attributes (tensors, lists/dicts of
  tensors, numbers) are named in the module class's `per_client_state`; they are stacked across
  clients and set back, one slice per client, inside vmap, except where every client has the
  same (the same object, or an equal number). `client_begin` must assign new tensors rather than
  write into ones it gave another client. Undeclared attributes are the module's own, the same
  for every client (`fedexp.core.client_loop` states the rules).
- Randomness inside `training_step` comes from torch's global RNG (`self.generator` is None
  there); vmap draws it independently per client (`randomness="different"`), seeded from
  (seed, round, first client). Shuffling still uses each client's own generator, so a
  deterministic objective trains on exactly the batches of the sequential executor.
- A custom `autograd.Function` (straight-through estimators) needs `setup_context` and
  `generate_vmap_rule = True`.
- `client_begin`/`client_end` talk through the module and the client store only: all of a
  cohort's `client_begin` calls run before training, all `client_end` calls after (the
  sequential executor's `begin_client` / `finish_client`, wrapped around the batched training;
  `client_end` gets the same `LocalTraining` facts as there).
- What `training_step` logs (`self.log`) leaves the vmapped step as an output, one value per
  client, and is averaged over each client's own (unpadded) steps. A value computed over the
  batch sees the padded samples of an epoch's short last batch (label -100), as the loss does.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.func import functional_call, grad_and_value, vmap
from torch.utils._pytree import tree_map

from fedexp.core.algorithm import Algorithm
from fedexp.core.client import ClientModule
from fedexp.core.client_loop import begin_client, client_streams, finish_client
from fedexp.core.cohort import CohortResults, CohortTraining
from fedexp.core.local import LocalTraining, PhaseTraining, optimizer_lrs
from fedexp.core.seeding import CLIENT, derive_seed, seed_global_rng
from fedexp.core.types import ClientResult, ConfigError, Message, RoundContext
from fedexp.engine.functional_optim import FunctionalOptimizer, spec_from_optimizer
from fedexp.engine.stacking import architecture, client_attrs, split_attrs

IGNORE_LABEL = -100  # F.cross_entropy's default ignore_index


@dataclass
class _PhasePlan:
    name: str
    param_names: tuple[str, ...]
    steps: int  # this client's steps in the phase
    orders: list[torch.Tensor]  # one permutation per epoch, from the client's generator
    lrs: tuple[float, ...] = ()  # the phase optimizer's learning rates, per param group


@dataclass
class _ClientRun:
    """One client between `client_begin` and training."""

    client_id: int
    module: ClientModule
    generator: torch.Generator
    x: torch.Tensor
    y: torch.Tensor
    attrs: dict[str, Any]
    phases: list[_PhasePlan]
    optim_specs: list[dict]
    state: dict[str, torch.Tensor] = field(default_factory=dict)  # params and buffers
    payload: Message | None = None  # what the client received, handed back to `client_end`


class _TrainingStep(nn.Module):
    """Makes `training_step` the forward, so `functional_call` can swap the parameters in."""

    def __init__(self, inner: ClientModule):
        super().__init__()
        self.inner = inner

    def forward(self, batch, batch_idx: int) -> torch.Tensor:
        return self.inner.training_step(batch, batch_idx)


def _check_vmappable(module: nn.Module) -> None:
    for m in module.modules():
        if isinstance(m, nn.modules.batchnorm._BatchNorm) and m.track_running_stats:
            raise ConfigError(
                "executor: BatchNorm running statistics cannot be vectorized; use "
                "executor=sequential or track_running_stats=False"
            )


class VectorizedExecutor:
    """Trains each architecture group of the cohort at once with `torch.func`.

    The local batch size and optimizer are the algorithm's `ClientConfig`.

    Args:
        chunk_size: at most this many clients per vmapped call (bounds GPU memory); None: all.
    """

    def __init__(self, chunk_size: int | None):
        if chunk_size is not None and chunk_size < 1:
            raise ConfigError(f"executor.chunk_size: must be >= 1 or null, got {chunk_size}")
        self.chunk_size = chunk_size

    def check_algorithm(self, algorithm: Algorithm, num_clients: int) -> None:
        """Raise ConfigError before any training when a client module cannot be vmapped, or the
        algorithm says it cannot be vectorized (`Algorithm.vectorizable`)."""
        seen: set[int] = set()
        for cid in range(num_clients):
            module = algorithm.client_module(cid)
            if id(module) not in seen:
                seen.add(id(module))
                _check_vmappable(module)
        if not algorithm.vectorizable:
            raise ConfigError(
                f"executor: {type(algorithm).__name__} cannot be vectorized with this model; use "
                "executor=sequential"
            )

    def run(
        self, algorithm: Algorithm, payloads: Mapping[int, Message], ctx: RoundContext, data
    ) -> Sequence[ClientResult]:
        batch_size = algorithm.ctx.client.batch_size
        cohort = self._run_cohort(algorithm, payloads, ctx, data, batch_size)
        if cohort is not None:
            return cohort
        runs = [
            self._begin(algorithm, cid, payloads[cid], ctx, data, batch_size)
            for cid in ctx.client_ids
        ]
        groups: dict[tuple, list[_ClientRun]] = {}
        for run in runs:
            groups.setdefault(architecture(run.module), []).append(run)
        trained: dict[int, tuple[dict, torch.Tensor, int, dict]] = {}
        step = self.chunk_size or len(runs)
        for group in groups.values():
            for start in range(0, len(group), step):
                chunk = group[start : start + step]
                seed_global_rng(
                    derive_seed(ctx.seed, CLIENT, ctx.round, chunk[0].client_id, 2),
                    algorithm.device,
                )
                trained.update(self._train(chunk, data, batch_size))
        results = []
        for run in runs:
            params, loss, steps, logged = trained[run.client_id]
            module = run.module
            with torch.no_grad():  # trained parameters; buffers as this client's begin left them
                for name, p in module.named_parameters():
                    p.copy_(params[name])
                for name, b in module.named_buffers():
                    b.copy_(run.state[name])
            vars(module).update(run.attrs)
            module.generator = run.generator
            module.set_local_data((run.x, run.y))
            phases = tuple(PhaseTraining(p.name, len(p.orders), p.steps, p.lrs) for p in run.phases)
            training = LocalTraining(steps, len(run.y), loss, phases)
            results.append(
                finish_client(algorithm, module, run.client_id, run.payload, training, logged)
            )
        return results

    # ---- the whole cohort at once (`Algorithm.cohort_begin` / `cohort_end`) -------------------
    def _run_cohort(
        self, algorithm: Algorithm, payloads, ctx: RoundContext, data, batch_size: int
    ) -> CohortResults | None:
        """The round's cohort begun, trained and ended as stacked tensors, where the algorithm
        has the batched hooks and every client trains the same module; else None."""
        ids = list(ctx.client_ids)
        if not ids or data.batch_transform is not None:
            return None  # augmentation draws from each client's stream, step by step
        module = algorithm.client_module(ids[0])
        if any(algorithm.client_module(c) is not module for c in ids[1:]):
            return None
        messages = [payloads[c] for c in ids]
        start = algorithm.cohort_begin(module, ids, messages)
        if start is None:
            return None
        _check_vmappable(module)
        module.train()
        names = {id(p): n for n, p in module.named_parameters()}
        plans: list[tuple[str, tuple[str, ...], int, dict]] = []  # name, params, epochs, spec
        lrs: list[float] = []
        for phase in module.phases():
            module.start_phase(phase)
            optimizer = module.configure_optimizers()
            spec = spec_from_optimizer(optimizer, names)
            plans.append(
                (phase.name, tuple(names[id(p)] for p in phase.params), phase.epochs, spec)
            )
            lrs.extend(optimizer_lrs(optimizer))
        x_all, y_all, sizes = cohort_train_data(data, ids)
        # each client's permutation of every epoch of every phase, in that order, from its own
        # generator (as the sequential loop draws them), brought to the host at once
        total_epochs = sum(e for _, _, e, _ in plans)
        perms = []
        for cid, n in zip(ids, sizes):
            generator = client_streams(ctx.seed, ctx.round, cid)[1]
            perms.extend(torch.randperm(n, generator=generator) for _ in range(total_epochs))
        flat = torch.cat(perms).numpy() if perms else np.zeros(0, np.int64)
        cuts = np.cumsum([n for n in sizes for _ in range(total_epochs)])[:-1]
        pieces = np.split(flat, cuts)
        per_epoch = [-(-n // batch_size) for n in sizes]
        steps = [total_epochs * k for k in per_epoch]
        schedules, used = [], 0
        for _, _, epochs, _ in plans:
            phase_orders = [
                pieces[i * total_epochs + used : i * total_epochs + used + epochs]
                for i in range(len(ids))
            ]
            schedules.append(_schedule(phase_orders, sizes, batch_size, x_all.device))
            used += epochs
        param_names = [n for n, _ in module.named_parameters()]
        stacked = {n: start.params[n] for n in param_names}
        buffers = {n: start.params[n] for n, _ in module.named_buffers()}
        chunk = self.chunk_size or len(ids)
        trained, losses, sums, counts = [], [], [], []
        for a in range(0, len(ids), chunk):
            b = min(a + chunk, len(ids))
            seed_global_rng(derive_seed(ctx.seed, CLIENT, ctx.round, ids[a], 2), algorithm.device)
            part = _rows(a, b, len(ids))
            out = _train_stacked(
                module,
                [(name, pn, spec) for name, pn, _, spec in plans],
                {n: part(t) for n, t in stacked.items()},
                {n: part(t) for n, t in buffers.items()},
                start.shared,
                tree_map(part, start.attrs),
                x_all,
                y_all,
                [_shift(sched, a, b) for sched in schedules],
                generators=None,
                transform=None,
            )
            trained.append(out[0])
            losses.append(out[1])
            sums.append(out[2])
            counts.append(out[3])
        if len(trained) == 1:
            params, loss_sum, log_sums, log_counts = trained[0], losses[0], sums[0], counts[0]
        else:
            params = {n: torch.cat([t[n] for t in trained]) for n in trained[0]}
            loss_sum = torch.cat(losses)
            log_sums = {k: torch.cat([s[k] for s in sums]) for k in sums[0]}
            log_counts = {k: torch.cat([c[k] for c in counts]) for k in counts[0]}
        params.update(buffers)  # buffers as the clients began (no running statistics here)
        steps_t = torch.tensor([max(k, 1) for k in steps], device=loss_sum.device)
        training = CohortTraining(ids, list(sizes), steps, loss_sum / steps_t, tuple(lrs))
        upload = algorithm.cohort_end(module, messages, params, training)
        logged = {k: log_sums[k] / log_counts[k].clamp(min=1) for k in log_sums}
        return CohortResults(training, upload, logged, log_counts)

    # ---- before training: the sequential executor's calls, in its order ----------------------
    def _begin(
        self, algorithm, cid: int, payload, ctx: RoundContext, data, batch_size: int
    ) -> _ClientRun:
        global_seed, generator = client_streams(ctx.seed, ctx.round, cid)
        x, y = data.train(cid)
        module = begin_client(algorithm, cid, payload, global_seed, generator, (x, y))
        module.train()
        names = {id(p): n for n, p in module.named_parameters()}
        phases, specs = [], []
        for phase in module.phases():
            module.start_phase(phase)
            optimizer = module.configure_optimizers()
            specs.append(spec_from_optimizer(optimizer, names))
            orders = [
                torch.randperm(len(y), generator=module.generator) for _ in range(phase.epochs)
            ]
            per_epoch = -(-len(y) // batch_size)
            phase_names = tuple(names[id(p)] for p in phase.params)
            steps = phase.epochs * per_epoch
            lrs = optimizer_lrs(optimizer)
            phases.append(_PhasePlan(phase.name, phase_names, steps, orders, lrs))
        # this client's starting point: the next client_begin overwrites the module
        state = {
            n: t.detach().clone() for n, t in [*module.named_parameters(), *module.named_buffers()]
        }
        attrs = client_attrs(module)
        return _ClientRun(cid, module, module.generator, x, y, attrs, phases, specs, state, payload)

    # ---- one vmapped group ---------------------------------------------------------------------
    def _train(self, runs: list[_ClientRun], data, batch_size: int) -> dict[int, tuple]:
        module = runs[0].module
        _check_vmappable(module)
        device = runs[0].x.device
        layouts = {tuple((p.name, p.param_names) for p in r.phases) for r in runs}
        if len(layouts) > 1:
            raise ConfigError("executor: clients of one architecture must share their phases")
        param_names = [n for n, _ in module.named_parameters()]
        buffer_names = [n for n, _ in module.named_buffers()]
        stacked = {n: torch.stack([r.state[n] for r in runs]) for n in param_names}
        buffers = {n: torch.stack([r.state[n] for r in runs]) for n in buffer_names}
        shared_attrs, batched_attrs = split_attrs([r.attrs for r in runs], device)
        x_all = torch.cat([r.x for r in runs])
        y_all = torch.cat([r.y for r in runs])
        sizes = [len(r.y) for r in runs]
        schedules = [
            _schedule(
                [[o.numpy() for o in r.phases[k].orders] for r in runs], sizes, batch_size, device
            )
            for k in range(len(runs[0].phases))
        ]
        plans = [
            (p.name, p.param_names, runs[0].optim_specs[k]) for k, p in enumerate(runs[0].phases)
        ]
        transform = getattr(data, "batch_transform", None)
        generators = [r.generator for r in runs]
        stacked, loss_sum, log_sums, log_counts = _train_stacked(
            module,
            plans,
            stacked,
            buffers,
            shared_attrs,
            batched_attrs,
            x_all,
            y_all,
            schedules,
            generators,
            transform,
        )
        out = {}
        for i, r in enumerate(runs):
            params = {n: stacked[n][i] for n in param_names}
            logged = {k: log_sums[k][i] / log_counts[k][i] for k in log_sums if log_counts[k][i]}
            total = sum(p.steps for p in r.phases)
            loss = loss_sum[i] / max(total, 1)
            out[r.client_id] = (params, loss, total, logged)
        return out


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


def _rows(a: int, b: int, total: int):
    """Rows a..b of a stacked [C, ...] tensor (the tensor itself when that is all of it)."""

    def take(t):
        if not isinstance(t, torch.Tensor) or (a == 0 and b == total):
            return t
        return t[a:b]

    return take


def _shift(schedule, a: int, b: int):
    """A cohort's schedule cut to clients a..b (the sample indices stay into the cohort's
    data)."""
    idx, valid, active, everyone = schedule
    if a == 0 and b == idx.shape[0]:
        return schedule
    active = active[a:b]
    return idx[a:b], valid[a:b], active, active.all(0).tolist()


def _train_stacked(
    module: ClientModule,
    plans: list[tuple[str, tuple[str, ...], dict]],
    stacked: dict[str, torch.Tensor],
    buffers: dict[str, torch.Tensor],
    shared_attrs: dict,
    batched_attrs: dict,
    x_all: torch.Tensor,
    y_all: torch.Tensor,
    schedules: list,
    generators: list | None,
    transform,
):
    """The phases' steps for stacked clients: (params [C, ...], loss sums [C], logged sums and
    counts [C] by name). `schedules[k]`: `_schedule` of phase k; `transform` (with each client's
    generator) augments each client's batch."""
    num = next(iter(stacked.values())).shape[0]
    device = x_all.device
    step_fn = _vmapped_step(module)
    loss_sum = torch.zeros(num, device=device)
    log_sums: dict[str, torch.Tensor] = {}  # name -> [num], over each client's own steps
    log_counts: dict[str, torch.Tensor] = {}
    global_step = 0
    generator_backup = module.generator
    module.generator = None  # inside vmap, randomness comes from the global RNG
    vars(module).update(shared_attrs)
    try:
        for (name, phase_params, spec), (idx, valid, active, everyone) in zip(plans, schedules):
            module.current_phase = name  # as `start_phase` sets it sequentially
            trainable = set(phase_params)
            optim = FunctionalOptimizer(spec)
            for t in range(idx.shape[1]):
                xb = x_all[idx[:, t]]
                if transform is not None:  # each client's augmentation from its own stream
                    xb = torch.stack([transform(xb[i], g) for i, g in enumerate(generators)])
                yb = y_all[idx[:, t]].masked_fill(~valid[:, t], IGNORE_LABEL)
                train = {n: v for n, v in stacked.items() if n in trainable}
                frozen = {n: v for n, v in stacked.items() if n not in trainable}
                grads, (loss, logged) = step_fn(
                    train, frozen, buffers, batched_attrs, xb, yb, global_step + t
                )
                if everyone[t]:
                    optim.step(train, grads, None)
                    loss_sum += loss.detach()
                else:
                    optim.step(train, grads, active[:, t])
                    loss_sum += torch.where(active[:, t], loss.detach(), 0.0)
                if logged:
                    _fold_logged(log_sums, log_counts, logged, active[:, t], everyone[t])
                stacked.update(train)
            global_step += idx.shape[1]
    finally:
        module.generator = generator_backup
    return stacked, loss_sum, log_sums, log_counts


def _fold_logged(sums: dict, counts: dict, logged: dict, active: torch.Tensor, everyone: bool):
    """Add one step's logged values [num] of the active clients to the running sums."""
    for name, value in logged.items():
        value = value.detach().float()
        if name not in sums:
            sums[name] = torch.zeros_like(value)
            counts[name] = torch.zeros(value.shape, dtype=torch.long, device=value.device)
        sums[name] += value if everyone else torch.where(active, value, 0.0)
        counts[name] += active


def _vmapped_step(module: ClientModule):
    """(trainable, frozen, buffers, attrs, x, y, batch_idx) -> (grads, (loss, logged)), per
    client; `logged`: what the step passed to `self.log` (batched values must leave vmap as
    outputs, so they are taken off the capture inside the step)."""
    wrapper = _TrainingStep(module)
    capture = module.log_capture

    def loss_fn(trainable, frozen, buffers, attrs, x, y, batch_idx):
        vars(module).update(attrs)
        state = {f"inner.{n}": t for n, t in {**trainable, **frozen, **buffers}.items()}
        capture.take_step()
        loss = functional_call(wrapper, state, ((x, y), batch_idx))
        return loss, capture.take_step()

    return vmap(
        grad_and_value(loss_fn, has_aux=True),
        in_dims=(0, 0, 0, 0, 0, 0, None),
        randomness="different",
    )


def _schedule(orders: list[list[np.ndarray]], sizes: list[int], batch_size: int, device):
    """One phase's batches for stacked clients: sample indices [C, T, B] into the clients' data
    laid end to end, their validity, the active steps [C, T], and which steps every client
    takes (a list on the host: no device sync per step). Built on the host, moved at once.

    `orders[i]`: client i's permutation of each epoch of the phase. Each epoch's last, short
    batch is padded (invalid samples, label ignored); a client with fewer steps than the
    longest repeats its first batch on the padded steps and is masked out of the update.
    """
    per_epoch = [-(-n // batch_size) for n in sizes]
    own = [len(o) * k for o, k in zip(orders, per_epoch)]
    steps = max(own, default=0)
    num = len(sizes)
    idx = np.zeros((num, steps, batch_size), dtype=np.int64)
    valid = np.zeros((num, steps, batch_size), dtype=bool)
    active = np.zeros((num, steps), dtype=bool)
    offset = 0
    for i, (client_orders, n) in enumerate(zip(orders, sizes)):
        if client_orders:
            k = per_epoch[i]
            pos = np.full((len(client_orders), k * batch_size), -1, dtype=np.int64)
            for e, order in enumerate(client_orders):
                pos[e, :n] = order
            pos = pos.reshape(-1, batch_size)
            pos = np.concatenate([pos, np.repeat(pos[:1], steps - len(pos), axis=0)])
            idx[i] = np.maximum(pos, 0) + offset
            valid[i] = pos >= 0
            active[i, : own[i]] = True
        offset += n
    everyone = active.all(0).tolist()
    to = partial(torch.as_tensor, device=device)
    return to(idx), to(valid), to(active), everyone
