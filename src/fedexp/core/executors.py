"""Executors: run local training for a round's cohort. The plain loop is the hot path."""

from __future__ import annotations

import copy
import logging
from collections.abc import Mapping, Sequence

import torch

from fedexp.core.algorithm import Algorithm
from fedexp.core.client import ClientModule
from fedexp.core.local import LocalTraining, PhaseTraining, optimizer_lrs
from fedexp.core.seeding import CLIENT, client_generator, derive_seed, seed_global_rng
from fedexp.core.types import ClientResult, ConfigError, Message, RoundContext, ServerState

log = logging.getLogger(__name__)


def train_local(
    module: ClientModule,
    x: torch.Tensor,
    y: torch.Tensor,
    batch_size: int,
    generator: torch.Generator,
    batch_transform=None,
) -> LocalTraining:
    """Drive the module's `training_step` over its phases; returns what the training did.

    The mean loss stays a tensor so a round costs one host sync, not one per client.
    `batch_transform(x_batch, generator)` is the dataset's training augmentation, if any.
    What the steps `log` is folded into `module.log_capture` (its means: `ClientResult.logged`).
    """
    if not (module.training and module.model.training):  # a full .train() walks every module
        module.train()
    n = len(y)
    total = torch.zeros((), device=x.device)
    steps = 0
    phases = []
    capture = module.log_capture
    capture.reset()
    for phase in module.phases():
        module.start_phase(phase)
        optimizer = module.configure_optimizers()
        first = steps
        for _epoch in range(phase.epochs):
            order = torch.randperm(n, generator=generator).to(x.device)
            for start in range(0, n, batch_size):
                idx = order[start : start + batch_size]
                xb = x[idx] if batch_transform is None else batch_transform(x[idx], generator)
                loss = module.training_step((xb, y[idx]), steps)
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                optimizer.step()
                total += loss.detach()
                capture.end_step()
                steps += 1
        phases.append(
            PhaseTraining(phase.name, phase.epochs, steps - first, optimizer_lrs(optimizer))
        )
    return LocalTraining(steps, n, total / max(steps, 1), tuple(phases))


def client_streams(seed: int, round_idx: int, client_id: int) -> tuple[int, torch.Generator]:
    """(seed of torch's global RNG, the client's own generator) of a client in a round: any use
    of the global RNG (dropout, sampling) is also a function of (seed, round, id)."""
    global_seed = derive_seed(seed, CLIENT, round_idx, client_id, 1)
    return global_seed, client_generator(seed, round_idx, client_id)


def begin_client(
    algorithm: Algorithm,
    client_id: int,
    payload: Message,
    global_seed: int,
    generator: torch.Generator,
    data: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> ClientModule:
    """The first half of every client's local training, in this order: seed torch's global RNG,
    get the client's module, give it its generator and its training `data` (x, y),
    `client_begin`. Returns the module, ready to train."""
    seed_global_rng(global_seed, algorithm.device)
    module = algorithm.client_module(client_id)
    module.generator = generator
    module.set_local_data(data)
    algorithm.client_begin(module, client_id, payload)
    return module


def finish_client(
    algorithm: Algorithm,
    module: ClientModule,
    client_id: int,
    payload: Message,
    training: LocalTraining,
    logged: dict[str, torch.Tensor] | None = None,
) -> ClientResult:
    """The second half: `client_end` with what the training did; returns the client's result.

    `logged`: the means of what the steps logged (`self.log`); None reads them from the module's
    log capture (the sequential loop's steps fill it; the vectorized executor passes its own)."""
    upload = algorithm.client_end(module, client_id, payload, training)
    if logged is None:
        logged = module.log_capture.means()
    return ClientResult(
        client_id,
        training.samples,
        upload,
        training.mean_loss,
        training.steps,
        logged=logged,
        stats=algorithm.client_stats(module),
    )


def run_client(
    algorithm: Algorithm,
    client_id: int,
    payload: Message,
    x: torch.Tensor,
    y: torch.Tensor,
    global_seed: int,
    generator: torch.Generator,
    batch_transform=None,
) -> ClientResult:
    """One client's whole local round on (x, y): `begin_client`, `train_local` with the
    algorithm's client settings, `finish_client`."""
    module = begin_client(algorithm, client_id, payload, global_seed, generator, (x, y))
    batch_size = algorithm.ctx.client.batch_size
    training = train_local(module, x, y, batch_size, module.generator, batch_transform)
    return finish_client(algorithm, module, client_id, payload, training)


class SequentialExecutor:
    """One client after another on one resident model per architecture; the local batch size
    and optimizer are the algorithm's `ClientConfig`."""

    def run(
        self, algorithm: Algorithm, payloads: Mapping[int, Message], ctx: RoundContext, data
    ) -> list[ClientResult]:
        results = []
        for cid in ctx.client_ids:
            global_seed, generator = client_streams(ctx.seed, ctx.round, cid)
            x, y = data.train(cid)
            result = run_client(
                algorithm, cid, payloads[cid], x, y, global_seed, generator, data.batch_transform
            )
            results.append(result)
        return results


def train_aside(
    algorithm: Algorithm,
    executor,
    data,
    state: ServerState,
    round_idx: int,
    seed: int,
    client_ids: Sequence[int],
) -> list[ClientResult]:
    """Benign local training of `client_ids` in round `round_idx`, outside the round's cohort.

    The clients get what `configure_round` would send them and train through `executor` on
    their usual streams (seed, round, client id), exactly as if they had been sampled; then
    everything the training touched is put back: torch's global RNG (CPU and the algorithm's
    device) and the clients' entries in the client store. The round's cohort and every later
    round therefore train as they would without this call. Model-poisoning attackers use it to
    learn benign updates of attackers that were not sampled (FRL's reference code).
    """
    ids = tuple(int(c) for c in client_ids)
    if not ids:
        return []
    ctx = RoundContext(round_idx, ids, seed)
    store = algorithm.store
    saved = {cid: copy.deepcopy(store.get(cid)) for cid in ids if cid in store}
    device = torch.device(algorithm.device)
    devices = [device] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices):
        results = executor.run(algorithm, algorithm.configure_round(state, ctx), ctx, data)
    for cid in ids:
        if cid in saved:
            store.put(cid, saved[cid])
        else:
            store.delete(cid)
    return results


def executor_named(
    name: str,
    device: str = "auto",
    chunk_size: int | None = None,
    key: str = "executor",
):
    """The executor `name` (auto | sequential | vectorized); auto: vectorized on CUDA only.

    On 2-core CPUs a vmapped cohort measured 0.3-1.3x the sequential loop, so it does not pay.
    """
    if name == "auto":
        cuda = device == "cuda" or (device == "auto" and torch.cuda.is_available())
        name = "vectorized" if cuda else "sequential"
    if name == "sequential":
        return SequentialExecutor()
    if name == "vectorized":
        from fedexp.core.vectorized import VectorizedExecutor

        return VectorizedExecutor(chunk_size)
    raise ConfigError(f"{key}: must be auto, sequential or vectorized, got {name!r}")


class AutoExecutor:
    """executor=auto: vectorized when training runs on CUDA, sequential on the CPU, and
    sequential too where the vectorized executor refuses the algorithm's modules (BatchNorm
    running statistics, an optimizer it has no functional form of): decided before training,
    and logged."""

    def __init__(self, device: str, chunk_size: int | None):
        self.inner = executor_named("auto", device, chunk_size)

    def check_algorithm(self, algorithm: Algorithm, num_clients: int) -> None:
        check = getattr(self.inner, "check_algorithm", None)
        if check is None:
            return
        try:
            check(algorithm, num_clients)
        except ConfigError as err:
            log.info("executor=auto: sequential (%s)", err)
            self.inner = SequentialExecutor()

    def run(
        self, algorithm: Algorithm, payloads: Mapping[int, Message], ctx: RoundContext, data
    ) -> list[ClientResult]:
        return self.inner.run(algorithm, payloads, ctx, data)


def auto_executor(device: str, chunk_size: int | None) -> AutoExecutor:
    """executor=auto: vectorized when training runs on CUDA, sequential on the CPU."""
    return AutoExecutor(device, chunk_size)
