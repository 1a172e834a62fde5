"""executor=vectorized: the round's clients that share an architecture train at once (torch.func).

On a CPU, `executor.stack=auto` trains a chunk's stacked clients one after another (`stacked`'s
loop form, the module trained as the sequential executor trains it). The rules below are the vmap
form's: what a module must meet to run on a GPU (`check_algorithm` applies them in both forms).

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
from typing import Any

import torch

from fedexp.core.algorithm import Algorithm
from fedexp.core.client import ClientModule
from fedexp.core.client_loop import begin_client, client_streams, finish_client
from fedexp.core.local import LocalTraining, PhaseTraining, optimizer_lrs
from fedexp.core.seeding import CLIENT, derive_seed, seed_global_rng
from fedexp.core.types import ClientResult, ConfigError, Message, RoundContext
from fedexp.engine.executors.batched_round import run_cohort
from fedexp.engine.executors.stacked import (
    check_vmappable,
    schedule,
    train_stacked,
)
from fedexp.engine.functional_optim import spec_from_optimizer
from fedexp.engine.stacking import architecture, client_attrs, split_attrs


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


def stack_form(stack: str, cuda: bool, static_shapes: bool) -> str:
    """`executor.stack`'s form: auto is vmap on CUDA (a round's time there is the host's
    launches) or with static shapes (what a CUDA graph replays), loop on a CPU (a batched kernel
    saves nothing there and its stacked activations leave the cache)."""
    if stack != "auto":
        return stack
    return "vmap" if cuda or static_shapes else "loop"


class VectorizedExecutor:
    """Trains each architecture group of the cohort at once with `torch.func`.

    The local batch size and optimizer are the algorithm's `ClientConfig`.

    Args:
        chunk_size: at most this many clients per vmapped call (bounds GPU memory); None: all.
        stack: how a chunk trains (`stacked`): "vmap" (one vmapped step for all its clients),
            "loop" (one client after another on the same stacked state), "auto" (vmap on CUDA
            or with static shapes, loop on a CPU).
    """

    def __init__(
        self,
        chunk_size: int | None,
        static_shapes: bool,
        cuda_graphs: bool,
        device: str,
        stack: str,
    ):
        if chunk_size is not None and chunk_size < 1:
            raise ConfigError(f"executor.chunk_size: must be >= 1 or null, got {chunk_size}")
        for key, value in (("static_shapes", static_shapes), ("cuda_graphs", cuda_graphs)):
            if not isinstance(value, bool):
                raise ConfigError(f"executor.{key}: must be true or false, got {value!r}")
        if stack not in ("auto", "vmap", "loop"):
            raise ConfigError(f"executor.stack: must be auto, vmap or loop, got {stack!r}")
        cuda = device == "cuda" or (device == "auto" and torch.cuda.is_available())
        if cuda_graphs and not cuda:
            raise ConfigError("executor.cuda_graphs: needs training on CUDA (device=cuda)")
        if stack == "loop" and (static_shapes or cuda_graphs):
            raise ConfigError("executor.static_shapes / cuda_graphs: need executor.stack=vmap")
        self.chunk_size = chunk_size
        self.static_shapes = static_shapes or cuda_graphs
        self.cuda_graphs = cuda_graphs
        self.stack = stack_form(stack, cuda, self.static_shapes)
        self.cohort_size = 0  # static shapes: the largest cohort so far (chunks pad to it)

    def check_algorithm(self, algorithm: Algorithm, num_clients: int) -> None:
        """Raise ConfigError before any training when a client module cannot be vmapped, or the
        algorithm says it cannot be vectorized (`Algorithm.vectorizable`)."""
        seen: set[int] = set()
        for cid in range(num_clients):
            module = algorithm.client_module(cid)
            if id(module) not in seen:
                seen.add(id(module))
                check_vmappable(module)
        if not algorithm.vectorizable:
            raise ConfigError(
                f"executor: {type(algorithm).__name__} cannot be vectorized with this model; use "
                "executor=sequential"
            )

    def run(
        self, algorithm: Algorithm, payloads: Mapping[int, Message], ctx: RoundContext, data
    ) -> Sequence[ClientResult]:
        batch_size = algorithm.ctx.client.batch_size
        pad_to = None
        if self.static_shapes:  # every chunk of every round padded to one size
            self.cohort_size = max(self.cohort_size, len(ctx.client_ids))
            pad_to = min(self.chunk_size or self.cohort_size, self.cohort_size)
        cohort = run_cohort(
            algorithm, payloads, ctx, data, batch_size, self.chunk_size, pad_to,
            self.cuda_graphs, loop=self.stack == "loop",
        )  # fmt: skip
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
        check_vmappable(module)
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
            schedule([[o.numpy() for o in r.phases[k].orders] for r in runs], sizes, batch_size).to(
                device
            )
            for k in range(len(runs[0].phases))
        ]
        plans = [
            (p.name, p.param_names, runs[0].optim_specs[k]) for k, p in enumerate(runs[0].phases)
        ]
        transform = getattr(data, "batch_transform", None)
        generators = [r.generator for r in runs]
        stacked, loss_sum, log_sums, log_counts = train_stacked(
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
            loop=self.stack == "loop",
        )
        out = {}
        for i, r in enumerate(runs):
            params = {n: stacked[n][i] for n in param_names}
            logged = {k: log_sums[k][i] / log_counts[k][i] for k in log_sums if log_counts[k][i]}
            total = sum(p.steps for p in r.phases)
            loss = loss_sum[i] / max(total, 1)
            out[r.client_id] = (params, loss, total, logged)
        return out
