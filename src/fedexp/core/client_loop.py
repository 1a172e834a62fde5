"""One client's local round, the only client path: begin -> train -> finish.

Every executor (sequential, vectorized, distributed), centralised training and the
membership-inference audit train a client through these functions, in this order:

1. `begin_client`: seed torch's global RNG from (seed, round, client id), get the client's module
   (`algorithm.client_module`), give it its generator and data, call `algorithm.client_begin`.
2. training: `train_local` runs the module's phases (`training_step`, one optimizer per phase),
   or the vectorized executor runs the same steps for a whole cohort at once.
3. `finish_client`: `algorithm.client_end` with what the training did; a `ClientResult`.

Training that must leave the run as it was (the attackers' pool trained aside, the
membership-inference audit's targets and shadows) runs inside `no_trace`.

The per-client state rules the vectorized executor relies on (it runs every `begin_client` of a
cohort before training and every `finish_client` after):

- `client_begin` and `client_end` talk through the module and the client store only.
- What differs between clients during training lives in the attributes the algorithm's client
  module names in `per_client_state` (tensors, lists/dicts of tensors, numbers): they are stacked
  across the cohort and set back one slice per client inside vmap. Every other attribute is the
  same for every client of the round.
- `client_begin` assigns new tensors rather than writing into ones it gave another client.
- `training_step` is a pure function of the module's parameters, buffers and those attributes.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import torch
from torch.utils._pytree import tree_map

from fedexp.core.algorithm import Algorithm
from fedexp.core.client import ClientModule
from fedexp.core.local import LocalTraining, PhaseTraining, optimizer_lrs
from fedexp.core.seeding import client_seeds, rng_devices, seed_global_rng
from fedexp.core.types import ClientResult, Message


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
    own, global_seed = client_seeds(seed, round_idx, client_id)
    return global_seed, torch.Generator().manual_seed(own)


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


def _copy_state(client_state):
    """A copy of a client's stored state (tensors cloned: training may write into them)."""
    return tree_map(lambda t: t.clone() if isinstance(t, torch.Tensor) else t, client_state)


@contextmanager
def no_trace(algorithm: Algorithm, client_ids: Sequence[int]) -> Iterator[None]:
    """Train `client_ids` inside, and the run goes on as if they had not trained: on leaving,
    their entries in the client store are put back as they were (those they did not have are
    deleted) and torch's global RNG (the CPU's and the algorithm's device's) is where it stood.

    Only those entries are read, so a spilling store keeps its memory budget. Training inside
    must touch no other client's entry and nothing else of the run (the server state it starts
    from is the caller's to leave alone)."""
    store = algorithm.store
    ids = list(dict.fromkeys(int(c) for c in client_ids))
    saved = {cid: _copy_state(store.get(cid)) for cid in ids if cid in store}
    try:
        with torch.random.fork_rng(devices=rng_devices(torch.device(algorithm.device))):
            yield
    finally:
        for cid in ids:
            if cid in saved:
                store.put(cid, saved[cid])
            else:
                store.delete(cid)
