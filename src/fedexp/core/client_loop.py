"""One client's local round, the only client path of every executor: begin -> train -> end.

The sequential executor, distributed ranks, centralised training and the membership-inference
audit train a client through `run_client`, a cohort of one, in this order:

1. seed torch's global RNG from (seed, round, client id); get the client's module
   (`algorithm.client_module`), give it its generator and data;
2. `algorithm.begin` returns the cohort's start (`CohortStart`, one row); `load_start` puts it
   into the module;
3. `train_local` runs the module's phases (`training_step`, one optimizer per phase);
4. `algorithm.end` receives the trained parameters (`module_rows`, one row) and what the training
   did, and returns the upload; `algorithm.client_stats` the running statistics sent beside it.

The vectorized executor calls the same `begin` and `end` once for a whole group of clients and
trains the group in between (`fedexp.engine.executors.batched_round`). What differs between
clients during training lives in the attributes the module names in `per_client_state` (tensors,
lists/dicts of tensors, numbers), given by `begin` in `CohortStart.attrs`; every other attribute
is the same for every client of the cohort (`CohortStart.shared`). `training_step` is a pure
function of the module's parameters, buffers and those attributes.

Training that must leave the run as it was (the attackers' pool trained aside, the
membership-inference audit's targets and shadows) runs inside `no_trace`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager

import torch
from torch.utils._pytree import tree_map

from fedexp.core.algorithm import Algorithm
from fedexp.core.client import ClientModule
from fedexp.core.cohort import CohortStart, CohortTraining, RoundResults
from fedexp.core.flat import load_flat
from fedexp.core.local import LocalTraining, PhaseTraining, optimizer_lrs
from fedexp.core.seeding import client_seeds, rng_devices, seed_global_rng
from fedexp.core.types import ConfigError, Message


def train_local(
    module: ClientModule,
    x: torch.Tensor,
    y: torch.Tensor,
    batch_size: int,
    generator: torch.Generator,
    batch_transform=None,
    budget: tuple[int, int | None] | None = None,
) -> LocalTraining:
    """Drive the module's `training_step` over its phases; returns what the training did.

    The mean loss stays a tensor so a round costs one host sync, not one per client.
    `batch_transform(x_batch, generator)` is the dataset's training augmentation, if any.
    What the steps `log` is folded into `module.log_capture` (its means: `ClientResult.logged`).
    `budget`: (epochs, step cap or None) of the module's one phase in place of its own epochs
    (`ClientConfig.budget`, a drawn local work); None: the phases as the module gives them.
    """
    if not (module.training and module.model.training):  # a full .train() walks every module
        module.train()
    n = len(y)
    total = torch.zeros((), device=x.device)
    steps = 0
    phases = []
    capture = module.log_capture
    capture.reset()
    for phase in work_phases(module, budget):
        module.start_phase(phase)
        optimizer = module.configure_optimizers()
        first = steps
        cap = budget[1] if budget is not None and budget[1] is not None else -1
        for _epoch in range(phase.epochs):
            order = torch.randperm(n, generator=generator).to(x.device)
            for start in range(0, n, batch_size):
                if steps - first == cap:  # a drawn step budget: the pass is cut off here
                    break
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


def work_phases(module: ClientModule, budget: tuple[int, int | None] | None) -> list:
    """The module's phases, or, with a drawn local work `budget` (epochs, step cap), its one
    phase taking the budget's epochs (the run's checks allow a drawn work only for modules of
    one phase: `check_local_work`)."""
    phases = module.phases()
    if budget is None:
        return phases
    (phase,) = phases
    return [dataclasses.replace(phase, epochs=budget[0])]


def check_local_work(algorithm: Algorithm, num_clients: int) -> None:
    """A ConfigError before any training where `client.local_work` draws each client's work
    and a client module trains other than one phase `all` of `client.local_epochs` (FedRep's head
    and body, Ditto's two models, FRL's per-epoch schedule, centralised training)."""
    client = algorithm.ctx.client
    if not client.varies:
        return
    seen: set[int] = set()
    for cid in range(num_clients):
        module = algorithm.client_module(cid)
        if id(module) in seen:
            continue
        seen.add(id(module))
        phases = module.phases()
        one = len(phases) == 1 and phases[0].name == "all"
        if not one or phases[0].epochs != client.local_epochs:
            names = [f"{p.name} ({p.epochs} epochs)" for p in phases] or ["none"]
            raise ConfigError(
                f"client.local_work: {type(algorithm).__name__} trains phases of its own "
                f"({', '.join(names)}); a drawn local work needs one phase of "
                "client.local_epochs: use client.local_work=fixed"
            )


def client_streams(seed: int, round_idx: int, client_id: int) -> tuple[int, torch.Generator]:
    """(seed of torch's global RNG, the client's own generator) of a client in a round: any use
    of the global RNG (dropout, sampling) is also a function of (seed, round, id)."""
    own, global_seed = client_seeds(seed, round_idx, client_id)
    return global_seed, torch.Generator().manual_seed(own)


def load_start(module: ClientModule, start: CohortStart, row: int = 0) -> None:
    """Put client `row` of a cohort's start into the module: its parameters and buffers (a
    tensor that already is the module's own is left alone), the shared attributes and its
    per-client inputs."""
    given = {**start.shared, **start.attrs}
    missing = [n for n in type(module).per_client_state if n not in given]
    if missing:
        raise ConfigError(
            f"executor: {type(module).__name__} declares per-client state {missing} that its "
            "algorithm's begin does not give"
        )
    loaded = set()
    for tensors, flat in start.flat:
        load_flat(tensors, flat if flat.dim() == 1 else flat[row])
        loaded.update(id(t) for t in tensors)
    load_row(module, start.params, row, skip=loaded)
    set_client_inputs(module, start.shared)
    set_client_inputs(
        module, {k: tree_map(lambda t: _row(t, row), v) for k, v in start.attrs.items()}
    )


def set_client_inputs(module: ClientModule, values) -> None:
    """Give the module the inputs its `training_step` reads besides its parameters: the cohort's
    shared attributes, or one client's `per_client_state` (plain attributes, written into the
    instance: no parameter, buffer or submodule is replaced, and no registration check runs)."""
    for name, value in values.items():
        object.__setattr__(module, name, value)


def set_round(module: ClientModule, round_idx: int) -> None:
    """Tell the module the round it trains (`ClientModule.round_idx`, 1-based): its optimizer's
    lr is that round's (`client.lr_schedule`). Every executor calls it with the client's inputs."""
    object.__setattr__(module, "round_idx", int(round_idx))


@torch.no_grad()
def load_row(module: ClientModule, params, row: int, skip=frozenset()) -> None:
    """Client `row` of stacked `params` (name -> [C, ...]) into the module's parameters and
    buffers (a row that already is the module's own tensor, as for a cohort of one, and the
    tensors whose ids are in `skip`, are left alone)."""
    for name, tensor in module_tensors(module):
        if id(tensor) in skip:
            continue
        source = params[name][row]
        if not _same(source, tensor):
            tensor.copy_(source)


def _row(value, row: int):
    return value[row] if isinstance(value, torch.Tensor) else value


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.data_ptr() == b.data_ptr() and a.shape == b.shape and a.stride() == b.stride()


def module_tensors(module: ClientModule) -> tuple[tuple[str, torch.Tensor], ...]:
    """The module's parameters, then its buffers, by name."""
    return module.named_tensors()


def module_rows(module: ClientModule) -> Mapping[str, torch.Tensor]:
    """The module's parameters and buffers as a cohort of one: views [1, ...] (no copy), each
    made when it is read (an `end` reads few of them)."""
    return _ModuleRows(module)


class _ModuleRows(Mapping):
    def __init__(self, module: ClientModule):
        self._tensors = dict(module_tensors(module))

    def __getitem__(self, name: str) -> torch.Tensor:
        return self._tensors[name].detach().unsqueeze(0)

    def __iter__(self):
        return iter(self._tensors)

    def __len__(self) -> int:
        return len(self._tensors)


def training_facts(
    client_id: int, training: LocalTraining, x: torch.Tensor, y: torch.Tensor
) -> CohortTraining:
    """`train_local`'s facts for a cohort of one."""
    lrs = tuple(lr for phase in training.phases for lr in phase.lrs)
    loss = training.mean_loss.reshape(1)
    return CohortTraining(
        [client_id], [training.samples], [training.steps], loss, lrs, [(x, y)], [training.phases]
    )


def run_client(
    algorithm: Algorithm,
    client_id: int,
    payload: Message,
    stats: torch.Tensor | None,
    x: torch.Tensor,
    y: torch.Tensor,
    global_seed: int,
    generator: torch.Generator,
    batch_transform=None,
    *,
    round_idx: int,
    work: int | None = None,
) -> RoundResults:
    """One client's whole local round `round_idx` on (x, y), a cohort of one: `begin`,
    `train_local` with the algorithm's client settings at the round's lr, `end`. `stats`: the
    running statistics broadcast beside the payload (`Algorithm.broadcast_stats`); `work`: the
    epochs or steps the client drew (`ClientConfig.work`), None: the module's own phases."""
    seed_global_rng(global_seed, algorithm.device)
    module = algorithm.client_module(client_id)
    module.generator = generator
    module.set_local_data((x, y))
    load_start(module, algorithm.begin(module, [client_id], [payload], stats))
    set_round(module, round_idx)
    client = algorithm.ctx.client
    budget = client.budget(work, len(y))
    trained = train_local(module, x, y, client.batch_size, generator, batch_transform, budget)
    training = training_facts(client_id, trained, x, y)
    params = module_rows(module)
    upload = algorithm.end(module, [payload], params, training)
    means = module.log_capture.means()
    logged = {k: v.reshape(1) for k, v in means.items()}
    counts = {k: torch.ones(1, device=v.device) for k, v in means.items()}
    return RoundResults(training, upload, logged, counts, algorithm.client_stats(module, params))


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
