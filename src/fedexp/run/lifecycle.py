"""Run the built components to the end, a divergence or a stop signal, and summarise."""

from __future__ import annotations

import logging
import signal
import time
from collections.abc import Sequence
from pathlib import Path

from hydra.utils import get_object
from omegaconf import DictConfig, OmegaConf

from fedexp import aggregators
from fedexp.config.extend import check_extension
from fedexp.config.saved import save_rounds
from fedexp.config.values import CheckedValues
from fedexp.core.callbacks import Callback, RunInfo, run_end, run_start
from fedexp.core.summary import Objective, RunSummary, Timing
from fedexp.core.types import Diverged
from fedexp.data.partition_report import PartitionStats, start_partition_stats
from fedexp.engine.orchestrator import Orchestrator
from fedexp.engine.participation import participation
from fedexp.loggers.base import logs_artifacts
from fedexp.loggers.progress import run_label
from fedexp.loggers.wandb_labels import swept_values
from fedexp.run.callbacks import RunCallbacks, build_callbacks
from fedexp.run.components import Components, build_components, make_orchestrator
from fedexp.runtime.checkpoint import CHECKPOINT_FILE, saved_total
from fedexp.runtime.final_model import save_final_models
from fedexp.runtime.fingerprint import data_digest
from fedexp.runtime.pruning import Pruned
from fedexp.runtime.ranks import is_output_rank
from fedexp.runtime.signals import Interrupted
from fedexp.runtime.threads import spare_core

log = logging.getLogger(__name__)


def run(
    c: Components,
    callbacks: RunCallbacks | Sequence[Callback] = (),
    *,
    choices: dict | None = None,
    group: str | None = None,
) -> RunSummary:
    """Run the components to the end (or to a divergence or a stop signal) and summarise.

    `callbacks`: the run's callbacks as `fedexp.run.callbacks.build_callbacks` builds them, or
    loggers (W&B, CSV, ...; their `state_dict`, e.g. the W&B run id, is saved in checkpoints)
    that it builds them with.
    """
    if not isinstance(callbacks, RunCallbacks):
        callbacks = build_callbacks(c, callbacks)
    # the stop signals are held until the summary is written: one that comes in the last round
    # or after it (the final model, the summary) lets the run complete
    with callbacks.checkpointer.signals.installed():
        try:
            return _run(c, callbacks, choices or {}, group)
        finally:
            close = getattr(c.executor, "close", None)  # worker processes end with the run
            if close is not None:
                close()


def _run(c: Components, callbacks: RunCallbacks, choices: dict, group: str | None) -> RunSummary:
    cfg, checkpointer = c.cfg, callbacks.checkpointer
    aggregators.new_run()  # the aggregators' caps are counted for this run's warnings
    orch = make_orchestrator(c, callbacks=callbacks.all)
    checkpointer.restore_loggers(c.checkpoint)  # on resume: W&B continues the same run id
    stats = partition_files(c)
    info = RunInfo(
        run_dir=c.run_dir,
        config=OmegaConf.to_container(cfg, resolve=True),
        run_name=run_label(choices, cfg.seed, swept_values(c.run_dir)),
        group=group,
        rounds=cfg.rounds,
        # rounds logged after the checkpoint are run (and logged) again
        resumed_from_round=int(c.checkpoint["round"]) if c.checkpoint is not None else None,
        artifacts=stats.wait() if logs_artifacts(orch.callbacks) else stats.artifacts,
        objective=c.objective,
        choices=choices,
        checkpoint_file=CHECKPOINT_FILE,
    )
    if c.checkpoint is not None:
        record_total(c)
    run_start(orch.callbacks, info)
    state, start_round = None, 1
    if c.checkpoint is not None:
        state, start_round = checkpointer.restore(c.checkpoint, orch, c.algorithm)
        log.info("resuming after round %d", start_round - 1)
    start = time.perf_counter()
    status, diverged_round, stop_signal = _rounds(orch, state, start_round, checkpointer, c.run_dir)
    wall = time.perf_counter() - start
    if orch.state is not None:  # model.pt, personal_models/ (`fedexp.runtime.final_model`)
        save_final_models(
            c.run_dir, c.algorithm, orch.state, orch.round, cfg, c.store, c.data.num_clients
        )
    stats.wait()  # the partition's PNG is written before the run ends
    final = {k: v for k, v in orch.last_eval.items() if not k.startswith("time/")}
    final.update(c.data.coverage)
    final["runtime/threads"] = c.threads
    final["runtime/processes"] = getattr(c.executor, "workers", 1)  # executor=auto's choice
    summary = RunSummary(
        status=status,
        rounds_completed=orch.round if status != "diverged" else (diverged_round or 1) - 1,
        diverged_round=diverged_round,
        stop_signal=stop_signal,
        checkpoint_round=checkpointer.saved_round,
        resumed_from_round=start_round - 1 if c.checkpoint is not None else None,
        metrics=final,
        # the metric returned to a sweeper, with the test metrics of the same round
        objective=Objective(c.objective, final.get(c.objective)),
        client_acc=orch.client_accs,
        describe={**c.algorithm.describe(), **c.attack.describe()},
        timing=Timing(wall, orch.train_seconds / max(orch.round, 1)),
        choices=choices,
        config=info.config,
        warnings=tuple(run_warnings(c, orch.round)),
        data_fingerprint=data_digest(c.data),
    )
    run_end(orch.callbacks, summary)
    return summary


def partition_files(c: Components) -> PartitionStats:
    """The partition's CSV, and its PNG, by the process that writes the outputs (a torchrun rank
    above 0 writes neither): drawn while the rounds run where they leave a core idle, else once
    they are over (`PartitionStats`: the run's processes fill the cores)."""
    if not is_output_rank():
        return PartitionStats.none()
    scheme = get_object(c.cfg.partition._target_).name
    title = f"{c.data.dataset.name}: {scheme} partition, label shares"
    processes = getattr(c.executor, "workers", 1)
    background = True if spare_core(processes, c.threads) else "end"
    if background == "end":
        log.info("partition plot: drawn after the rounds (the run's processes fill the cores)")
    return start_partition_stats(c.data, c.run_dir, title, background)


def record_total(c: Components) -> None:
    """A resume that extends the run (`rounds` above the total its checkpoint was written with)
    says so, and its run dir's saved config takes the new total."""
    saved, total = saved_total(c.checkpoint), int(c.cfg.rounds)
    if saved is not None and saved != total:
        log.info("extending the run from %d to %d rounds", saved, total)
    save_rounds(c.run_dir, total)  # rewrites only a file that says another total


def run_warnings(c: Components, rounds: int) -> list[str]:
    """What changes what this run's numbers mean, one line each: the algorithm's settings
    (`Algorithm.run_warnings`), the attack's rounds, the aggregator's caps and fallbacks
    (`fedexp.aggregators.run_notes`), and classes no client trains on."""
    lines = [*c.algorithm.run_warnings(c.cfg.rounds), *c.attack.run_warnings(rounds)]
    since = " (counted since the resume)" if c.checkpoint is not None else ""
    lines.extend(f"{note}{since}" for note in aggregators.run_notes())
    asked, clients = int(c.cfg.clients_per_round), c.data.num_clients
    if asked > clients:  # a natural split with fewer owners: every client, every round
        lines.append(
            f"clients_per_round={asked} asked, but the split has {clients} clients: every round "
            f"samples all {clients} (a robust aggregator's trimming is sized for {clients})"
        )
    taking_part = participation(c.cfg, c.data)
    empty = taking_part.empty_rounds(rounds, c.attack.rejects)
    if empty:  # dropout or an availability trace left rounds without any update
        lines.append(
            f"{empty} of {rounds} rounds had no client return an update (dropout, availability): "
            "the server state stayed as it was in them (clients/returned 0)"
        )
    lines.extend(short_round_warnings(c, taking_part, rounds, empty))
    ceiling = getattr(c.data, "coverage", {}).get("data/test_accuracy_ceiling")
    if ceiling is not None and ceiling < 1:
        lines.append(
            f"some test classes are held by no client (partition.allow_missing_classes=true): "
            f"global test accuracy cannot exceed {ceiling:.4f}"
        )
    return lines


def short_round_warnings(c: Components, taking_part, rounds: int, empty: int) -> list[str]:
    """A robust aggregator's fixed count sized for a full round, in rounds that dropout or a
    trace left smaller (the aggregator capped it there): one line, or none."""
    aggregator = c.algorithm.ctx.aggregator
    needs = getattr(getattr(aggregator, "func", aggregator), "min_uploads", None)
    need = needs(**getattr(aggregator, "keywords", {})) if needs is not None else None
    if need is None:
        return []
    short = taking_part.short_rounds(rounds, need[0], c.attack.rejects) - empty
    if not short:
        return []
    return [
        f"{short} of {rounds} rounds returned fewer than {need[0]} updates (dropout, "
        f"availability): {need[1]} in them"
    ]


def _rounds(
    orch, state, start_round: int, checkpointer, run_dir
) -> tuple[str, int | None, str | None]:
    """The rounds, under the stop signals: (status, the round that diverged, the stop signal)."""
    status, diverged_round, stop_signal = "completed", None, None
    with checkpointer.signals.installed():
        try:
            orch.run(state, start_round)
        except Diverged as err:  # the last good checkpoint (if any) stays as it is
            status, diverged_round = "diverged", err.round_idx
            log.error("%s", err)
        except Interrupted as err:
            status, stop_signal = "interrupted", signal.Signals(err.signum).name
            log.warning("%s; resume with: python -m fedexp resume=%s", err, run_dir)
        except Pruned as err:  # an Optuna pruner stopped this trial (hydra/sweeper=optuna_study)
            status = "pruned"
            log.info("%s", err)
    return status, diverged_round, stop_signal


class Experiment:
    """The built components of one run (`build_components`) with the calls scripts and tests
    use; every component is an attribute (`exp.algorithm`, `exp.data`, `exp.callbacks`, ...)."""

    def __init__(
        self,
        cfg: DictConfig,
        run_dir: str | Path,
        resume: bool = False,
        *,
        checked: CheckedValues | None = None,
    ):
        """`checked`: what `check_config_values(cfg)` returned, where it ran already."""
        self.components = build_components(cfg, run_dir, resume, checked=checked)
        if self.components.checkpoint is not None:  # rounds=N: nothing depends on the total
            check_extension(cfg, saved_total(self.components.checkpoint))

    def __getattr__(self, name: str):
        components = self.__dict__.get("components")
        if components is None or not hasattr(components, name):
            raise AttributeError(name)
        return getattr(components, name)

    def orchestrator(self, algorithm=None, callbacks: Sequence[Callback] = ()) -> Orchestrator:
        """The round loop over this experiment's components, watched by `callbacks` only."""
        return make_orchestrator(self.components, algorithm, callbacks)

    def run(
        self,
        callbacks: RunCallbacks | Sequence[Callback] = (),
        *,
        choices: dict | None = None,
        group: str | None = None,
    ) -> RunSummary:
        """`run(components, callbacks, ...)`: the whole run, with its checkpoints and summary."""
        return run(self.components, callbacks, choices=choices, group=group)
