"""Training stacked clients at once: the vmapped step, the batch schedule and the phases' loop,
shared by the vectorized executor's client-by-client and batched rounds.

A round's batches are laid out on the host (`fedexp.engine.executors.schedule`: numpy arrays,
no device sync per step) and moved to the device once. With a fixed cohort size
(`Schedule.rows(..., pad_to=P)`, the parameters padded with `pad_rows`) every step of every
round has the same shapes, and `StaticStep` runs a step on fixed buffers: the form a CUDA graph
captures (`capture=True`, on CUDA only) and replays.

Two forms train the same stacked state (`executor.stack`). `vmap`: one vmapped step for all the
clients of a chunk, the form for a GPU, where a round's time is the host's launches. `loop`: the
clients one after another, each client's row of the stacked parameters loaded into the module
and trained there with autograd (`train_looped`), each epoch's short last batch as it is.
On a CPU a batched kernel does the same arithmetic as the per-client ones, so batching saves
nothing there, while the cohort's stacked activations leave the cache: the vmapped grouped
convolution of LeNet-5 (its backward above all) made the vmap form 2.1x the sequential
executor's time there (docs/BENCHMARKS.md). `auto` is `loop` on a CPU.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn
from torch.func import functional_call, grad_and_value, vmap
from torch.utils._pytree import tree_map

from fedexp.core.client import ClientModule
from fedexp.core.client_loop import set_client_inputs
from fedexp.core.types import ConfigError
from fedexp.engine.functional_optim import FunctionalOptimizer

IGNORE_LABEL = -100  # F.cross_entropy's default ignore_index


class TrainingStep(nn.Module):
    """Makes `training_step` the forward, so `functional_call` can swap the parameters in."""

    def __init__(self, inner: ClientModule):
        super().__init__()
        self.inner = inner

    def forward(self, batch, batch_idx: int) -> torch.Tensor:
        return self.inner.training_step(batch, batch_idx)


def check_vmappable(module: nn.Module) -> None:
    for m in module.modules():
        if isinstance(m, nn.modules.batchnorm._BatchNorm) and m.track_running_stats:
            raise ConfigError(
                "executor: BatchNorm running statistics cannot be vectorized; use "
                "executor=sequential or track_running_stats=False"
            )


class StaticStep:
    """One local step of a stacked cohort on buffers that keep their shapes and addresses: the
    trained parameters and the SGD momentum live in them, a step's batch is copied in, and the
    step writes its results back in place. On CUDA with `capture=True` the step after the first
    (which runs eagerly and warms up) is captured as a CUDA graph and replayed; elsewhere each
    step runs eagerly on the same buffers, so its shape invariants can be tested on a CPU.

    SGD only (Adam's bias correction depends on the step count, which a graph would freeze), and
    no dampening (the momentum buffer then starts at zero, equal to torch's first step). The
    step's `batch_idx` is the phase's first under capture.
    """

    def __init__(self, step_fn, spec: dict, train, frozen, buffers, attrs, capture: bool):
        for name, group in spec.items():
            if group.kind != "sgd" or group.dampening:
                raise ConfigError(
                    "executor.cuda_graphs: the local optimizer must be SGD without dampening "
                    f"({name}: {group.kind}, dampening {group.dampening})"
                )
        self.step_fn, self.capture = step_fn, capture
        self.optim = FunctionalOptimizer(spec)
        self.train = {n: t.contiguous().clone() for n, t in train.items()}
        self.frozen, self.buffers, self.attrs = frozen, buffers, attrs
        self.state = {
            n: {"momentum": torch.zeros_like(self.train[n])}
            for n, group in spec.items()
            if group.momentum
        }
        self.x = self.y = self.active = self.loss = None
        self.logged: dict[str, torch.Tensor] = {}
        self.graph = None
        self.steps = 0

    def _step(self, batch_idx: int) -> None:
        grads, (loss, logged) = self.step_fn(
            self.train, self.frozen, self.buffers, self.attrs, self.x, self.y, batch_idx
        )
        new = dict(self.train)
        self.optim.state = {n: dict(self.state.get(n, {})) for n in self.optim.specs}
        self.optim.step(new, grads, self.active)
        with torch.no_grad():
            for n, t in self.train.items():
                t.copy_(new[n])
            for n, s in self.state.items():
                s["momentum"].copy_(self.optim.state[n]["momentum"])
            self.loss.copy_(loss.detach())
            for k, v in logged.items():
                if k in self.logged:
                    self.logged[k].copy_(v.detach().float())
                else:  # the first, eager step: the buffer
                    self.logged[k] = v.detach().float().clone()

    def __call__(self, x, y, active, batch_idx: int):
        """One step on this batch: (loss [C], logged values [C] by name), buffers of this
        object (read them before the next call)."""
        if self.x is None:  # the first step: the buffers' shapes
            self.x, self.y, self.active = x.clone(), y.clone(), active.clone()
            self.loss = torch.zeros(x.shape[0], device=x.device)
        else:
            if (x.shape, y.shape, active.shape) != (self.x.shape, self.y.shape, self.active.shape):
                raise RuntimeError("StaticStep: a step's shapes changed")
            self.x.copy_(x)
            self.y.copy_(y)
            self.active.copy_(active)
        if self.graph is not None:
            self.graph.replay()
        elif self.capture and self.steps >= 1:
            self.graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(self.graph):
                self._step(batch_idx)
            self.graph.replay()
        else:
            self._step(batch_idx)
        self.steps += 1
        return self.loss, self.logged


def train_stacked(
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
    static: bool = False,
    capture: bool = False,
    loop: bool = False,
):
    """The phases' steps for stacked clients: (params [C, ...], loss sums [C], logged sums and
    counts [C] by name). `schedules[k]`: phase k's (idx, valid, active, everyone) on the device;
    `transform` (with each client's generator) augments each client's batch; `static`: each
    phase's steps run on a `StaticStep` (captured as a CUDA graph with `capture`); `loop`: the
    clients one after another (the `loop` form)."""
    if loop:
        if static:
            raise ConfigError("executor.static_shapes: needs executor.stack=vmap")
        return train_looped(
            module, plans, stacked, buffers, shared_attrs, batched_attrs, x_all, y_all,
            schedules, generators, transform,
        )  # fmt: skip
    num = next(iter(stacked.values())).shape[0]
    step = (vmapped_step(module), buffers, batched_attrs)
    data = (x_all, y_all, transform, generators)
    totals = (torch.zeros(num, device=x_all.device), {}, {})  # loss; logged sums, counts by name
    global_step = 0
    generator_backup = module.generator
    module.generator = None  # inside vmap, randomness comes from the global RNG
    set_client_inputs(module, shared_attrs)
    try:
        for (name, phase_params, spec), phase in zip(plans, schedules):
            module.current_phase = name  # as `start_phase` sets it sequentially
            stacked_phase(
                step, spec, phase_params, stacked, data, phase, global_step, totals, static, capture
            )
            global_step += phase[0].shape[1]
    finally:
        module.generator = generator_backup
    return stacked, *totals


def stacked_phase(step, spec, phase_params, stacked, data, phase, first, totals, static, capture):
    """One phase's steps, `stacked` updated with the trained parameters and each client's loss
    and logged values of its own steps added to `totals` ([num] each). `step`: the vmapped step,
    the buffers, the batched attributes; `data`: x_all, y_all, transform, generators."""
    step_fn, buffers, attrs = step
    x_all, y_all, transform, generators = data
    idx, valid, active, everyone = phase
    loss_sum, log_sums, log_counts = totals
    trainable = set(phase_params)
    optim = FunctionalOptimizer(spec)
    runner = None
    for t in range(idx.shape[1]):
        xb = x_all[idx[:, t]]
        if transform is not None:  # each client's augmentation from its own stream
            xb = torch.stack([transform(xb[i], g) for i, g in enumerate(generators)])
        yb = y_all[idx[:, t]].masked_fill(~valid[:, t], IGNORE_LABEL)
        train = {n: v for n, v in stacked.items() if n in trainable}
        frozen = {n: v for n, v in stacked.items() if n not in trainable}
        if static:
            if runner is None:
                runner = StaticStep(step_fn, spec, train, frozen, buffers, attrs, capture)
            loss, logged = runner(xb, yb, active[:, t], first + t)
            loss_sum += torch.where(active[:, t], loss, 0.0)
            if logged:
                fold_logged(log_sums, log_counts, logged, active[:, t], False)
            continue
        grads, (loss, logged) = step_fn(train, frozen, buffers, attrs, xb, yb, first + t)
        if everyone[t]:
            optim.step(train, grads, None)
            loss_sum += loss.detach()
        else:
            optim.step(train, grads, active[:, t])
            loss_sum += torch.where(active[:, t], loss.detach(), 0.0)
        if logged:
            fold_logged(log_sums, log_counts, logged, active[:, t], everyone[t])
        stacked.update(train)
    if runner is not None:
        stacked.update(runner.train)


def train_looped(
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
    """`train_stacked`'s `loop` form: client i's row of the stacked parameters is loaded into
    the module, trained there step by step (its `training_step`, autograd, the functional
    optimizer updating the parameters in place) and written back; then client i + 1. What it
    returns is laid out as the `vmap` form's."""
    num = next(iter(stacked.values())).shape[0]
    start, stacked = stacked, {n: torch.empty_like(t) for n, t in stacked.items()}
    own = dict(module.named_parameters())
    own_buffers = dict(module.named_buffers())
    totals = (torch.zeros(num, device=x_all.device), {}, {})
    host = [(i.cpu().numpy(), v.cpu().numpy(), a.cpu().numpy()) for i, v, a, _ in schedules]
    generator_backup = module.generator
    module.generator = None  # as in the vmap form: randomness comes from the global RNG
    requires = {n: p.requires_grad for n, p in own.items()}
    data = (x_all, y_all, transform, generators)
    set_client_inputs(module, shared_attrs)
    try:
        for i in range(num):
            set_client_inputs(module, tree_map(lambda t, i=i: t[i], batched_attrs))
            with torch.no_grad():
                for n, p in own.items():
                    p.copy_(start[n][i])
                for n, b in own_buffers.items():
                    b.copy_(buffers[n][i])
            global_step = 0
            for plan, phase in zip(plans, host):
                looped_phase(module, own, plan, data, phase, global_step, i, totals)
                global_step += phase[0].shape[1]
            with torch.no_grad():  # the trained row (the start's rows are left as they were)
                for n, t in stacked.items():
                    t[i] = own[n]
    finally:
        module.generator = generator_backup
        for n, p in own.items():
            p.requires_grad_(requires[n])
    return stacked, *totals


def looped_phase(module: ClientModule, own, plan, data, phase, first: int, i: int, totals):
    """Client i's steps of the phase `plan` in the module, updating its parameters `own` in place
    and row i of `totals` (`data`: as `stacked_phase`'s; `phase`: the schedule, on the host)."""
    name, phase_params, spec = plan
    module.current_phase = name
    for n, p in own.items():
        p.requires_grad_(n in phase_params)
    params = {n: own[n] for n in phase_params}
    optim = FunctionalOptimizer(spec)
    x_all, y_all, transform, generators = data
    idx, valid, active = phase
    loss_sum, log_sums, log_counts = totals
    capture = module.log_capture
    for t in np.flatnonzero(active[i]):
        rows = torch.as_tensor(idx[i, t][valid[i, t]], device=x_all.device)
        xb, yb = x_all[rows], y_all[rows]
        if transform is not None:
            xb = transform(xb, generators[i])
        capture.take_step()
        loss = module.training_step((xb, yb), first + int(t))
        logged = capture.take_step()
        grads = torch.autograd.grad(loss, list(params.values()), allow_unused=True)
        grads = {n: g for n, g in zip(params, grads) if g is not None}
        optim.step(dict(params), grads, None, in_place=True)
        loss_sum[i] += loss.detach()
        for key, value in logged.items():
            if key not in log_sums:
                num, device = len(loss_sum), loss_sum.device
                log_sums[key] = torch.zeros(num, device=device)
                log_counts[key] = torch.zeros(num, dtype=torch.long, device=device)
            log_sums[key][i] += value.detach().float()
            log_counts[key][i] += 1


def fold_logged(sums: dict, counts: dict, logged: dict, active: torch.Tensor, everyone: bool):
    """Add one step's logged values [num] of the active clients to the running sums."""
    for name, value in logged.items():
        value = value.detach().float()
        if name not in sums:
            sums[name] = torch.zeros_like(value)
            counts[name] = torch.zeros(value.shape, dtype=torch.long, device=value.device)
        sums[name] += value if everyone else torch.where(active, value, 0.0)
        counts[name] += active


def vmapped_step(module: ClientModule):
    """(trainable, frozen, buffers, attrs, x, y, batch_idx) -> (grads, (loss, logged)), per
    client; `logged`: what the step passed to `self.log` (batched values must leave vmap as
    outputs, so they are taken off the capture inside the step)."""
    wrapper = TrainingStep(module)
    capture = module.log_capture

    def loss_fn(trainable, frozen, buffers, attrs, x, y, batch_idx):
        set_client_inputs(module, attrs)
        state = {f"inner.{n}": t for n, t in {**trainable, **frozen, **buffers}.items()}
        capture.take_step()
        loss = functional_call(wrapper, state, ((x, y), batch_idx))
        return loss, capture.take_step()

    return vmap(
        grad_and_value(loss_fn, has_aux=True),
        in_dims=(0, 0, 0, 0, 0, 0, None),
        randomness="different",
    )
