"""Build every component from the config and validate it before any training."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import torch
from omegaconf import DictConfig, OmegaConf

from fedexp.config.build import build, default_family
from fedexp.config.pool import resolve_server_pool
from fedexp.config.validation import (
    NO_OBJECTIVE,
    check_objective_name,
    check_types,
    validate_config,
    validate_data,
)
from fedexp.config.values import CheckedValues, check_config_values
from fedexp.core.algorithm import BuildContext
from fedexp.core.callbacks import Callback
from fedexp.core.client_loop import check_local_work
from fedexp.core.client_store import ClientStore
from fedexp.core.local import ClientConfig
from fedexp.core.types import ConfigError
from fedexp.core.user_module import factory_arguments
from fedexp.data import subset
from fedexp.data.federated import FederatedData
from fedexp.data.schemes import check_client_count
from fedexp.data.server_pool import reserve_server_pool
from fedexp.engine.aggregation import check_aggregator
from fedexp.engine.eval.finetuned import check_finetune
from fedexp.engine.executors.select import cpu_workers
from fedexp.engine.orchestrator import Orchestrator
from fedexp.engine.participation import participation, size_probabilities
from fedexp.runtime.allocator import keep_freed_blocks
from fedexp.runtime.checkpoint import (
    CHECKPOINT_FILE,
    check_resumed_data,
    check_sections,
    config_hash,
    load_checkpoint,
)
from fedexp.runtime.resume import Checkpointer
from fedexp.runtime.threads import apply_threads, measures_step, step_flops

log = logging.getLogger(__name__)


def resolve_objective(name: str, algorithm, has_val: bool) -> str:
    """The metric a run returns to a sweeper; `auto`: the validation metric that fits the
    algorithm (personal mean accuracy where clients have their own models, else the global
    model's accuracy), and `none` (no objective) without validation data: never a test metric."""
    personal, has_global = algorithm.has_personal_models, algorithm.has_global_model
    if name == "auto":
        base = "personal/acc_mean" if personal else "global/acc"
        return f"eval/val/{base}" if has_val else NO_OBJECTIVE
    check_objective_name(name)
    if name == NO_OBJECTIVE:
        return name
    if name.startswith("eval/val/") and not has_val:
        raise ConfigError(
            f"objective: {name} needs a validation split; set partition.val_fraction > 0"
        )
    if "/personal/" in name and not personal:
        raise ConfigError(f"objective: {name}: this algorithm has no personal models")
    if "/global/" in name and not has_global:
        raise ConfigError(f"objective: {name}: this algorithm has no global model")
    return name


def _objective(cfg: DictConfig, algorithm, has_val: bool) -> str:
    """The run's objective resolved, and fine-tuning checked against the algorithm and it."""
    objective = resolve_objective(str(cfg.get("objective", "auto")), algorithm, has_val)
    check_finetune(finetune_epochs(cfg), algorithm, objective)
    return objective


def finetune_epochs(cfg: DictConfig) -> int:
    """`eval.finetune_epochs` (0, off, where a run dir's config predates it)."""
    return int(OmegaConf.select(cfg, "eval.finetune_epochs", default=0) or 0)


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def build_data(cfg: DictConfig, device: torch.device) -> FederatedData:
    node = OmegaConf.to_container(cfg.dataset, resolve=True)
    cap = node.pop(subset.KEY, None)  # read here, not by the loader (`fedexp.data.subset`)
    dataset = build(node, "dataset", seed=cfg.seed, num_clients=cfg.num_clients)
    dataset = subset.cap_samples(dataset, cap, cfg.seed, cfg.num_clients)
    scheme = build(cfg.partition, "partition")
    # the server's pool (`partition.server_pool`), set aside before partitioning for every
    # algorithm alike: no client ever holds it (FedHeNN draws its RAD from it)
    dataset = reserve_server_pool(dataset, scheme.server_pool, cfg.seed)
    labels = dataset.train_y.numpy()
    partition = scheme(
        labels,
        cfg.num_clients,
        cfg.seed,
        client_ids=dataset.train_client_ids,
        num_classes=dataset.num_classes,
        cache_dir=cfg.paths.cache_dir,
        cache_key={"dataset": OmegaConf.to_container(cfg.dataset, resolve=True)},
    )
    check_client_count(partition.num_clients, cfg.num_clients, cfg.clients_per_round)
    if dataset.server_x is not None:
        log.info(
            "server pool: %d training samples set aside before partitioning, held by no client "
            "(partition.server_pool)",
            len(dataset.server_x),
        )
    pooled = 0 if dataset.server_x is None else len(dataset.server_x)
    coverage = partition_coverage(dataset, partition, pooled)
    log.info(
        "partition: the clients hold %d of %d classes and %.1f%% of the %d training samples "
        "(%.1f%% in their training splits)",
        len(coverage["classes"]),
        dataset.num_classes,
        100 * coverage["held_by_clients"],
        len(labels) + pooled,
        100 * coverage["train_fraction_used"],
    )
    if coverage["missing_test_classes"] and not scheme.allow_missing_classes:
        missing = coverage["missing_test_classes"]
        shown = ", ".join(map(str, missing[:10])) + (" ..." if len(missing) > 10 else "")
        raise ConfigError(
            f"partition: {len(missing)} classes of the pooled test set are held by no client "
            f"({shown}), so global accuracy cannot exceed "
            f"{coverage['test_accuracy_ceiling']:.2f}; use more clients or classes per client, "
            "or set partition.allow_missing_classes=true"
        )
    if dataset.prepare is not None:  # e.g. a vocabulary fitted on the clients' train splits only
        dataset = dataset.prepare(dataset, partition)
    data = FederatedData(dataset, partition, device)
    data.coverage = {
        "data/classes_used": len(coverage["classes"]),
        "data/train_fraction_used": coverage["train_fraction_used"],
        "data/held_by_clients": coverage["held_by_clients"],
        "data/server_pool": pooled,
        "data/test_accuracy_ceiling": coverage["test_accuracy_ceiling"],
    }
    return data


def trained_classes(labels: np.ndarray, train: np.ndarray, chunk: int = 1 << 20) -> np.ndarray:
    """The classes (ascending) of the samples at `train`: a one-byte mask of them and the labels
    counted a chunk at a time (gathering the labels held cost eight bytes a sample at once)."""
    mask = np.zeros(len(labels), dtype=bool)
    mask[train] = True
    counts = np.zeros(int(labels.max(initial=-1)) + 1, dtype=np.int64)
    for a in range(0, len(labels), chunk):
        part = labels[a : a + chunk][mask[a : a + chunk]]
        counts += np.bincount(part, minlength=len(counts))
    return np.flatnonzero(counts)


def partition_coverage(dataset, partition, pooled: int = 0) -> dict[str, Any]:
    """Which classes the clients' local training splits hold, and how much of the training
    data they hold (`pooled`: the samples set aside for the server before partitioning).

    `train_fraction_used`: the clients' training splits over the dataset's training samples
    (the server pool included); `held_by_clients`: the same for all their local splits
    (training, validation and test); `missing_test_classes`: classes of the pooled test set
    (or, without one, of the clients' local test splits) that no client trains on;
    `test_accuracy_ceiling`: the share of the pooled test set in the classes that some client
    holds.
    """
    labels = dataset.train_y.numpy()
    held = trained_classes(labels, partition.train.flat)
    used = len(partition.train.flat)
    splits = (partition.train, partition.test, getattr(partition, "val", None))
    # the samples some client holds, counted with a mask (a set of every index held costs
    # tens of bytes a sample at once: the peak of a 100 000-client run)
    mask = np.zeros(len(labels), dtype=bool)
    for split in splits:
        if split is not None:
            mask[split.flat] = True
    local = int(np.count_nonzero(mask))
    total = max(len(labels) + pooled, 1)
    if dataset.test_y is not None:
        test_labels = dataset.test_y.numpy()
    else:
        test_labels = labels[partition.test.flat]
    in_test, counts = np.unique(test_labels, return_counts=True)
    missing = np.setdiff1d(in_test, held)
    covered = counts[np.isin(in_test, held)].sum()
    return {
        "classes": held.tolist(),
        "train_fraction_used": used / total,
        "held_by_clients": local / total,
        "missing_test_classes": missing.tolist(),
        "test_accuracy_ceiling": float(covered / max(counts.sum(), 1)),
    }


@dataclass
class Components:
    """Everything one run needs, built and checked before the first round (`build_components`).

    `callbacks` are run callbacks a script adds to the experiment; with the audits they are
    the run's own callbacks (`fedexp.run.callbacks`), and their state goes into checkpoints with
    the attack's and the executor's.
    """

    cfg: DictConfig
    run_dir: Path
    device: torch.device
    threads: int  # torch CPU threads
    client: ClientConfig  # the clients' local training settings (`client.*`)
    data: FederatedData
    store: ClientStore
    algorithm: Any
    objective: str  # the metric a sweeper is returned (`objective`, resolved)
    attack: Any
    executor: Any
    audits: list = field(default_factory=list)  # what `privacy=` builds, as built
    callbacks: list[Callback] = field(default_factory=list)
    checkpoint: dict | None = None  # the checkpoint a resumed run continues from


def _step_threads(cfg: DictConfig, device, checkpoint, step, why: str) -> tuple[int, str]:
    """torch's threads for the run, applied and logged: `threads` as set, the count a resumed
    run started with, or under auto on a CPU from the step's size (`step`: the model factory,
    the data, the client settings); one a process where `executor=auto` shards the cohort over
    processes (`cpu_workers`), each then on a core of its own."""
    setting = cfg.get("threads", "auto")
    threads = torch.get_num_threads()
    resumed = checkpoint.get("threads") if checkpoint is not None else None
    workers = 1
    if OmegaConf.select(cfg, "executor._target_", default="").endswith(".auto_executor"):
        workers = cpu_workers(
            cfg.executor.get("workers", "auto"), cfg.device, setting, cfg.clients_per_round
        )[0]
    if resumed is None and setting == "auto" and workers > 1:
        threads, why = apply_threads(1, device)
        why = f"one thread in each of {workers} processes (executor=auto)"
    elif resumed is not None or measures_step(setting, device):  # auto: from the step's size
        model_factory, data, client = step
        flops = (
            None if resumed is not None else step_flops(model_factory, data.x, client.batch_size)
        )
        threads, why = apply_threads(setting, device, flops, resumed)
    log.info("threads: %d (%s)", threads, why)
    return threads, why


def _model_factory(cfg: DictConfig, data) -> tuple[partial, dict]:
    """(the model factory, the arguments it was given) of `cfg.model` for this data."""
    factory = build(cfg.model, "model")
    # a model factory takes (input_shape, num_classes, **dataset.model_kwargs); a model
    # *family* (heterogeneous clients) also takes `arch` in range(model.num_archs)
    model_args = dict(
        input_shape=data.input_shape, num_classes=data.num_classes, **data.dataset.model_kwargs
    )
    # a LightningModule of the user's gets the arguments its __init__ names (maybe none)
    return partial(factory, **factory_arguments(factory, model_args)), model_args


def _attack(cfg: DictConfig, ctx: BuildContext, algorithm, num_clients: int):
    """`cfg.attack` built, checked against the algorithm and the cohort, and set up over the
    clients there are: fewer than num_clients where a natural split has fewer owners."""
    attack = build(cfg.attack, "attack")
    attack.check_target(algorithm)
    attack.setup(ctx, num_clients)
    attack.check_cohort(num_clients, cfg.clients_per_round, size_probabilities(cfg, ctx.data))
    return attack


def _executor(cfg: DictConfig, algorithm, num_clients: int):
    """`cfg.executor` built; what it cannot train is refused before training (a drawn local
    work, `client.local_work`, needs modules of one phase on every executor)."""
    check_local_work(algorithm, num_clients)
    executor = build(cfg.executor, "executor")
    check_executor = getattr(executor, "check_algorithm", None)
    if check_executor is not None:
        check_executor(algorithm, num_clients)
    return executor


def validate(cfg: DictConfig, checked: CheckedValues | None = None) -> ClientConfig:
    """Every check of the config that needs no data, each once; returns the run's client
    settings, the one typed route of `client.*` to the algorithm, its modules, the executor and
    the audits. `checked`: what `check_config_values(cfg)` returned where it ran already
    (`python -m fedexp` runs it before importing torch); None: it runs here, first."""
    if checked is None:
        checked = check_config_values(cfg)  # the values, the client settings among them
    resolve_server_pool(cfg)  # `auto`: the pool the algorithm reads, none if it reads none
    check_types(cfg)  # every component's keys and option types, the run's scalars' relations
    validate_config(cfg)  # the run's rules and the checks the components declare
    return checked.client


def build_components(
    cfg: DictConfig,
    run_dir: str | Path,
    resume: bool = False,
    *,
    checked: CheckedValues | None = None,
) -> Components:
    """`validate` `cfg`, then build every component; with `resume=True` the run dir's
    checkpoint is loaded and checked first (a bad one: a ConfigError before any is built)."""
    client = validate(cfg, checked)
    run_dir = Path(run_dir)
    device = resolve_device(cfg.device)
    setting = cfg.get("threads", "auto")
    log.info("memory: %s", keep_freed_blocks(cfg.get("malloc_keep", True)))
    # the data is built with one thread under auto (its numbers must not depend on the load)
    threads, why = apply_threads(setting, device)
    checkpoint = None
    if resume:  # the file, its checksum, its config hash and its sections, before the data
        checkpoint = load_checkpoint(run_dir / CHECKPOINT_FILE, config_hash(cfg), device)
        check_sections(checkpoint, run_dir / CHECKPOINT_FILE)
    torch.manual_seed(cfg.seed)
    data = build_data(cfg, device)
    check_resumed_data(checkpoint, data)  # the same data as the checkpoint's
    validate_data(cfg, data)  # checks that need data facts (input shape, classes)
    model_factory, model_args = _model_factory(cfg, data)
    threads, why = _step_threads(cfg, device, checkpoint, (model_factory, data, client), why)
    store = ClientStore(**OmegaConf.to_container(cfg.get("client_store") or {}))
    ctx = BuildContext(
        model_factory=model_factory,
        client=client,
        aggregator=build(cfg.aggregator, "aggregator"),
        data=data,
        device=device,
        seed=cfg.seed,
        store=store,
        model_args=model_args,
        family=partial(default_family, data_args=model_args),
    )
    algorithm = build(cfg.algorithm, "algorithm", ctx=ctx)
    check_aggregator(ctx.aggregator, algorithm)
    objective = _objective(cfg, algorithm, data.has_val)
    attack = _attack(cfg, ctx, algorithm, data.num_clients)
    executor = _executor(cfg, algorithm, data.num_clients)
    # audits watch the run at its evaluations (privacy=mia, ...)
    audits = [build(cfg.privacy, "privacy", ctx=ctx)] if cfg.get("privacy") else []
    c = Components(
        cfg, run_dir, device, threads, client, data, store, algorithm, objective, attack, executor,
        audits=audits,
        checkpoint=checkpoint,
    )  # fmt: skip
    if checkpoint is not None:  # the whole restore, tried before any file of the run is touched
        checker = Checkpointer(run_dir, 0, cfg, store, data, saved_components(c))
        checker.check_restorable(checkpoint, algorithm)
    return c


def saved_components(c: Components) -> dict[str, Any]:
    """The components whose `state_dict` a checkpoint holds, by their key in it."""
    components = {"attack": c.attack, "executor": c.executor}
    # an audit's state is its adapter's (`AuditCallback`), under the adapter's key
    own = [*c.audits, *c.callbacks]
    components.update({f"callback{i}": obj for i, obj in enumerate(own)})
    return components


def make_orchestrator(c: Components, algorithm=None, callbacks=()) -> Orchestrator:
    """The round loop over the components (another `algorithm` may stand in for theirs)."""
    cfg = c.cfg
    return Orchestrator(
        algorithm or c.algorithm,
        c.executor,
        c.data,
        c.attack,
        seed=cfg.seed,
        rounds=cfg.rounds,
        clients_per_round=cfg.clients_per_round,
        eval_every=cfg.eval_every,
        callbacks=callbacks,
        personal_clients=OmegaConf.select(cfg, "eval.personal_clients", default=None),
        finetune_epochs=finetune_epochs(cfg),
        participation=participation(cfg, c.data),
    )
