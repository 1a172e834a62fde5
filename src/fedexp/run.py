"""Build every component from the config, validate before any training, run, and summarise."""

from __future__ import annotations

import logging
import signal
import time
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import torch
from hydra.utils import get_object
from omegaconf import DictConfig, OmegaConf

from fedexp.core.aggregation import check_aggregator
from fedexp.core.algorithm import Algorithm, BuildContext
from fedexp.core.checkpoint import (
    CHECKPOINT_FILE,
    Checkpointer,
    Interrupted,
    check_resumed_data,
    config_hash,
    load_checkpoint,
    restore_logger,
    truncate_metric_logs,
)
from fedexp.core.client import OPTIMIZERS
from fedexp.core.client_store import ClientStore
from fedexp.core.config import build
from fedexp.core.local import ClientConfig
from fedexp.core.orchestrator import Orchestrator
from fedexp.core.threads import apply_threads
from fedexp.core.types import ConfigError, Diverged
from fedexp.core.user_module import factory_arguments
from fedexp.core.validation import check_objective_name, target, validate_config, validate_data
from fedexp.data.federated import FederatedData
from fedexp.data.partition import class_counts
from fedexp.data.partition_report import plot_label_distribution
from fedexp.data.server_pool import ServerDataRequest, reserve_server_pool
from fedexp.loggers.files import RunRecorder

log = logging.getLogger(__name__)


def validate(cfg: DictConfig) -> None:
    """Checks that need no data: types and ranges first (`check_types`: the run scalars, and
    every component's options against its target's annotations), then the relations between
    scalars; each failure is one line naming the key."""
    from fedexp.core.validation import check_types

    check_types(cfg)
    checks = [
        (
            cfg.clients_per_round <= cfg.num_clients,
            "clients_per_round",
            f"must be in [1, num_clients={cfg.num_clients}], got {cfg.clients_per_round}",
        ),
        (
            cfg.client.optimizer in OPTIMIZERS,
            "client.optimizer",
            f"must be one of {sorted(OPTIMIZERS)}, got {cfg.client.optimizer!r}",
        ),
        (
            0 <= cfg.partition.test_fraction < 1,
            "partition.test_fraction",
            "must be in [0, 1)",
        ),
        (
            0 <= cfg.partition.val_fraction < 1,
            "partition.val_fraction",
            "must be in [0, 1)",
        ),
        (
            cfg.partition.test_fraction + cfg.partition.val_fraction < 1,
            "partition.val_fraction",
            "test_fraction + val_fraction must be < 1 (clients need training data)",
        ),
        (
            cfg.device in ("auto", "cpu", "cuda"),
            "device",
            f"must be auto, cpu or cuda, got {cfg.device!r}",
        ),
    ]
    for ok, key, problem in checks:
        if not ok:
            raise ConfigError(f"{key}: {problem}")
    if cfg.device == "cuda" and not torch.cuda.is_available():
        raise ConfigError("device: cuda requested but no CUDA device is available")


def resolve_objective(name: str, algorithm, has_val: bool) -> str:
    """The metric a run returns to a sweeper; `auto`: the validation metric that fits the
    algorithm (personal mean accuracy where clients have their own models, else the global
    model's accuracy), or its test counterpart when `partition.val_fraction=0`."""
    personal = type(algorithm).personal_model is not Algorithm.personal_model
    has_global = getattr(algorithm, "has_global_model", True) and (
        type(algorithm).global_model is not Algorithm.global_model
    )
    if name == "auto":
        base = "personal/acc_mean" if personal else "global/acc"
        return f"eval/val/{base}" if has_val else f"eval/{base}"
    check_objective_name(name)
    if name.startswith("eval/val/") and not has_val:
        raise ConfigError(
            f"objective: {name} needs a validation split; set partition.val_fraction > 0"
        )
    if "/personal/" in name and not personal:
        raise ConfigError(f"objective: {name}: this algorithm has no personal models")
    if "/global/" in name and not has_global:
        raise ConfigError(f"objective: {name}: this algorithm has no global model")
    return name


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def server_data_request(cfg: DictConfig) -> ServerDataRequest | None:
    """The server data declared by `cfg.algorithm`'s target (`server_data(cfg)`), or None."""
    declare = getattr(target(cfg, "algorithm"), "server_data", None)
    return declare(cfg) if callable(declare) else None


def build_data(cfg: DictConfig, device: torch.device) -> FederatedData:
    dataset = build(cfg.dataset, "dataset", seed=cfg.seed, num_clients=cfg.num_clients)
    # data an algorithm needs on the server (FedHeNN's rad_source=holdout pool), declared by it
    request = server_data_request(cfg)
    if request is not None:
        dataset = reserve_server_pool(dataset, request.size, cfg.seed, request.key)
    scheme = build(cfg.partition, "partition")
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
    coverage = partition_coverage(dataset, partition)
    log.info(
        "partition: the clients hold %d of %d classes and %.1f%% of the %d training samples",
        len(coverage["classes"]),
        dataset.num_classes,
        100 * coverage["train_fraction_used"],
        len(labels),
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
    }
    return data


def partition_coverage(dataset, partition) -> dict[str, Any]:
    """Which classes the clients' local training splits hold, and how much of the pool is used.

    `missing_test_classes`: classes of the pooled test set (or, without one, of the clients'
    local test splits) that no client trains on; `test_accuracy_ceiling`: the share of the
    pooled test set in the classes that some client holds.
    """
    labels = dataset.train_y.numpy()
    held = np.unique(np.concatenate([labels[t] for t in partition.train]))
    used = sum(len(t) for t in partition.train)
    if dataset.test_y is not None:
        test_labels = dataset.test_y.numpy()
    else:
        test_labels = labels[np.concatenate(partition.test)] if partition.test else labels[:0]
    in_test, counts = np.unique(test_labels, return_counts=True)
    missing = np.setdiff1d(in_test, held)
    covered = counts[np.isin(in_test, held)].sum()
    return {
        "classes": held.tolist(),
        "train_fraction_used": used / max(len(labels), 1),
        "missing_test_classes": missing.tolist(),
        "test_accuracy_ceiling": float(covered / max(counts.sum(), 1)),
    }


class Experiment:
    """Everything one run needs, built and checked before the first round.

    With `resume=True` the run dir's checkpoint is loaded and checked here (a bad one is a
    ConfigError before anything is built) and `run` continues from it.
    """

    def __init__(self, cfg: DictConfig, run_dir: str | Path, resume: bool = False):
        validate(cfg)
        validate_config(cfg)  # cross-component checks declared by the components themselves
        self.cfg = cfg
        # the one typed route of `client.*` to the algorithm, its modules, executor and audits
        self.client = ClientConfig.from_mapping(OmegaConf.to_container(cfg.client, resolve=True))
        self.run_dir = Path(run_dir)
        self.device = resolve_device(cfg.device)
        self.threads, why = apply_threads(cfg.get("threads", "auto"), self.device)
        log.info("threads: %d (%s)", self.threads, why)
        self.checkpoint = (
            load_checkpoint(self.run_dir / CHECKPOINT_FILE, config_hash(cfg), self.device)
            if resume
            else None
        )
        torch.manual_seed(cfg.seed)
        self.data = build_data(cfg, self.device)
        check_resumed_data(self.checkpoint, self.data)  # the same data as the checkpoint's
        validate_data(cfg, self.data)  # checks that need data facts (input shape, classes)
        factory = build(cfg.model, "model")
        # a model factory takes (input_shape, num_classes, **dataset.model_kwargs); a model
        # *family* (heterogeneous clients) also takes `arch` in range(model.num_archs)
        model_args = dict(
            input_shape=self.data.input_shape,
            num_classes=self.data.num_classes,
            **self.data.dataset.model_kwargs,
        )
        # a LightningModule of the user's gets the arguments its __init__ names (maybe none)
        model_factory = partial(factory, **factory_arguments(factory, model_args))
        self.store = ClientStore(**OmegaConf.to_container(cfg.get("client_store") or {}))
        ctx = BuildContext(
            model_factory=model_factory,
            client=self.client,
            aggregator=build(cfg.aggregator, "aggregator"),
            data=self.data,
            device=self.device,
            seed=cfg.seed,
            store=self.store,
            model_args=model_args,
        )
        self.algorithm = build(cfg.algorithm, "algorithm", ctx=ctx)
        check_aggregator(ctx.aggregator, self.algorithm)
        self.objective = resolve_objective(
            str(cfg.get("objective", "auto")), self.algorithm, self.data.has_val
        )
        self.attack = build(cfg.attack, "attack")
        self.attack.check_target(self.algorithm)
        self.attack.setup(ctx, cfg.num_clients)
        self.executor = build(cfg.executor, "executor")
        # audits and other end-of-evaluation hooks (privacy=mia, ...)
        self.callbacks = [build(cfg.privacy, "privacy", ctx=ctx)] if cfg.get("privacy") else []

    def write_partition_stats(self, loggers: list = ()) -> Path:
        """partition_stats.csv (returned) and the label-distribution PNG (logged here)."""
        counts = class_counts(self.data.train_labels(), self.data.partition, self.data.num_classes)
        path = self.run_dir / "partition_stats.csv"
        header = "client,group,n_train,n_test,n_val," + ",".join(
            f"class_{c}" for c in range(counts.shape[1])
        )
        part = self.data.partition
        groups = self.data.groups or [""] * len(counts)
        n_val = [len(v) for v in part.val] if part.val is not None else [0] * len(counts)
        rows = [
            f"{c},{groups[c]},{len(part.train[c])},{len(part.test[c])},{n_val[c]},"
            + ",".join(map(str, counts[c]))
            for c in range(len(counts))
        ]
        path.write_text("\n".join([header, *rows]) + "\n")
        scheme = get_object(self.cfg.partition._target_).name
        title = f"{self.data.dataset.name}: {scheme} partition, label shares"
        plot = plot_label_distribution(counts, self.run_dir / "partition_labels.png", title)
        for logger in loggers:
            logger.log_artifact(plot, "partition/label_distribution")
        return path

    def restore_logger(self, logger) -> None:
        """On resume, hand a logger its saved state (W&B run id) before it starts."""
        restore_logger(logger, self.checkpoint)

    def orchestrator(self, algorithm=None, **hooks) -> Orchestrator:
        """The round loop over this experiment's components (`hooks`: loggers, on_round, ...)."""
        cfg = self.cfg
        return Orchestrator(
            algorithm or self.algorithm,
            self.executor,
            self.data,
            self.attack,
            seed=cfg.seed,
            rounds=cfg.rounds,
            clients_per_round=cfg.clients_per_round,
            eval_every=cfg.eval_every,
            **hooks,
        )

    def run(self, loggers: list, on_round=None, choices: dict | None = None) -> dict[str, Any]:
        cfg = self.cfg
        recorder = RunRecorder(self.run_dir)
        stats = self.write_partition_stats(loggers)
        for logger in loggers:
            logger.log_artifact(stats, "partition/class_counts")
        components = {"attack": self.attack, "executor": self.executor}
        components.update({f"callback{i}": c for i, c in enumerate(self.callbacks)})
        checkpointer = Checkpointer(
            self.run_dir,
            int(cfg.get("checkpoint_every", 0) or 0),
            cfg,
            self.store,
            components,
            loggers,
        )
        orch = self.orchestrator(
            loggers=[recorder, *loggers],
            on_round=on_round,
            callbacks=self.callbacks,
            after_round=checkpointer.after_round,
        )
        state, start_round = None, 1
        if self.checkpoint is not None:
            # rounds logged after the checkpoint are run (and logged) again
            truncate_metric_logs(self.run_dir, int(self.checkpoint["round"]))
            state, start_round = checkpointer.restore(self.checkpoint, orch, self.algorithm)
            log.info("resuming after round %d", start_round - 1)
        start = time.perf_counter()
        status, diverged_round, stop_signal = "completed", None, None
        with checkpointer.signals.installed():
            try:
                orch.run(state, start_round)
            except Diverged as err:  # the last good checkpoint (if any) stays as it is
                status, diverged_round = "diverged", err.round_idx
                log.error("%s", err)
            except Interrupted as err:
                status, stop_signal = "interrupted", signal.Signals(err.signum).name
                log.warning("%s; resume with: python -m fedexp resume=%s", err, self.run_dir)
        wall = time.perf_counter() - start
        final = {k: v for k, v in orch.last_eval.items() if not k.startswith("time/")}
        final.update(self.data.coverage)
        final["runtime/threads"] = self.threads
        summary = {
            "status": status,
            "rounds_completed": orch.round if status != "diverged" else (diverged_round or 1) - 1,
            "diverged_round": diverged_round,
            "stop_signal": stop_signal,
            "checkpoint_round": checkpointer.saved_round,
            "resumed_from_round": start_round - 1 if self.checkpoint is not None else None,
            "metrics": final,
            # the metric returned to a sweeper, with the test metrics of the same round
            "objective": {"name": self.objective, "value": final.get(self.objective)},
            "client_acc": orch.client_accs,
            "describe": {**self.algorithm.describe(), **self.attack.describe()},
            "timing": {
                "wall_time_s": wall,
                "round_s_mean": orch.train_seconds / max(orch.round, 1),
            },
            "choices": choices or {},
            "config": OmegaConf.to_container(cfg, resolve=True),
        }
        recorder.write_summary(summary)
        for logger in loggers:
            logger.finish(summary)
        return summary
